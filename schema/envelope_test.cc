#include "schema/envelope.h"

#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace strata::schema {
namespace {

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(EnvelopeTest, RoundTripsASubmit) {
  EnvelopeBuilder builder(42);
  builder.root().initSubmitRun().setSpecToml("name = \"x\"");
  std::string bytes = builder.Serialize();
  auto decoded = DecodeEnvelope(AsBytes(bytes));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  auto root = (*decoded)->root();
  EXPECT_EQ(root.getRequestId(), 42u);
  ASSERT_EQ(root.which(), Envelope::SUBMIT_RUN);
  EXPECT_EQ(std::string(root.getSubmitRun().getSpecToml().cStr()), "name = \"x\"");
}

// A worker's memory report carries its host's memory beside its device's (optimizer offload
// plans against it), and a report without it (an older worker) reads as 0: not reported.
TEST(EnvelopeTest, MemoryStatsCarryTheHostsMemory) {
  EnvelopeBuilder builder(7);
  MemorySnapshot sent;
  sent.device = "cuda:1";
  sent.total_bytes = 80ull << 30, sent.free_bytes = 70ull << 30, sent.peak_bytes = 5;
  sent.host_total_bytes = 512ull << 30, sent.host_free_bytes = 400ull << 30;
  WriteMemoryStats(sent, builder.root().initHeartbeat().initMemory());
  const std::string bytes = builder.Serialize();
  auto decoded = DecodeEnvelope(AsBytes(bytes));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  const MemorySnapshot got = ReadMemoryStats((*decoded)->root().getHeartbeat().getMemory());
  EXPECT_EQ(got.device, "cuda:1");
  EXPECT_EQ(got.total_bytes, sent.total_bytes);
  EXPECT_EQ(got.host_total_bytes, 512ull << 30);
  EXPECT_EQ(got.host_free_bytes, 400ull << 30);
  EnvelopeBuilder old(8);
  old.root().initHeartbeat().initMemory().setTotalBytes(1);
  const std::string old_bytes = old.Serialize();
  auto old_decoded = DecodeEnvelope(AsBytes(old_bytes));
  ASSERT_TRUE(old_decoded.ok());
  EXPECT_EQ(ReadMemoryStats((*old_decoded)->root().getHeartbeat().getMemory()).host_total_bytes, 0u);
}

TEST(EnvelopeTest, WrongVersionIsRejectedWithBothVersionsNamed) {
  EnvelopeBuilder builder(1);
  builder.root().setVersion(999);
  builder.root().setAck();
  std::string bytes = builder.Serialize();
  auto decoded = DecodeEnvelope(AsBytes(bytes));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("999"), std::string::npos);
  EXPECT_NE(decoded.status().message().find(std::to_string(kProtocolVersion)), std::string::npos);
}

TEST(EnvelopeTest, GarbageNeverThrows) {
  std::mt19937 rng(7);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bytes(8 * (1 + rng() % 16) + (i % 3 == 0 ? rng() % 8 : 0), '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    auto decoded = DecodeEnvelope(AsBytes(bytes));  // must not throw or crash
    if (!decoded.ok()) ++rejected;
  }
  EXPECT_GT(rejected, 1900);  // random bytes almost never form a valid envelope of version 1
}

TEST(EnvelopeTest, TruncatedValidMessageIsRejected) {
  EnvelopeBuilder builder(3);
  builder.root().initSubmitRun().setSpecToml(std::string(300, 'a'));
  std::string bytes = builder.Serialize();
  bytes.resize(bytes.size() - 64);
  EXPECT_FALSE(DecodeEnvelope(AsBytes(bytes)).ok());
  EXPECT_FALSE(DecodeEnvelope({}).ok());
}

// Hand-made one-segment messages: an Envelope root (2 data words, 1 pointer) with union member
// `which` whose pointer is `tail[0]`, followed by the rest of `tail`.
std::string HandMadeEnvelope(Envelope::Which which, std::vector<uint64_t> tail) {
  const uint32_t discriminant_offset = capnp::Schema::from<Envelope>().getProto().getStruct().getDiscriminantOffset();
  std::vector<uint64_t> words = {
      (3 + tail.size()) << 32,        // segment table: 1 segment
      uint64_t{2 | (1 << 16)} << 32,  // root: struct, 2 data words, 1 pointer
      kProtocolVersion | uint64_t{static_cast<uint16_t>(which)} << (16 * discriminant_offset),
      5,  // requestId
  };
  words.insert(words.end(), tail.begin(), tail.end());
  return std::string(reinterpret_cast<const char*>(words.data()), 8 * words.size());
}

TEST(EnvelopeTest, HandMadeEnvelopeDecodes) {  // the helper itself is right
  auto decoded = DecodeEnvelope(AsBytes(HandMadeEnvelope(Envelope::SUBMIT_RUN, {0})));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ((*decoded)->root().getRequestId(), 5u);
  EXPECT_EQ((*decoded)->root().which(), Envelope::SUBMIT_RUN);
}

// Found by fuzz/envelope_fuzz: these decoded, and the first getter on them threw in the receiver.
TEST(EnvelopeTest, PointerOfTheWrongKindIsRejected) {
  // submitRun is a struct; its pointer is an empty byte list (kind 1, element size 2).
  auto decoded = DecodeEnvelope(AsBytes(HandMadeEnvelope(Envelope::SUBMIT_RUN, {uint64_t{2} << 32 | 1})));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("non-struct pointer"), std::string::npos) << decoded.status().ToString();
}

