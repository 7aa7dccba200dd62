#include "schema/envelope.h"

#include <gtest/gtest.h>

#include <random>

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

}  // namespace
}  // namespace strata::schema
