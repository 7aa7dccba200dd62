// TokenData over real files: every format reads the same ids, .npy headers of each version and
// style, the range check (at load, and per window for files past the scan threshold), sizes that
// do not fit the format, and within-document sampling.
#include "worker/token_data.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/token_file.h"

namespace strata::worker {
namespace {

namespace fs = std::filesystem;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A .npy file image: `dict` padded with spaces and '\n' so the data starts on a 64-byte boundary
// (as np.save does), under format version `major`.0.
std::string Npy(const std::string& dict, const std::string& data, int major = 1, size_t align = 64) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((align - (prefix + header.size() + 1) % align) % align, ' ');
  header += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const uint32_t n = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string NpyDict(const std::string& descr, size_t n) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
}

class TokenDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-token-data-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static DataSpec Spec(const std::string& path, const std::string& format) {
    DataSpec spec;
    spec.path = path;
    spec.format = ParseChoice<TokenFormat>(format).value();
    return spec;
  }
  static std::vector<int64_t> All(const TokenData& data) {
    std::vector<int64_t> out(data.size());
    EXPECT_TRUE(data.Read(0, static_cast<int64_t>(out.size()), out.data()).ok());
    return out;
  }
  // Loads and expects InvalidArgument containing each of `needles`.
  void ExpectRefused(const DataSpec& spec, int64_t vocab, const std::vector<std::string>& needles,
                     int64_t sequence = 0) {
    auto data = TokenData::Load(spec, vocab, sequence);
    ASSERT_FALSE(data.ok()) << spec.path << " loaded";
    EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument) << data.status().ToString();
    for (const auto& needle : needles)
      EXPECT_NE(data.status().message().find(needle), std::string::npos) << data.status().message();
  }

  std::string dir_;
};

std::vector<uint32_t> SomeIds(size_t n, uint32_t vocab) {
  std::mt19937 rng(5);
  std::vector<uint32_t> ids(n);
  for (auto& id : ids) id = rng() % vocab;
  return ids;
}

TEST_F(TokenDataTest, EveryFormatReadsTheSameIds) {
  const auto ids = SomeIds(100000, 60000);
  std::vector<uint16_t> u16(ids.begin(), ids.end());
  std::vector<int64_t> i64(ids.begin(), ids.end());
  std::vector<int32_t> i32(ids.begin(), ids.end());
  std::vector<int64_t> expected(ids.begin(), ids.end());
  const std::map<std::string, DataSpec> files = {
      {"u16", Spec(Write("t.u16", Bytes(u16)), "u16")},
      {"u32", Spec(Write("t.u32", Bytes(ids)), "u32")},
      {"npy <u2", Spec(Write("u2.npy", Npy(NpyDict("<u2", u16.size()), Bytes(u16))), "npy")},
      {"npy <u4", Spec(Write("u4.npy", Npy(NpyDict("<u4", ids.size()), Bytes(ids))), "npy")},
      {"npy <i4", Spec(Write("i4.npy", Npy(NpyDict("<i4", i32.size()), Bytes(i32))), "npy")},
      {"npy <i8", Spec(Write("i8.npy", Npy(NpyDict("<i8", i64.size()), Bytes(i64))), "npy")},
      {"npy <u8 v2", Spec(Write("u8.npy", Npy(NpyDict("<u8", i64.size()), Bytes(i64), 2)), "npy")},
  };
  for (const auto& [name, spec] : files) {
    auto data = TokenData::Load(spec, 60000);
    ASSERT_TRUE(data.ok()) << name << ": " << data.status().ToString();
    EXPECT_TRUE(data->scanned_at_load()) << name;
    ASSERT_EQ(data->size(), ids.size()) << name;
    EXPECT_EQ(All(*data), expected) << name;
    std::vector<int32_t> window(1000);
    ASSERT_TRUE(data->Read(12345, 1000, window.data()).ok()) << name;
    EXPECT_TRUE(std::equal(window.begin(), window.end(), ids.begin() + 12345)) << name;
    // The same batches whatever the format: sampling depends only on the token count.
    EXPECT_EQ(data->BatchOffsets(7, 3, 8, 64), TokenData::Load(files.at("u16"), 60000)->BatchOffsets(7, 3, 8, 64))
        << name;
  }
}

