#include "schema/envelope.h"

#include <capnp/dynamic.h>

#include <algorithm>
#include <cstring>

namespace strata::schema {
namespace {

void ReadAll(capnp::DynamicValue::Reader value);

void ReadAllFields(capnp::DynamicStruct::Reader s) {
  for (capnp::StructSchema::Field field : s.getSchema().getNonUnionFields()) ReadAll(s.get(field));
  KJ_IF_MAYBE (field, s.which()) {
    ReadAll(s.get(*field));
  }  // an unknown member is nullptr, not an error
}

// get() has already checked the pointer that led here (kind, bounds, text NUL, list element size),
// so only what holds pointers of its own needs reading further: structs and lists of pointers.
void ReadAll(capnp::DynamicValue::Reader value) {
  if (value.getType() == capnp::DynamicValue::STRUCT) {
    ReadAllFields(value.as<capnp::DynamicStruct>());
  } else if (value.getType() == capnp::DynamicValue::LIST) {
    auto list = value.as<capnp::DynamicList>();
    switch (list.getSchema().whichElementType()) {
      case capnp::schema::Type::TEXT:
      case capnp::schema::Type::DATA:
      case capnp::schema::Type::LIST:
      case capnp::schema::Type::STRUCT:
        for (capnp::DynamicValue::Reader element : list) ReadAll(element);
        break;
      default:
        break;  // numbers, enums, void: their bytes were checked with the list pointer
    }
  }
}

}  // namespace

void CheckFullyReadable(kj::ArrayPtr<const capnp::word> words, capnp::StructSchema schema) {
  // 1. Every pointer in bounds, and the size of what they reach (`content`: a copy's size).
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 2 * words.size() + 64;
  capnp::FlatArrayMessageReader sizing(words, options);
  const uint64_t content = sizing.getRoot<capnp::AnyPointer>().targetSize().wordCount;

  // Reading an object counts its size against the traversal limit, and an element of a list of
  // empty structs or voids counts one word: twice the content leaves room for far-pointer pads
  // and for a few such elements, and stops a few bytes that claim millions of them. The limit
  // follows the content, not the input's size, so a copy of an accepted message is accepted too.
  options.traversalLimitInWords = 2 * content + 64;
  // 2. Copy it as replies do (setRoot, setWithCaveats): this follows the pointers of fields this
  //    build does not know too, and counts their empty elements, which step 1 does not.
  capnp::FlatArrayMessageReader copying(words, options);
  capnp::MallocMessageBuilder copy(static_cast<unsigned>(std::min<uint64_t>(content + 8, 1u << 28)));
  copy.getRoot<capnp::AnyPointer>().set(copying.getRoot<capnp::AnyPointer>());
  // 3. Every known field of the right kind.
  capnp::FlatArrayMessageReader fields(words, options);
  ReadAllFields(fields.getRoot<capnp::DynamicStruct>(schema));
}

std::string EnvelopeBuilder::Serialize() {
  auto words = capnp::messageToFlatArray(message_);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<std::unique_ptr<DecodedEnvelope>> DecodeEnvelope(std::span<const uint8_t> bytes) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    return InvalidArgument("message of " + std::to_string(bytes.size()) +
                           " bytes is not a Cap'n Proto message (size must be a non-zero multiple of 8)");
  }
  auto decoded = std::unique_ptr<DecodedEnvelope>(new DecodedEnvelope());
  // Copy: ZeroMQ frames carry no alignment guarantee and Cap'n Proto reads words in place.
  decoded->words_ = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(decoded->words_.begin(), bytes.data(), bytes.size());
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 64 * 1024 * 1024;                              // 512 MiB: specs and listings only
    CheckFullyReadable(decoded->words_.asPtr(), capnp::Schema::from<Envelope>());  // so later reads cannot fault
    decoded->reader_ = std::make_unique<capnp::FlatArrayMessageReader>(decoded->words_.asPtr(), options);
    decoded->root_ = decoded->reader_->getRoot<Envelope>();
    if (decoded->root_.getVersion() != kProtocolVersion) {
      return InvalidArgument("protocol version " + std::to_string(decoded->root_.getVersion()) +
                             " is not supported (this build speaks version " + std::to_string(kProtocolVersion) +
                             "); run the same Strata release everywhere");
    }
    decoded->root_.which();  // an unknown union member is reported by which(), not thrown
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("message does not decode: ") + e.what());
  }
  return decoded;
}

const char* RunStateName(RunState state) {
  switch (state) {
    case RunState::PENDING:
      return "pending";
    case RunState::RUNNING:
      return "running";
    case RunState::FINISHED:
      return "finished";
    case RunState::FAILED:
      return "failed";
    case RunState::CANCELLED:
      return "cancelled";
  }
  return "unknown";
}

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::IDLE:
      return "idle";
    case WorkerState::BUSY:
      return "busy";
    case WorkerState::LOST:
      return "lost";
  }
  return "unknown";
}

const char* DTypeName(::DType dtype) {
  switch (dtype) {
    case ::DType::F32:
      return "f32";
    case ::DType::F16:
      return "f16";
    case ::DType::BF16:
      return "bf16";
    case ::DType::F64:
      return "f64";
    case ::DType::I64:
      return "i64";
    case ::DType::I32:
      return "i32";
    case ::DType::U16:
      return "u16";
    case ::DType::U8:
      return "u8";
  }
  return "unknown";
}

MemorySnapshot ReadMemoryStats(::MemoryStats::Reader r) {
  MemorySnapshot m;
  m.device = r.getDevice().cStr();
  m.total_bytes = r.getTotalBytes();
  m.free_bytes = r.getFreeBytes();
  m.allocated_bytes = r.getAllocatedBytes();
  m.reserved_bytes = r.getReservedBytes();
  m.peak_bytes = r.getPeakBytes();
  m.host_total_bytes = r.getHostTotalBytes();
  m.host_free_bytes = r.getHostFreeBytes();
  m.store_total_bytes = r.getStoreTotalBytes();
  m.store_free_bytes = r.getStoreFreeBytes();
  m.store_fs_id = r.getStoreFsId();
  return m;
}

void WriteMemoryStats(const MemorySnapshot& m, ::MemoryStats::Builder b) {
  b.setDevice(m.device);
  b.setTotalBytes(m.total_bytes);
  b.setFreeBytes(m.free_bytes);
  b.setAllocatedBytes(m.allocated_bytes);
  b.setReservedBytes(m.reserved_bytes);
  b.setPeakBytes(m.peak_bytes);
  b.setHostTotalBytes(m.host_total_bytes);
  b.setHostFreeBytes(m.host_free_bytes);
  b.setStoreTotalBytes(m.store_total_bytes);
  b.setStoreFreeBytes(m.store_free_bytes);
  b.setStoreFsId(m.store_fs_id);
}

std::string MakeErrorReply(uint64_t request_id, const Status& status) {
  EnvelopeBuilder builder(request_id);
  auto error = builder.root().initError();
  error.setCode(StatusCodeName(status.code()));
  error.setMessage(status.message());
  return builder.Serialize();
}

Status StatusFromError(::Error::Reader error) {
  const std::string code = error.getCode().cStr();
  StatusCode status_code = StatusCode::kInternal;
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (code == StatusCodeName(static_cast<StatusCode>(c))) status_code = static_cast<StatusCode>(c);
  }
  return Status(status_code, error.getMessage().cStr());
}

}  // namespace strata::schema
