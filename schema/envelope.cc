#include "schema/envelope.h"

#include <cstring>

namespace strata::schema {

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
    options.traversalLimitInWords = 64 * 1024 * 1024;  // 512 MiB: specs and listings only
    decoded->reader_ = std::make_unique<capnp::FlatArrayMessageReader>(decoded->words_.asPtr(), options);
    decoded->root_ = decoded->reader_->getRoot<Envelope>();
    decoded->root_.totalSize();  // walks every pointer once, so later field reads cannot fault
    if (decoded->root_.getVersion() != kProtocolVersion) {
      return InvalidArgument("protocol version " + std::to_string(decoded->root_.getVersion()) +
                             " is not supported (this build speaks version " +
                             std::to_string(kProtocolVersion) + "); run the same Strata release everywhere");
    }
    decoded->root_.which();  // an unknown union member is reported by which(), not thrown
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("message does not decode: ") + e.what());
  }
  return decoded;
}

const char* RunStateName(RunState state) {
  switch (state) {
    case RunState::PENDING: return "pending";
    case RunState::RUNNING: return "running";
    case RunState::FINISHED: return "finished";
    case RunState::FAILED: return "failed";
    case RunState::CANCELLED: return "cancelled";
  }
  return "unknown";
}

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::IDLE: return "idle";
    case WorkerState::BUSY: return "busy";
    case WorkerState::LOST: return "lost";
  }
  return "unknown";
}

const char* DTypeName(::DType dtype) {
  switch (dtype) {
    case ::DType::F32: return "f32";
    case ::DType::F16: return "f16";
    case ::DType::BF16: return "bf16";
    case ::DType::F64: return "f64";
    case ::DType::I64: return "i64";
    case ::DType::I32: return "i32";
    case ::DType::U16: return "u16";
    case ::DType::U8: return "u8";
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
  return m;
}

void WriteMemoryStats(const MemorySnapshot& m, ::MemoryStats::Builder b) {
  b.setDevice(m.device);
  b.setTotalBytes(m.total_bytes);
  b.setFreeBytes(m.free_bytes);
  b.setAllocatedBytes(m.allocated_bytes);
  b.setReservedBytes(m.reserved_bytes);
  b.setPeakBytes(m.peak_bytes);
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