TEST_F(TokenDataTest, BytesAreTokensAndBatchesKeepTheirConvention) {
  std::string text(5000, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>((i * 7) % 256);
  auto data = TokenData::Load(Spec(Write("corpus.txt", text), "bytes"), 256);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_EQ(data->size(), text.size());
  const auto all = All(*data);
  for (size_t i = 0; i < text.size(); ++i) ASSERT_EQ(all[i], static_cast<unsigned char>(text[i]));
  // docs/run-spec.md, "Batches": mt19937_64(seed * 0x9E3779B97F4A7C15 + step), offset = rng() % (N - sequence).
  std::mt19937_64 rng(uint64_t{1234} * 0x9E3779B97F4A7C15ull + 9);
  std::vector<int64_t> expected(16);
  for (auto& o : expected) o = static_cast<int64_t>(rng() % (text.size() - 64));
  EXPECT_EQ(data->BatchOffsets(1234, 9, 16, 64), expected);
}

TEST_F(TokenDataTest, NpyHeaderVariantsParse) {
  const std::vector<uint16_t> ids = {1, 2, 3, 40000, 5};
  const std::string data = Bytes(ids);
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"np.save v1", Npy(NpyDict("<u2", 5), data)},
      {"v2", Npy(NpyDict("<u2", 5), data, 2)},
      {"v3", Npy(NpyDict("<u2", 5), data, 3)},
      {"16-byte aligned (older numpy)", Npy(NpyDict("<u2", 5), data, 1, 16)},
      {"unaligned data", Npy(NpyDict("<u2", 5), data, 1, 1)},
      {"keys reordered, double quotes", Npy("{\"shape\": (5,), \"fortran_order\": False, \"descr\": \"<u2\"}", data)},
      {"no trailing comma, spaces", Npy("{ 'descr' : '<u2' , 'fortran_order' : False , 'shape' : ( 5 , ) }", data)},
      {"python 2 long", Npy("{'descr': '<u2', 'fortran_order': False, 'shape': (5L,), }", data)},
      {"native order", Npy(NpyDict("=u2", 5), data)},
  };
  for (const auto& [name, bytes] : variants) {
    auto loaded = TokenData::Load(Spec(Write("v.npy", bytes), "npy"), 65536);
    ASSERT_TRUE(loaded.ok()) << name << ": " << loaded.status().ToString();
    EXPECT_EQ(All(*loaded), (std::vector<int64_t>{1, 2, 3, 40000, 5})) << name;
  }
  // One-byte ids ('|u1') and an empty array.
  auto bytes = TokenData::Load(Spec(Write("b.npy", Npy(NpyDict("|u1", 3), "\x01\x02\x03")), "npy"), 4);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(All(*bytes), (std::vector<int64_t>{1, 2, 3}));
  auto empty = TokenData::Load(Spec(Write("e.npy", Npy(NpyDict("<u4", 0), "")), "npy"), 4);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->size(), 0u);
}

TEST_F(TokenDataTest, NpyHeadersStrataCannotReadNameTheField) {
  const std::string four = Bytes(std::vector<uint32_t>{1, 2, 3, 4});
  const std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> cases = {
      {"fortran", Npy("{'descr': '<u4', 'fortran_order': True, 'shape': (4,), }", four), {"'fortran_order'", "True"}},
      {"2-D",
       Npy("{'descr': '<u4', 'fortran_order': False, 'shape': (2, 2), }", four),
       {"'shape' = (2, 2)", "not 1-D"}},
      {"0-D",
       Npy("{'descr': '<u4', 'fortran_order': False, 'shape': (), }", four.substr(0, 4)),
       {"'shape' = ()", "not 1-D"}},
      {"big-endian", Npy(NpyDict(">u4", 4), four), {"'descr' = '>u4'", "big-endian"}},
      {"float", Npy(NpyDict("<f4", 4), four), {"'descr' = '<f4'", "floating-point"}},
      {"bool", Npy(NpyDict("|b1", 4), four.substr(0, 4)), {"'descr' = '|b1'", "not an integer"}},
      {"structured",
       Npy("{'descr': [('a', '<u4')], 'fortran_order': False, 'shape': (4,), }", four),
       {"'descr'", "structured"}},
      {"shape too long", Npy(NpyDict("<u4", 5), four), {"'shape' = (5,)", "truncated"}},
      {"shape too short", Npy(NpyDict("<u4", 3), four), {"'shape' = (3,)", "16 bytes"}},
      {"negative dim", Npy("{'descr': '<u4', 'fortran_order': False, 'shape': (-4,), }", four), {"'shape'", "-4"}},
      {"extra key", Npy("{'descr': '<u4', 'fortran_order': False, 'shape': (4,), 'x': 1}", four), {"'x'"}},
      {"missing key", Npy("{'descr': '<u4', 'shape': (4,)}", four), {"lacks the key 'fortran_order'"}},
      {"duplicate key",
       Npy("{'descr': '<u4', 'descr': '<u4', 'fortran_order': False, 'shape': (4,)}", four),
       {"twice"}},
      {"not a dict", Npy("[1, 2]", four), {"not a dict"}},
      {"garbage", Npy("{'descr': <u4}", four), {"does not parse", "character"}},
      {"deep", Npy(std::string(40, '[') + std::string(40, ']'), four), {"nesting"}},
      {"version 4", std::string("\x93NUMPY\x04\x00\x10\x00", 10) + std::string(15, ' ') + "\n", {"version 4.0"}},
      {"no newline", std::string("\x93NUMPY\x01\x00\x04\x00{}  ", 14), {"newline"}},
      {"header past the end", std::string("\x93NUMPY\x01\x00\xff\x00{}", 12), {"header says 255 bytes"}},
      {"not npy", "hello world", {"magic"}},
  };
  for (const auto& [name, bytes, needles] : cases) {
    SCOPED_TRACE(name);
    const std::string path = Write("bad.npy", bytes);
    std::vector<std::string> all = needles;
    all.push_back("data.path = \"" + path + "\"");
    ExpectRefused(Spec(path, "npy"), 100, all);
  }
}

