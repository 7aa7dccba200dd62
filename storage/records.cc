#include "storage/records.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <xxhash.h>

#include <cstring>

#include "schema/store.capnp.h"

namespace strata::storage {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return 1;
    case DType::kF16:
    case DType::kBF16:
    case DType::kU16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF64:
    case DType::kI64:
      return 8;
  }
  return 0;  // not a DType (a cast from a bad integer)
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI64:
      return "i64";
    case DType::kI32:
      return "i32";
    case DType::kU16:
      return "u16";
    case DType::kU8:
      return "u8";
  }
  return "invalid";
}

uint64_t Checksum(std::span<const uint8_t> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

namespace records {
namespace {

// Our DType and the schema's DType share their numbering (checked here at compile time).
static_assert(static_cast<uint16_t>(::DType::BF16) == static_cast<uint8_t>(DType::kBF16) &&
              static_cast<uint16_t>(::DType::U8) == static_cast<uint8_t>(DType::kU8));
constexpr uint16_t kMaxDType = static_cast<uint8_t>(DType::kU8);

// Copies `bytes` into a word-aligned buffer (Cap'n Proto reads words in place, and RocksDB values
// have no alignment), or nullopt if it cannot be a flat message.
std::optional<kj::Array<capnp::word>> ToWords(std::string_view bytes) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) return std::nullopt;
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  return words;
}

// A well-formed record traverses about its own size; the limit stops amplification by garbage.
capnp::ReaderOptions ReaderOptionsFor(const kj::Array<capnp::word>& words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 2 * words.size() + 64;
  return options;
}

std::string KjMessage(const kj::Exception& e) { return e.getDescription().cStr(); }

}  // namespace

std::optional<uint64_t> ByteSize(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t size = DTypeSize(dtype);
  if (size == 0) return std::nullopt;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(size, static_cast<uint64_t>(dim), &size)) return std::nullopt;
  }
  return size;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

Status ValidateTensor(const std::string& name, const TensorView& tensor) {
  if (DTypeSize(tensor.dtype) == 0) {
    return InvalidArgument("tensor '" + name + "' has an invalid dtype (" +
                           std::to_string(static_cast<int>(tensor.dtype)) + "); use a storage::DType value");
  }
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    if (tensor.shape[i] < 0) {
      return InvalidArgument("tensor '" + name + "' has negative dimension " + std::to_string(tensor.shape[i]) +
                             " at index " + std::to_string(i) + " of shape " + ShapeString(tensor.shape));
    }
  }
  std::optional<uint64_t> expected = ByteSize(tensor.dtype, tensor.shape);
  if (!expected) {
    return InvalidArgument("tensor '" + name + "' of shape " + ShapeString(tensor.shape) +
                           " has more bytes than fit in 64 bits; check its shape");
  }
  if (*expected != tensor.bytes.size()) {
    return InvalidArgument("tensor '" + name + "' (" + DTypeName(tensor.dtype) + ", shape " +
                           ShapeString(tensor.shape) + ") needs " + std::to_string(*expected) + " bytes but " +
                           std::to_string(tensor.bytes.size()) + " were given; pass numel * dtype size bytes");
  }
  return Status::Ok();
}

std::string EncodeTensorPrefix(const TensorView& tensor, uint64_t checksum) {
  capnp::MallocMessageBuilder message(16 + tensor.shape.size());
  auto header = message.initRoot<TensorHeader>();
  header.setDtype(static_cast<::DType>(tensor.dtype));
  auto shape = header.initShape(tensor.shape.size());
  for (size_t i = 0; i < tensor.shape.size(); ++i) shape.set(i, tensor.shape[i]);
  header.setByteOrder(ByteOrder::LITTLE);
  header.setCodec(Codec::RAW);
  header.setChecksum(checksum);
  header.setSizeBytes(tensor.bytes.size());
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  kj::ArrayPtr<const kj::byte> bytes = words.asBytes();

  std::string out(4 + bytes.size(), '\0');
  uint32_t length = bytes.size();
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 4, bytes.begin(), bytes.size());
  return out;
}

