// Envelope encoding and defensive decoding. Every receiver goes through DecodeEnvelope, which
// never throws: bytes that are not a valid, fully traversable Envelope of our protocol version
// come back as a Status, so a daemon can log and drop them.
#pragma once

#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/memory_snapshot.h"
#include "common/status.h"
#include "schema/messages.capnp.h"

namespace strata::schema {

inline constexpr uint16_t kProtocolVersion = 2;

// Builds one Envelope with the protocol version set.
class EnvelopeBuilder {
 public:
  explicit EnvelopeBuilder(uint64_t request_id = 0) : root_(message_.initRoot<Envelope>()) {
    root_.setVersion(kProtocolVersion);
    root_.setRequestId(request_id);
  }
  Envelope::Builder& root() { return root_; }
  std::string Serialize();

 private:
  capnp::MallocMessageBuilder message_;
  Envelope::Builder root_;
};

// Owns the aligned copy of a received message.
class DecodedEnvelope {
 public:
  Envelope::Reader root() const { return root_; }

 private:
  friend Result<std::unique_ptr<DecodedEnvelope>> DecodeEnvelope(std::span<const uint8_t> bytes);
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  Envelope::Reader root_;
};

// InvalidArgument for bytes that do not decode (wrong size, bad pointers, too deep, ...) and for
// a protocol version other than ours (message names both versions).
Result<std::unique_ptr<DecodedEnvelope>> DecodeEnvelope(std::span<const uint8_t> bytes);

// Reads the flat message `words` as a `schema` struct the ways its receivers will: every field
// (nested structs and lists, text to its NUL, the active member of each union) and a copy of the
// whole (as replies copy records, unknown fields included). Throws kj::Exception where one of those
// would later: a pointer out of bounds or of the wrong kind, text without its NUL, a list whose
// elements are not the schema's, or a few bytes claiming millions of empty elements (the traversal
// limit is about twice the content's size, so a copy of an accepted message is accepted too).
// DecodeEnvelope and DecodedRecord call it inside their try: what they accept cannot fault later.
void CheckFullyReadable(kj::ArrayPtr<const capnp::word> words, capnp::StructSchema schema);

// Lower-case names for listings and JSON ("running", "lost", "bf16").
const char* RunStateName(RunState state);
const char* WorkerStateName(WorkerState state);
const char* DTypeName(::DType dtype);

MemorySnapshot ReadMemoryStats(::MemoryStats::Reader stats);
void WriteMemoryStats(const MemorySnapshot& memory, ::MemoryStats::Builder stats);

// Convenience: an Error envelope, and the Status an Error carries (the inverse).
std::string MakeErrorReply(uint64_t request_id, const Status& status);
Status StatusFromError(::Error::Reader error);

// Copies a Cap'n Proto struct into its own flat bytes (for persisting records) and back.
template <typename Reader>
std::string StructToBytes(Reader reader) {
  capnp::MallocMessageBuilder message;
  message.setRoot(reader);
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// Holds a decoded standalone record (as written by StructToBytes).
template <typename T>
class DecodedRecord {
 public:
  static Result<DecodedRecord> Decode(std::span<const uint8_t> bytes) {
    if (bytes.size() % sizeof(capnp::word) != 0 || bytes.empty()) {
      return Corruption("record of " + std::to_string(bytes.size()) + " bytes is not a whole message");
    }
    DecodedRecord record;
    record.words_ = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
    memcpy(record.words_.begin(), bytes.data(), bytes.size());
    try {
      CheckFullyReadable(record.words_.asPtr(), capnp::Schema::from<T>());  // throws now rather than later
      record.reader_ = std::make_unique<capnp::FlatArrayMessageReader>(record.words_.asPtr());
      record.root_ = record.reader_->template getRoot<T>();
    } catch (const std::exception& e) {
      return Corruption(std::string("record does not decode: ") + e.what());
    }
    return record;
  }
  typename T::Reader root() const { return root_; }

 private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  typename T::Reader root_;
};

}  // namespace strata::schema
