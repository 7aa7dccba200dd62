// Records the coordinator persists in its metadata store (runs, events, step reports, checkpoint
// manifests and shards, chunk locations) and decodes with schema::DecodedRecord<T> on restart and
// for every listing. The first input byte picks the record type; the rest is the stored value.
// An accepted record must be readable field by field and copy (as replies copy it) to bytes that
// decode to the same copy.
#include <cstddef>
#include <cstdint>

#include "fuzz/read_everything.h"
#include "schema/envelope.h"

namespace {

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

template <typename T>
void Check(std::span<const uint8_t> bytes) {
  auto decoded = strata::schema::DecodedRecord<T>::Decode(bytes);
  if (!decoded.ok()) return;
  strata::fuzz::ReadEverything(decoded->root());
  const std::string copy = strata::schema::StructToBytes(decoded->root());
  auto again = strata::schema::DecodedRecord<T>::Decode(AsBytes(copy));
  STRATA_CHECK(again.ok());
  STRATA_CHECK(strata::schema::StructToBytes(again->root()) == copy);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> value(data + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      Check<RunRecord>(value);
      break;
    case 1:
      Check<Event>(value);
      break;
    case 2:
      Check<StepReport>(value);
      break;
    case 3:
      Check<CheckpointManifest>(value);
      break;
    case 4:
      Check<CheckpointShard>(value);
      break;
    case 5:
      Check<ChunkLocation>(value);
      break;
  }
  return 0;
}
