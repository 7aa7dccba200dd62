// The event files TensorBoard reads (event_file.h): CRC-32C against its published check values,
// an event's bytes against the protobuf encoding written out by hand, a round trip through the
// reader, appending after a restart, and damage named by its offset.
#include "tensorboard/event_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace strata::tensorboard {
namespace {

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class EventFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tb-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST(Crc32cTest, MatchesThePublishedCheckValues) {
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32c(digits.data(), digits.size()), 0xe3069283u);  // the CRC catalogue's check value
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720, B.4
}

TEST_F(EventFileTest, AScalarEventIsTheProtobufEncodingFramedAsATfRecord) {
  auto writer = EventFileWriter::Open(dir_, 1700000000);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  EXPECT_NE(writer->path().find("/events.out.tfevents.1700000000."), std::string::npos);
  const size_t version_size = Bytes(writer->path()).size();
  ASSERT_TRUE(writer->Append(3, 1.5, {{"a", 2.0f}}).ok());
  // Event { wall_time: 1.5 (field 1, fixed64), step: 3 (field 2, varint), summary (field 5) {
  //   value (field 1) { tag: "a" (field 1), simple_value: 2.0 (field 2, fixed32) } } }
  const std::string event = std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) + "\x10\x03" + "\x2a\x0a" +
                            "\x0a\x08" + "\x0a\x01" + "a" + std::string("\x15\x00\x00\x00\x40", 5);
  ASSERT_EQ(event.size(), 23u);
  std::string record(8, '\0');
  record[0] = static_cast<char>(event.size());
  auto append_u32 = [&](uint32_t v) { record.append(reinterpret_cast<const char*>(&v), 4); };
  append_u32(MaskedCrc32c(record.data(), 8));
  record += event;
  append_u32(MaskedCrc32c(event.data(), event.size()));
  EXPECT_EQ(Bytes(writer->path()).substr(version_size), record);
}

TEST_F(EventFileTest, ScalarsReadBackAndARestartAppendsToTheSameFile) {
  {
    auto writer = EventFileWriter::Open(dir_, 100);
    ASSERT_TRUE(writer.ok());
    for (int step = 1; step <= 3; ++step)
      ASSERT_TRUE(
          writer->Append(step, 100.0 + step, StepScalars(5.0 / step, 1e-3, std::nan(""), 1000.0 * step, 2e9)).ok());
  }
  auto again = EventFileWriter::Open(dir_, 999);  // a restarted coordinator
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->path().find("tfevents.100."), std::string::npos) << again->path();
  ASSERT_TRUE(again->Append(4, 104.0, StepScalars(1.25, 1e-3, 0.5, 4000.0, 2e9)).ok());
  auto events = ReadEventFile(again->path());
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->size(), 3u * 4 + 5);  // no grad_norm until step 4
  EXPECT_EQ((*events)[0].step, 1);
  EXPECT_EQ((*events)[0].tag, "train/loss");
  EXPECT_FLOAT_EQ((*events)[0].value, 5.0f);
  EXPECT_DOUBLE_EQ((*events)[0].wall_time, 101.0);
  EXPECT_EQ((*events)[3].tag, "train/memory_bytes");
  EXPECT_FLOAT_EQ((*events)[3].value, 2e9f);
  const ScalarEvent& norm = (*events)[12 + 2];
  EXPECT_EQ(norm.step, 4);
  EXPECT_EQ(norm.tag, "train/grad_norm");
  EXPECT_FLOAT_EQ(norm.value, 0.5f);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), std::filesystem::directory_iterator()), 1);
}

TEST_F(EventFileTest, AnExportRefusesADirectoryThatHoldsEventsAlready) {
  ASSERT_TRUE(EventFileWriter::Open(dir_, 1).ok());
  auto refused = EventFileWriter::Open(dir_, 2, EventFileWriter::Existing::kRefuse);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("already holds a TensorBoard event file"), std::string::npos);
}

TEST_F(EventFileTest, DamageIsNamedByTheFileAndOffset) {
  auto writer = EventFileWriter::Open(dir_, 7);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Append(1, 8.0, {{"x", 1.0f}}).ok());
  const size_t first = Bytes(writer->path()).size();
  ASSERT_TRUE(writer->Append(2, 9.0, {{"x", 2.0f}}).ok());
  const std::string good = Bytes(writer->path());
  auto write = [&](const std::string& bytes) { std::ofstream(writer->path(), std::ios::binary) << bytes; };
  std::string flipped = good;
  flipped[first + 14] ^= 0x01;  // inside the second record's data
  write(flipped);
  auto damaged = ReadEventFile(writer->path());
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), StatusCode::kCorruption);
  EXPECT_NE(damaged.status().message().find(writer->path() + " at byte " + std::to_string(first)), std::string::npos)
      << damaged.status().message();
  write(good.substr(0, good.size() - 2));
  auto cut = ReadEventFile(writer->path());
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("cut short"), std::string::npos) << cut.status().message();
}

}  // namespace
}  // namespace strata::tensorboard
