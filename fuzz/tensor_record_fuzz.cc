// Tensor values of a shard store ([u32 header length][TensorHeader][raw bytes], or a data file
// reference: storage/records.h), read back from RocksDB where a bad disk or a bug may have damaged them.
// DecodeTensorValue must return Corruption for anything malformed; what it accepts must be self-consistent (dtype x
// shape = bytes, checksum matches) and encode back to the same tensor.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/check.h"
#include "storage/records.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::storage;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (records::IsFileRef(input)) {
    // A data file reference: what it accepts names a plain file, is self-consistent and encodes
    // back to the same bytes (the encoding is canonical).
    auto ref = records::DecodeFileRef(input);
    if (!ref.ok()) return 0;
    STRATA_CHECK(!ref->file.empty() && ref->file.find('/') == std::string::npos && ref->file != "..");
    STRATA_CHECK(records::ByteSize(ref->dtype, ref->shape) == ref->size);
    STRATA_CHECK(records::EncodeFileRef(*ref) == input);
    return 0;
  }
  auto decoded = records::DecodeTensorValue(input);
  if (!decoded.ok()) return 0;
  STRATA_CHECK(DTypeSize(decoded->dtype) != 0);
  STRATA_CHECK(records::ByteSize(decoded->dtype, decoded->shape) == decoded->bytes.size());
  STRATA_CHECK_EQ(Checksum(decoded->bytes), decoded->checksum);
  STRATA_CHECK(decoded->bytes.data() + decoded->bytes.size() == data + size);  // borrows the tail

  TensorView view{decoded->dtype, decoded->shape, decoded->bytes};
  STRATA_CHECK(records::ValidateTensor("fuzz", view).ok());
  std::string value = records::EncodeTensorPrefix(view, decoded->checksum);
  value.append(reinterpret_cast<const char*>(decoded->bytes.data()), decoded->bytes.size());
  auto again = records::DecodeTensorValue(value);
  STRATA_CHECK(again.ok());
  STRATA_CHECK(again->dtype == decoded->dtype && again->shape == decoded->shape &&
               again->checksum == decoded->checksum && again->bytes.size() == decoded->bytes.size());
  return 0;
}
