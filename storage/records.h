// Private record codecs of the shard store. A tensor value is
//   [u32 little-endian header length][flat Cap'n Proto TensorHeader][raw bytes]
// or, for a checkpoint tensor whose bytes are in a data file, a file reference (FileRef)
// and a checkpoint manifest value is a flat Cap'n Proto CheckpointManifestRecord
// (schema/store.capnp). Decoders treat their input as untrusted: anything malformed, including
// bytes that make Cap'n Proto throw, comes back as a Corruption status with a short reason that
// the store wraps with the record's name and the store's path.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::storage::records {

// numel(shape) * DTypeSize(dtype); nullopt for an unknown dtype, a negative dim or overflow.
std::optional<uint64_t> ByteSize(DType dtype, const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);  // "[2, 3]"

// Checks a tensor about to be written; InvalidArgument naming `name` and the fix otherwise.
Status ValidateTensor(const std::string& name, const TensorView& tensor);

// [u32 header length][TensorHeader]: the part of a tensor value before the raw bytes.
std::string EncodeTensorPrefix(const TensorView& tensor, uint64_t checksum);

struct DecodedTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t checksum = 0;
  std::span<const uint8_t> bytes;  // borrows the decoded value
};
// Decodes a tensor value and verifies it: header decodes, sizes agree, checksum matches.
Result<DecodedTensor> DecodeTensorValue(std::string_view value);

// What a checkpoint tensor's key holds when its bytes are in a data file of the run's directory:
//   [magic "\xffSF1"][file name][offset][size][checksum][dtype][rank][dims] (key pieces, keys.h)
// No tensor value starts with the magic: read as a header length it is past any value.
struct FileRef {
  std::string file;  // a plain name within the run's data directory
  uint64_t offset = 0, size = 0, checksum = 0;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
bool IsFileRef(std::string_view value);
std::string EncodeFileRef(const FileRef& ref);
// Corruption if malformed: a name with a '/' (it must not reach outside the run's directory), a
// size that is not dtype x shape, a range past 2^64.
Result<FileRef> DecodeFileRef(std::string_view value);

std::string EncodeManifest(const CheckpointInfo& info);
Result<CheckpointInfo> DecodeManifest(std::string_view value);

}  // namespace strata::storage::records
