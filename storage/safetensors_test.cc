#include "storage/safetensors.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

namespace strata::storage {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-st-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  std::string dir_;
};

TEST_F(SafetensorsTest, RoundTripsBytesShapesDtypesAndMetadata) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {0x3f80, 0xc000, 0x4040};  // bf16 1, -2, 3
  std::vector<NamedTensorView> tensors = {
      {"layer.a", {DType::kF32, {2, 3}, {reinterpret_cast<const uint8_t*>(a.data()), a.size() * 4}}},
      {"b", {DType::kBF16, {3}, {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 2}}},
  };
  ASSERT_TRUE(WriteSafetensors(dir_ + "/m.safetensors", tensors, {{"format", "pt"}}).ok());
  auto file = ReadSafetensors(dir_ + "/m.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  const Tensor& ra = file->tensors.at("layer.a");
  EXPECT_EQ(ra.dtype, DType::kF32);
  EXPECT_EQ(ra.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(0, std::memcmp(ra.bytes.data(), a.data(), 24));
  EXPECT_EQ(file->tensors.at("b").dtype, DType::kBF16);
  EXPECT_EQ(0, std::memcmp(file->tensors.at("b").bytes.data(), b.data(), 6));
}

TEST_F(SafetensorsTest, NumpyReadsWhatWeWrite) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no numpy";
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteSafetensors(dir_ + "/n.safetensors",
                               {{"x", {DType::kF32, {3, 2}, {reinterpret_cast<const uint8_t*>(a.data()), 24}}}})
                  .ok());
  // An independent reader of the format: json header + numpy over the data section.
  const std::string script = dir_ + "/read.py";
  std::ofstream(script) << "import json, struct, sys, numpy as np\n"
                           "b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]\n"
                           "h = json.loads(b[8:8+n]); e = h['x']; s, t = e['data_offsets']\n"
                           "x = np.frombuffer(b[8+n+s:8+n+t], dtype=np.float32).reshape(e['shape'])\n"
                           "assert e['dtype'] == 'F32' and x.shape == (3, 2) and x[2, 1] == 6.0 and x.sum() == 21\n";
  EXPECT_EQ(std::system(("/usr/bin/python3 " + script + " " + dir_ + "/n.safetensors").c_str()), 0);
}

TEST_F(SafetensorsTest, MalformedFilesAreCorruptionNamingTheProblem) {
  std::vector<float> a = {1, 2};
  ASSERT_TRUE(WriteSafetensors(dir_ + "/ok.safetensors",
                               {{"x", {DType::kF32, {2}, {reinterpret_cast<const uint8_t*>(a.data()), 8}}}})
                  .ok());
  std::ifstream in(dir_ + "/ok.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // Truncated data.
  std::ofstream(dir_ + "/short.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  auto r = ReadSafetensors(dir_ + "/short.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("'x'"), std::string::npos) << r.status().message();
  // Header length beyond the file.
  std::string huge = bytes;
  huge[7] = 0x7f;
  std::ofstream(dir_ + "/huge.safetensors", std::ios::binary) << huge;
  EXPECT_EQ(ReadSafetensors(dir_ + "/huge.safetensors").status().code(), StatusCode::kCorruption);
  // Garbage JSON.
  std::string garbage = bytes;
  garbage[8] = '[';
  garbage[9] = '{';
  std::ofstream(dir_ + "/garbage.safetensors", std::ios::binary) << garbage;
  EXPECT_EQ(ReadSafetensors(dir_ + "/garbage.safetensors").status().code(), StatusCode::kCorruption);
}

// Shapes and offsets that are not byte counts: each is Corruption naming the tensor. The first
// six used to pass, or were undefined behaviour (a float converted to int64_t out of its range:
// found by fuzz/safetensors_fuzz, whose shape had a dimension of 3444444444444444444444).
TEST_F(SafetensorsTest, ShapesThatAreNotByteCountsAreCorruption) {
  auto write = [&](const std::string& file, const std::string& header, const std::string& data) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    std::ofstream(dir_ + "/" + file, std::ios::binary) << bytes << header << data;
    return dir_ + "/" + file;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      // 2^62 f32 elements are 2^64 bytes, which wrapped to 0 and matched empty offsets: a tensor
      // of 2^62 elements over no bytes.
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""},
      {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""},
      // Floats were truncated (2.5 -> 2), or undefined behaviour out of int64's range.
      {R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", "12345678"},
      {R"({"w":{"dtype":"F32","shape":[1e300],"data_offsets":[0,0]}})", ""},
      {R"({"w":{"dtype":"F32","shape":[4,3444444444444444444444],"data_offsets":[0,48]}})", std::string(48, 'x')},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", "12345678"},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "12345678"},
      {R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", "12345678"},
      {R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", "12345678"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = ReadSafetensors(write("case" + std::to_string(i) + ".safetensors", cases[i].first, cases[i].second));
    ASSERT_FALSE(r.ok()) << cases[i].first;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << cases[i].first;
    EXPECT_NE(r.status().message().find("'w'"), std::string::npos) << r.status().message();
  }
  // The same header with a whole shape is fine.
  auto ok =
      ReadSafetensors(write("ok.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "12345678"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->tensors.at("w").shape, (std::vector<int64_t>{2}));
}

TEST_F(SafetensorsTest, WrongByteCountIsRejectedNamingTheTensor) {
  std::vector<float> a = {1, 2, 3};
  auto st = WriteSafetensors(dir_ + "/bad.safetensors",
                             {{"w", {DType::kF32, {2, 2}, {reinterpret_cast<const uint8_t*>(a.data()), 12}}}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos);
}

}  // namespace
}  // namespace strata::storage