TEST_F(TokenDataTest, AnIdOutsideTheVocabularyNamesItsByteOffset) {
  auto ids = SomeIds(300000, 1000);
  ids[250001] = 1000;
  ExpectRefused(Spec(Write("t.u32", Bytes(ids)), "u32"), 1000,
                {"t.u32", "token id 1000 at byte offset 1000004 (token 250001)", "model.vocab = 1000"});
  // In a .npy the offset counts the header.
  const size_t header = Npy(NpyDict("<u4", ids.size()), "").size();
  ExpectRefused(Spec(Write("t.npy", Npy(NpyDict("<u4", ids.size()), Bytes(ids))), "npy"), 1000,
                {"t.npy", "byte offset " + std::to_string(header + 1000004) + " (token 250001)"});
  std::vector<uint16_t> u16(ids.begin(), ids.end());
  u16[3] = 65535;
  ExpectRefused(Spec(Write("t.u16", Bytes(u16)), "u16"), 1000, {"token id 65535 at byte offset 6 (token 3)"});
  // u16 ids always fit a vocabulary over 65535: nothing to check.
  auto big_vocab = TokenData::Load(Spec(Write("t.u16", Bytes(u16)), "u16"), 70000);
  EXPECT_TRUE(big_vocab.ok()) << big_vocab.status().ToString();
  // Signed arrays: a negative id is refused as such.
  std::vector<int16_t> i16 = {3, 2, -1, 0};
  ExpectRefused(Spec(Write("s.npy", Npy(NpyDict("<i2", i16.size()), Bytes(i16))), "npy"), 1000,
                {"token id -1 at byte offset " + std::to_string(Npy(NpyDict("<i2", 4), "").size() + 4) + " (token 2)",
                 "negative"});
  std::vector<int64_t> i64 = {3, 2, 1, int64_t{1} << 40};
  ExpectRefused(Spec(Write("l.npy", Npy(NpyDict("<i8", i64.size()), Bytes(i64))), "npy"), 1000,
                {"token id 1099511627776 at byte offset " + std::to_string(Npy(NpyDict("<i8", 4), "").size() + 24) +
                 " (token 3)"});
  std::vector<uint64_t> u64 = {1, ~uint64_t{0}};
  ExpectRefused(Spec(Write("u.npy", Npy(NpyDict("<u8", u64.size()), Bytes(u64))), "npy"), 1000,
                {"token id 18446744073709551615 at byte offset", "not below model.vocab = 1000"});
  // The last id of a file whose length is no multiple of the scan's blocks.
  auto tail = SomeIds(65536 + 65 + 7, 1000);
  tail.back() = 5000;
  ExpectRefused(Spec(Write("tail.u32", Bytes(tail)), "u32"), 1000, {"token " + std::to_string(tail.size() - 1) + ")"});
}

// A file over kScanAtLoadBytes (sparse: its holes read as id 0 and take no disk) is checked per
// window: Load succeeds, the window holding the bad id fails with its offset, others read fine.
TEST_F(TokenDataTest, FilesPastTheScanThresholdAreCheckedPerWindow) {
  const std::string path = dir_ + "/huge.u32";
  const uint64_t tokens = TokenData::kScanAtLoadBytes / 4 + 1024;
  const uint64_t bad = tokens - 10;
  {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    if (::ftruncate(fd, static_cast<off_t>(tokens * 4)) != 0) {
      ::close(fd);
      GTEST_SKIP() << "this file system cannot hold a sparse " << tokens * 4 << "-byte file";
    }
    const uint32_t id = 77777;
    ASSERT_EQ(::pwrite(fd, &id, 4, static_cast<off_t>(bad * 4)), 4);
    ::close(fd);
  }
  auto data = TokenData::Load(Spec(path, "u32"), 50000);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_FALSE(data->scanned_at_load());
  EXPECT_EQ(data->size(), tokens);
  std::vector<int64_t> window(65);
  EXPECT_TRUE(data->Read(0, 65, window.data()).ok());
  EXPECT_TRUE(data->Read(static_cast<int64_t>(bad) - 65, 65, window.data()).ok());
  Status read = data->Read(static_cast<int64_t>(bad) - 60, 65, window.data());
  EXPECT_EQ(read.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(read.message().find("token id 77777 at byte offset " + std::to_string(bad * 4)), std::string::npos)
      << read.message();
  EXPECT_NE(read.message().find(path), std::string::npos) << read.message();
}

TEST_F(TokenDataTest, SizesThatDoNotFitTheFormatNameTheFile) {
  ExpectRefused(Spec(Write("odd.u16", std::string(7, 'a')), "u16"), 300, {"odd.u16", "7 bytes, not a multiple of 2"});
  ExpectRefused(Spec(Write("odd.u32", std::string(10, 'a')), "u32"), 300, {"odd.u32", "10 bytes, not a multiple of 4"});
  auto missing = TokenData::Load(Spec(dir_ + "/nope.u32", "u32"), 300);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.u32"), std::string::npos);
  ExpectRefused(Spec(dir_, "u32"), 300, {"not a regular file"});
  // "text" is tokenized into a u32 file at submit: a worker never reads it.
  ExpectRefused(Spec(Write("x.u32", "abcd"), "text"), 300, {"data.format = \"text\" is not supported"});
}

// ---------------------------------------------------------------- documents

class DocumentsTest : public TokenDataTest {
 protected:
  // `lengths` documents of consecutive ids (id = position % 1000), and the offsets file.
  TokenData LoadDocuments(const std::vector<uint64_t>& lengths, int64_t sequence,
                          std::vector<uint64_t>* starts_out = nullptr) {
    std::vector<uint64_t> starts;
    uint64_t total = 0;
    for (uint64_t n : lengths) starts.push_back(total), total += n;
    std::vector<uint32_t> ids(total);
    for (uint64_t i = 0; i < total; ++i) ids[i] = static_cast<uint32_t>(i % 1000);
    DataSpec spec = Spec(Write("docs.u32", Bytes(ids)), "u32");
    spec.documents = Write("docs.idx", Bytes(starts));
    spec.sample_within_documents = true;
    if (starts_out) *starts_out = starts;
    auto data = TokenData::Load(spec, 1000, sequence);
    EXPECT_TRUE(data.ok()) << data.status().ToString();
    return std::move(data).value();
  }
};

TEST_F(DocumentsTest, WindowsStayInsideDocumentsAndCoverEachEvenly) {
  // Documents of 10 (too short for sequence 16: never sampled), 17 (one window), 50 and 40; then
  // enough short ones (empty ones too) that the sparse index has several entries.
  std::vector<uint64_t> lengths = {10, 17, 50, 40};
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) lengths.push_back(rng() % 20);
  std::vector<uint64_t> starts;
  TokenData data = LoadDocuments(lengths, 16, &starts);
  uint64_t windows = 0;
  for (uint64_t n : lengths) windows += n > 16 ? n - 16 : 0;
  std::map<int64_t, int> hits;
  for (int64_t step = 0; step < 2000; ++step) {
    for (int64_t o : data.BatchOffsets(11, step, 32, 16)) {
      const size_t d = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), static_cast<uint64_t>(o)) -
                                           starts.begin()) -
                       1;
      ASSERT_LE(o + 17, static_cast<int64_t>(starts[d] + lengths[d]))
          << "window at " << o << " crosses the end of document " << d;
      ++hits[o];
    }
  }
  EXPECT_EQ(hits.count(0), 0u) << "a 10-token document is shorter than a window";
  EXPECT_GT(hits.count(10), 0u) << "the 17-token document's one window";
  EXPECT_EQ(hits.count(11), 0u);
  // Uniform over the valid windows: 64000 draws over `windows` starts, each near its mean.
  EXPECT_EQ(hits.size(), windows) << "every window drawn at least once";
  for (const auto& [o, n] : hits) EXPECT_LT(n, 64000.0 / windows * 3) << o;
}

TEST_F(DocumentsTest, TheDrawIsTheRthWindowInFileOrder) {
  // Documents of 20 and 30 tokens, sequence 8: windows 0..11 start at 0..11, 12..33 at 20..41.
  TokenData data = LoadDocuments({20, 30}, 8);
  std::mt19937_64 rng(uint64_t{5} * 0x9E3779B97F4A7C15ull + 2);
  std::vector<int64_t> expected(10);
  for (auto& o : expected) {
    const uint64_t r = rng() % 34;
    o = static_cast<int64_t>(r < 12 ? r : 20 + (r - 12));
  }
  EXPECT_EQ(data.BatchOffsets(5, 2, 10, 8), expected);
}

TEST_F(DocumentsTest, OneDocumentSamplesAsWithout) {
  TokenData within = LoadDocuments({5000}, 64);
  auto plain = TokenData::Load(Spec(dir_ + "/docs.u32", "u32"), 1000);
  ASSERT_TRUE(plain.ok());
  for (int64_t step = 0; step < 5; ++step)
    EXPECT_EQ(within.BatchOffsets(9, step, 8, 64), plain->BatchOffsets(9, step, 8, 64));
}

TEST_F(DocumentsTest, OffsetsFilesAreValidatedNamingTheIndex) {
  const std::string tokens = Write("t.u32", Bytes(SomeIds(100, 50)));
  auto refuse = [&](const std::string& name, const std::string& bytes, const std::vector<std::string>& needles,
                    int64_t sequence = 8) {
    SCOPED_TRACE(name);
    DataSpec spec = Spec(tokens, "u32");
    spec.documents = Write(name, bytes);
    spec.sample_within_documents = true;
    std::vector<std::string> all = needles;
    all.push_back("data.documents = \"" + spec.documents + "\"");
    ExpectRefused(spec, 50, all, sequence);
  };
  refuse("first", Bytes(std::vector<uint64_t>{3, 10}), {"offset 0 (byte 0) is 3, not 0"});
  refuse("descending", Bytes(std::vector<uint64_t>{0, 40, 30, 50}), {"offset 2 (byte 16) is 30, below offset 1 = 40"});
  refuse("past", Bytes(std::vector<uint64_t>{0, 40, 101}), {"offset 2 (byte 16) is 101, past the 100 tokens"});
  refuse("size", std::string(12, '\0'), {"12 bytes, not a multiple of 8"});
  refuse("empty", "", {"holds no offsets"});
  refuse("short docs", Bytes(std::vector<uint64_t>{0, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90}),
         {"no document holds model.sequence + 1 = 11 tokens (the longest holds 10)"}, 10);
  refuse("npy negative", Npy(NpyDict("<i8", 2), Bytes(std::vector<int64_t>{0, -5})),
         {"offset 1 (byte 136) is -5, negative"});
  refuse("npy u4", Npy(NpyDict("<u4", 2), Bytes(std::vector<uint32_t>{0, 5})),
         {"'descr' = '<u4'", "not a 64-bit integer"});
  // Accepted: an int64 .npy, empty documents (equal neighbours) and a final offset at the end.
  DataSpec spec = Spec(tokens, "u32");
  spec.documents = Write("ok.npy", Npy(NpyDict("<i8", 4), Bytes(std::vector<int64_t>{0, 0, 60, 100})));
  spec.sample_within_documents = true;
  auto data = TokenData::Load(spec, 50, 8);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  for (int64_t o : data->BatchOffsets(1, 1, 64, 8)) EXPECT_TRUE(o + 9 <= 60 || (o >= 60 && o + 9 <= 100)) << o;
}

}  // namespace
}  // namespace strata::worker