TEST(EnvelopeTest, TextWithoutItsNulIsRejected) {
  EnvelopeBuilder builder(1);
  builder.root().initHeartbeat().setWorkerId("w-0");
  std::string bytes = builder.Serialize();
  const size_t at = bytes.find(std::string("w-0\0", 4));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] = 'x';
  auto decoded = DecodeEnvelope(AsBytes(bytes));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("does not decode"), std::string::npos) << decoded.status().ToString();
}

TEST(EnvelopeTest, SmallMessageClaimingAHugeListIsRejected) {
  // statusReply.runs: 16M RunRecords of zero words each, in 7 words. Decoding it used to succeed,
  // and the receiver then looped over 16M runs.
  auto decoded = DecodeEnvelope(
      AsBytes(HandMadeEnvelope(Envelope::STATUS_REPLY, {
                                                           uint64_t{1} << 48,       // StatusReply: 0 data, 1 pointer
                                                           uint64_t{7} << 32 | 1,   // runs: inline composite, 0 words
                                                           uint64_t{1} << 24 << 2,  // tag: 16M elements of 0 + 0
                                                       })));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("does not decode"), std::string::npos) << decoded.status().ToString();
}

TEST(EnvelopeTest, EmptyStructsBesidePaddingAreRejected) {  // found by fuzz/store_record_fuzz
  // 150 RunRecords of zero words, followed by 100 words of padding: within twice the input's
  // size, but a copy of it (a reply) has no padding, so its receiver would refuse it. The limit
  // follows the content, so it is refused here already.
  std::vector<uint64_t> tail = {uint64_t{1} << 48, uint64_t{7} << 32 | 1, uint64_t{150} << 2};
  tail.resize(tail.size() + 100, 0);
  auto decoded = DecodeEnvelope(AsBytes(HandMadeEnvelope(Envelope::STATUS_REPLY, tail)));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.status().message().find("traversal limit"), std::string::npos) << decoded.status().ToString();
}

TEST(DecodedRecordTest, UnknownHugeVoidListIsCorruption) {  // found by fuzz/store_record_fuzz
  // An Event (1 data word, 2 pointers in this build) whose wire struct carries a third pointer,
  // as a newer build's field would: a list of 2^28 voids in zero bytes. Getters never look at
  // it; copying the record into a reply (the coordinator's listings) used to throw on it.
  const std::vector<uint64_t> words = {
      uint64_t{5} << 32,              // segment table: 1 segment of 5 words
      uint64_t{1 | (3 << 16)} << 32,  // root: struct, 1 data word, 3 pointers
      1700000000000,                  // unixMs
      0,
      0,                            // kind, message: null
      uint64_t{1} << 28 << 35 | 1,  // list, element size void, 2^28 elements
  };
  auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(words.data()), 8 * words.size());
  auto decoded = DecodedRecord<Event>::Decode(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption);
}

TEST(DecodedRecordTest, UnknownPointerOutOfBoundsIsCorruption) {  // found by fuzz/store_record_fuzz
  // A StepReport (3 data words, no pointers in this build) whose wire struct carries a pointer as
  // a newer build's field would. Getters never look at it, but copying the record (as replies do)
  // follows it, so it must be in bounds.
  auto step_report = [](uint64_t extra_pointer) {
    std::vector<uint64_t> words = {
        uint64_t{5} << 32,              // segment table: 1 segment of 5 words
        uint64_t{3 | (1 << 16)} << 32,  // root: struct, 3 data words, 1 pointer
        7,
        0,
        0,  // step 7, loss, tokensPerSecond
        extra_pointer,
    };
    return std::string(reinterpret_cast<const char*>(words.data()), 8 * words.size());
  };
  auto decoded = DecodedRecord<StepReport>::Decode(AsBytes(step_report(0)));  // a null pointer: fine
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->root().getStep(), 7);
  decoded = DecodedRecord<StepReport>::Decode(AsBytes(step_report(uint64_t{1} << 32 | 1000 << 2)));  // 1000 words on
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption);
}

TEST(EnvelopeTest, LargeMultiSegmentListingDecodes) {  // the traversal limit leaves room for real listings
  EnvelopeBuilder builder(9);
  auto runs = builder.root().initStatusReply().initRuns(200);
  for (unsigned i = 0; i < runs.size(); ++i) {
    runs[i].setRunId("run-" + std::to_string(i));
    runs[i].setSpecToml(std::string(500, 'x'));
    auto losses = runs[i].initLosses(5000);
    for (unsigned s = 0; s < losses.size(); ++s) losses.set(s, 1.0 / (s + 1));
    auto workers = runs[i].initWorkers(8);
    for (unsigned w = 0; w < workers.size(); ++w) workers.set(w, "worker-" + std::to_string(w));
  }
  std::string bytes = builder.Serialize();
  auto decoded = DecodeEnvelope(AsBytes(bytes));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  auto reply = (*decoded)->root().getStatusReply();
  ASSERT_EQ(reply.getRuns().size(), 200u);
  EXPECT_EQ(std::string(reply.getRuns()[199].getWorkers()[7].cStr()), "worker-7");
  EXPECT_EQ(reply.getRuns()[5].getLosses()[4999], 1.0 / 5000);
}

TEST(DecodedRecordTest, TextWithoutItsNulIsCorruption) {  // found by fuzz/store_record_fuzz
  capnp::MallocMessageBuilder message;
  auto event = message.initRoot<Event>();
  event.setKind("checkpoint");
  std::string bytes = StructToBytes(event.asReader());
  ASSERT_TRUE(DecodedRecord<Event>::Decode(AsBytes(bytes)).ok());
  const size_t at = bytes.find(std::string("checkpoint\0", 11));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 10] = '!';
  auto decoded = DecodedRecord<Event>::Decode(AsBytes(bytes));
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace strata::schema
