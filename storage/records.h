// Private record codecs of the shard store. A tensor value is
//   [u32 little-endian header length][flat Cap'n Proto TensorHeader][raw bytes]
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

std::string EncodeManifest(const CheckpointInfo& info);
Result<CheckpointInfo> DecodeManifest(std::string_view value);

}  // namespace strata::storage::records