Result<DecodedTensor> DecodeTensorValue(std::string_view value) {
  if (value.size() < 4) {
    return Corruption("has a " + std::to_string(value.size()) + "-byte record, shorter than its header length");
  }
  uint32_t header_length = 0;
  for (int i = 0; i < 4; ++i) header_length |= uint32_t{static_cast<uint8_t>(value[i])} << (8 * i);
  if (header_length > value.size() - 4) {
    return Corruption("has a header length of " + std::to_string(header_length) + " in a " +
                      std::to_string(value.size()) + "-byte record");
  }
  std::optional<kj::Array<capnp::word>> words = ToWords(value.substr(4, header_length));
  if (!words) {
    return Corruption("has a header length of " + std::to_string(header_length) + ", not a positive multiple of 8");
  }

  DecodedTensor out;
  uint64_t size_bytes = 0;
  try {
    capnp::FlatArrayMessageReader reader(*words, ReaderOptionsFor(*words));
    auto header = reader.getRoot<TensorHeader>();
    auto dtype = static_cast<uint16_t>(header.getDtype());
    if (dtype > kMaxDType) return Corruption("has an unknown dtype " + std::to_string(dtype) + " in its header");
    if (header.getByteOrder() != ByteOrder::LITTLE || header.getCodec() != Codec::RAW) {
      return Corruption("has a byte order or codec this build cannot read");
    }
    out.dtype = static_cast<DType>(dtype);
    for (int64_t dim : header.getShape()) out.shape.push_back(dim);
    out.checksum = header.getChecksum();
    size_bytes = header.getSizeBytes();
  } catch (const kj::Exception& e) {
    return Corruption("has a header that does not decode (" + KjMessage(e) + ")");
  }

  std::string_view raw = value.substr(4 + header_length);
  std::optional<uint64_t> expected = ByteSize(out.dtype, out.shape);
  if (raw.size() != size_bytes) {
    return Corruption("has " + std::to_string(raw.size()) + " bytes where its header says " +
                      std::to_string(size_bytes));
  }
  if (expected != size_bytes) {
    return Corruption("has a header whose dtype and shape (" + std::string(DTypeName(out.dtype)) + ", " +
                      ShapeString(out.shape) + ") disagree with its " + std::to_string(size_bytes) + " bytes");
  }
  out.bytes = std::span(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  uint64_t actual = Checksum(out.bytes);
  if (actual != out.checksum) {
    return Corruption("failed its checksum (stored " + std::to_string(out.checksum) + ", computed " +
                      std::to_string(actual) + ")");
  }
  return out;
}

namespace {
constexpr std::string_view kFileRefMagic = "\xffSF1";
}  // namespace

bool IsFileRef(std::string_view value) { return value.substr(0, kFileRefMagic.size()) == kFileRefMagic; }

std::string EncodeFileRef(const FileRef& ref) {
  std::string out = std::string(kFileRefMagic) + EncodeKeyString(ref.file) + EncodeKeyU64(ref.offset) +
                    EncodeKeyU64(ref.size) + EncodeKeyU64(ref.checksum) +
                    EncodeKeyU64(static_cast<uint64_t>(ref.dtype)) + EncodeKeyU64(ref.shape.size());
  for (int64_t d : ref.shape) out += EncodeKeyU64(static_cast<uint64_t>(d));
  return out;
}

Result<FileRef> DecodeFileRef(std::string_view v) {
  if (!IsFileRef(v)) return Corruption("is not a data file reference");
  v.remove_prefix(kFileRefMagic.size());
  FileRef ref;
  uint64_t dtype = 0, rank = 0;
  if (!ConsumeKeyString(&v, &ref.file) || !ConsumeKeyU64(&v, &ref.offset) || !ConsumeKeyU64(&v, &ref.size) ||
      !ConsumeKeyU64(&v, &ref.checksum) || !ConsumeKeyU64(&v, &dtype) || !ConsumeKeyU64(&v, &rank)) {
    return Corruption("is a data file reference cut short");
  }
  if (dtype > kMaxDType || rank > 64) return Corruption("is a data file reference with an unknown dtype or rank");
  // A plain file name: a damaged reference must not reach outside the run's directory.
  if (ref.file.empty() || ref.file.find('/') != std::string::npos || ref.file.find('\0') != std::string::npos ||
      ref.file == "." || ref.file == "..") {
    return Corruption("is malformed: a data file reference naming '" + ref.file +
                      "', not a file of its run's directory");
  }
  ref.dtype = static_cast<DType>(dtype);
  for (uint64_t i = 0; i < rank; ++i) {
    uint64_t d = 0;
    if (!ConsumeKeyU64(&v, &d)) return Corruption("is a data file reference cut short");
    ref.shape.push_back(static_cast<int64_t>(d));
  }
  if (!v.empty()) return Corruption("is a data file reference with trailing bytes");
  const auto expected = ByteSize(ref.dtype, ref.shape);
  if (!expected || *expected != ref.size || ref.offset > UINT64_MAX - ref.size) {
    return Corruption("is a data file reference whose size is not its dtype and shape");
  }
  return ref;
}

std::string EncodeManifest(const CheckpointInfo& info) {
  capnp::MallocMessageBuilder message;
  auto record = message.initRoot<CheckpointManifestRecord>();
  record.setRun(info.run);
  record.setStep(info.step);
  auto entries = record.initTensors(info.tensors.size());
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const CheckpointTensorInfo& t = info.tensors[i];
    auto entry = entries[i];
    entry.setName(t.name);
    entry.setDtype(static_cast<::DType>(t.dtype));
    auto shape = entry.initShape(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) shape.set(d, t.shape[d]);
    entry.setChecksum(t.checksum);
    entry.setSizeBytes(t.size_bytes);
  }
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  return std::string(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size());
}

Result<CheckpointInfo> DecodeManifest(std::string_view value) {
  std::optional<kj::Array<capnp::word>> words = ToWords(value);
  if (!words) {
    return Corruption("has a " + std::to_string(value.size()) + "-byte manifest, not a positive multiple of 8");
  }
  CheckpointInfo info;
  try {
    capnp::FlatArrayMessageReader reader(*words, ReaderOptionsFor(*words));
    auto record = reader.getRoot<CheckpointManifestRecord>();
    info.run = record.getRun();
    info.step = record.getStep();
    for (auto entry : record.getTensors()) {
      CheckpointTensorInfo t;
      t.name = entry.getName();
      auto dtype = static_cast<uint16_t>(entry.getDtype());
      if (dtype > kMaxDType) return Corruption("has an unknown dtype in the manifest entry of '" + t.name + "'");
      t.dtype = static_cast<DType>(dtype);
      for (int64_t dim : entry.getShape()) t.shape.push_back(dim);
      t.checksum = entry.getChecksum();
      t.size_bytes = entry.getSizeBytes();
      if (ByteSize(t.dtype, t.shape) != t.size_bytes) {
        return Corruption("has a manifest entry of '" + t.name + "' whose size disagrees with its shape");
      }
      info.tensors.push_back(std::move(t));
    }
  } catch (const kj::Exception& e) {
    return Corruption("has a manifest that does not decode (" + KjMessage(e) + ")");
  }
  return info;
}

}  // namespace records
}  // namespace strata::storage
