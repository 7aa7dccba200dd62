// Checkpoint manifests of a shard store (flat CheckpointManifestRecord, storage/records.h): the
// record that makes a checkpoint visible. DecodeManifest must return Corruption for anything
// malformed; an accepted manifest must have consistent entries and encode back to itself.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "storage/records.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::storage;
  auto decoded = records::DecodeManifest(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!decoded.ok()) return 0;
  for (const CheckpointTensorInfo& t : decoded->tensors) {
    STRATA_CHECK(DTypeSize(t.dtype) != 0);
    STRATA_CHECK(records::ByteSize(t.dtype, t.shape) == t.size_bytes);
  }
  auto again = records::DecodeManifest(records::EncodeManifest(*decoded));
  STRATA_CHECK(again.ok());
  STRATA_CHECK(again->run == decoded->run && again->step == decoded->step &&
               again->tensors.size() == decoded->tensors.size());
  for (size_t i = 0; i < again->tensors.size(); ++i) {
    const CheckpointTensorInfo& a = again->tensors[i];
    const CheckpointTensorInfo& b = decoded->tensors[i];
    STRATA_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.checksum == b.checksum &&
                 a.size_bytes == b.size_bytes);
  }
  return 0;
}
