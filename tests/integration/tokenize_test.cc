// `strata tokenize` through the real binary (issue #18): a tokenizer.json written here, ids read
// back from the file it writes (u32 and u16, from a file and from standard input), a corpus larger
// than one read block equal to encoding it whole, and the refusals: no model directory, no
// tokenizer file, --format u16 for a large vocabulary, an existing --out, text that is not UTF-8,
// an --out that cannot be written; nothing half-written is left behind.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CommandResult;

// GPT-2's byte-to-character map for the bytes these texts use: printable ASCII is itself, the
// space is "Ġ" (U+0120), the newline "Ċ" (U+010A).
std::string ByteLevel(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == ' ') {
      out += "\xC4\xA0";
    } else if (c == '\n') {
      out += "\xC4\x8A";
    } else {
      out += c;
    }
  }
  return out;
}

class TokenizeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/strata-tokenize-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/model");
    // Token id b for printable ASCII byte b, plus the space and the newline; merges after them.
    json vocab = json::object();
    for (int b = 33; b < 127; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
    vocab[ByteLevel(" ")] = 32;
    vocab[ByteLevel("\n")] = 10;
    json merges = json::array();
    int next = 256;
    for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
             {"l", "l"}, {"e", "ll"}, {"H", "ell"}, {" ", "t"}, {"h", "e"}, {" t", "he"}}) {
      merges.push_back(ByteLevel(a) + " " + ByteLevel(b));
      vocab[ByteLevel(a + b)] = next++;
    }
    json root = {{"version", "1.0"},
                 {"added_tokens",
                  {{{"id", 300},
                    {"content", "<|endoftext|>"},
                    {"single_word", false},
                    {"lstrip", false},
                    {"rstrip", false},
                    {"normalized", true},
                    {"special", true}}}},
                 {"normalizer", nullptr},
                 {"pre_tokenizer",
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
                 {"decoder", {{"type", "ByteLevel"}}},
                 {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
    std::ofstream(dir_ + "/model/tokenizer.json") << root.dump();
    // The same with a token id past 65535: too large for --format u16.
    fs::create_directories(dir_ + "/large");
    root["added_tokens"].push_back({{"id", 70000}, {"content", "<|big|>"}, {"special", true}, {"normalized", false}});
    std::ofstream(dir_ + "/large/tokenizer.json") << root.dump();
  }
  static void TearDownTestSuite() {
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  static CommandResult Strata(const std::string& args) {
    return testing::RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args, dir_);
  }
  static std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  template <typename T>
  static std::vector<uint32_t> ReadIds(const std::string& path) {
    const std::string bytes = testing::ReadFile(path);
    EXPECT_EQ(bytes.size() % sizeof(T), 0u);
    std::vector<uint32_t> ids;
    for (size_t i = 0; i + sizeof(T) <= bytes.size(); i += sizeof(T)) {
      T v = 0;
      for (size_t k = 0; k < sizeof(T); ++k)
        v |= static_cast<T>(static_cast<unsigned char>(bytes[i + k])) << (8 * k);  // little-endian
      ids.push_back(v);
    }
    return ids;
  }
  static bool LeftoverTempFiles() {
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().filename().string().find(".tmp.") != std::string::npos) return true;
    }
    return false;
  }

  static std::string dir_;
};
std::string TokenizeTest::dir_;

constexpr const char* kText = "Hello the<|endoftext|>lll\nlll";
// Worked by hand: "Hello" -> H e [ll] o -> H [ell] o -> [Hell] o; " the" -> Ġ t h e -> [Ġt] h e -> [Ġt] [he]
// -> [Ġthe]; "<|endoftext|>" is its added token (300); "lll" merges its leftmost pair: [ll] l; the
// newline is a word of its own.
const std::vector<uint32_t> kExpectedIds = {258, 'o', 261, 300, 256, 'l', 10, 256, 'l'};

TEST_F(TokenizeTest, WritesTheIdsAsLittleEndianU32AndU16) {
  const std::vector<uint32_t>& expected = kExpectedIds;
  const std::string input = Write("small.txt", kText);
  auto r = Strata("tokenize " + dir_ + "/model " + input + " --out " + dir_ + "/small.u32");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(ReadIds<uint32_t>(dir_ + "/small.u32"), expected);
  EXPECT_NE(r.out.find("wrote 9 token ids (u32, 36 bytes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("byte-level BPE from"), std::string::npos) << r.out;

  r = Strata("tokenize " + dir_ + "/model " + input + " --out " + dir_ + "/small.u16 --format u16");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(ReadIds<uint16_t>(dir_ + "/small.u16"), expected);

  r = testing::RunCommand("printf '%s' '" + std::string(kText) + "' | " + STRATA_BIN_DIR + "/strata tokenize " + dir_ +
                              "/model - --out " + dir_ + "/stdin.u32",
                          dir_);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(ReadIds<uint32_t>(dir_ + "/stdin.u32"), expected);
  EXPECT_FALSE(LeftoverTempFiles());
}

TEST_F(TokenizeTest, ACorpusOfManyBlocksGivesTheIdsOfTheWholeText) {
  // 12 MiB: three 4 MiB read blocks, cut wherever they fall (inside words, runs of spaces,
  // added tokens, multi-byte characters; this vocabulary has no bytes above 0x7E, so those are
  // dropped, as tokenizers drops bytes missing from a vocabulary without unk_token).
  const std::vector<std::string> words = {"Hello", "the", "lll", "<|endoftext|>", "über", "中文", "😀", "12345", "it's"};
  const std::vector<std::string> gaps = {" ", "  ", "\n", "\n\n", "   \n", ""};
  std::mt19937 rng(11);
  std::string text;
  while (text.size() < (12u << 20)) text += words[rng() % words.size()] + gaps[rng() % gaps.size()];
  const std::string input = Write("corpus.txt", text);
  auto r = Strata("tokenize " + dir_ + "/model " + input + " --out " + dir_ + "/corpus.u32");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  auto tokenizer = tokenizer::LoadTokenizer(dir_ + "/model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const std::vector<uint32_t> ids = ReadIds<uint32_t>(dir_ + "/corpus.u32");
  const std::vector<uint32_t> whole = (*tokenizer)->Encode(text);
  EXPECT_EQ(ids.size(), whole.size());
  EXPECT_TRUE(ids == whole);  // (not EXPECT_EQ: gtest would print millions of ids)
  fs::remove(input);
}

TEST_F(TokenizeTest, RefusesBadInputWithExitTwoAndLeavesNothing) {
  const std::string input = Write("refuse.txt", kText);
  const std::string out = dir_ + "/refused.u32";

  auto r = Strata("tokenize " + dir_ + "/no-such-model " + input + " --out " + out);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("no-such-model: no such directory"), std::string::npos) << r.err;

  fs::create_directories(dir_ + "/empty-model");
  r = Strata("tokenize " + dir_ + "/empty-model " + input + " --out " + out);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("has no tokenizer.json or tokenizer.model"), std::string::npos) << r.err;

  r = Strata("tokenize " + dir_ + "/model " + dir_ + "/no-such.txt --out " + out);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("no-such.txt: no such file"), std::string::npos) << r.err;

  r = Strata("tokenize " + dir_ + "/large " + input + " --out " + out + " --format u16");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--format u16 holds ids below 65536, but this tokenizer has 70001 ids"), std::string::npos)
      << r.err;

  r = Strata("tokenize " + dir_ + "/model " + input + " --out " + out + " --format u8");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--format"), std::string::npos) << r.err;

  const std::string latin1 = Write("latin1.txt", "caf\xE9 au lait");
  r = Strata("tokenize " + dir_ + "/model " + latin1 + " --out " + out);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("is not UTF-8: byte 0xE9 at offset 3"), std::string::npos) << r.err;

  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(LeftoverTempFiles());

  // An existing --out is kept unless --force.
  Write("kept.u32", "old");
  r = Strata("tokenize " + dir_ + "/model " + input + " --out " + dir_ + "/kept.u32");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("exists; pass --force to replace it"), std::string::npos) << r.err;
  EXPECT_EQ(testing::ReadFile(dir_ + "/kept.u32"), "old");
  r = Strata("tokenize " + dir_ + "/model " + input + " --out " + dir_ + "/kept.u32 --force");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(ReadIds<uint32_t>(dir_ + "/kept.u32").size(), 9u);
}

TEST_F(TokenizeTest, AnOutputThatCannotBeWrittenIsAnIoErrorNamingIt) {
  const std::string input = Write("io.txt", kText);
  // /proc takes no new files, even from root.
  auto r = Strata("tokenize " + dir_ + "/model " + input + " --out /proc/strata-tokenize-test.u32");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cannot write /proc/strata-tokenize-test.u32"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata
