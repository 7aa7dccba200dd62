// Token files of any vocabulary through a real cluster (issue #18 item 5; docs/run-spec.md,
// [data]): `strata up` starts a coordinator and two CPU workers, runs are submitted and followed
// with the `strata` CLI, and what is checked is what a user sees: the run finished, its losses,
// its captured activations, or the message a bad file fails it with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using testing::CommandResult;
using testing::ReadFile;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A .npy (format 1.0) of a 1-D array, as np.save writes it: the header padded to 64 bytes.
std::string Npy(const std::string& descr, size_t n, const std::string& data) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(dict.size() & 0xff) +
         static_cast<char>(dict.size() >> 8) + dict + data;
}

class TokenDataClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-tokens-XXXXXX");
    // Ids over the byte range: the corpus's bytes, every third one moved up by 256, under a
    // vocabulary of 512. The same ids in three files.
    const std::string text = ReadFile(dir_ + "/corpus.txt");
    for (size_t i = 0; i < text.size(); ++i)
      ids_.push_back(static_cast<unsigned char>(text[i]) + (i % 3 == 0 ? 256u : 0u));
    std::vector<int64_t> wide(ids_.begin(), ids_.end());
    Write("ids.u32", Bytes(ids_));
    Write("ids.npy", Npy("<u2", ids_.size(), Bytes(std::vector<uint16_t>(ids_.begin(), ids_.end()))));
    Write("ids-i8.npy", Npy("<i8", wide.size(), Bytes(wide)));
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
  }

  static void TearDownTestSuite() {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  static void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  static CommandResult Strata(const std::string& args) {
    return testing::RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args, dir_);
  }
  static json StrataJson(const std::string& args) { return testing::RunStrataJson(args, dir_); }

  static std::string Spec(const std::string& name, const std::string& data, int dp = 2, int steps = 12) {
    std::ostringstream s;
    s << "name = \"" << name << "\"\n"
      << "[model]\nlayers = 2\nhidden = 32\nheads = 4\nvocab = 512\nsequence = 32\n"
      << "[data]\n"
      << data << "[train]\nsteps = " << steps << "\nglobal_batch = 8\nlr = 0.003\nseed = 11\n"
      << "[parallel]\ndp = " << dp << "\npp = 1\ntp = 1\nmicro_batch = 0\nzero = 0\nrecompute = false\n";
    return s.str();
  }

  // Submits with --follow; the run id and the CLI's result.
  static std::pair<std::string, CommandResult> SubmitAndFollow(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    CommandResult r = Strata("submit " + path + " --follow");
    std::istringstream lines(r.out);
    std::string run;
    std::getline(lines, run);
    return {run, r};
  }

  static std::vector<double> FinishedLosses(const std::string& name, const std::string& body) {
    auto [run, r] = SubmitAndFollow(name, body);
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    json status = StrataJson("status " + run);
    EXPECT_EQ(status["state"], "finished") << status.dump();
    EXPECT_EQ(status["step"], 12) << status.dump();
    return status["losses"].is_array() ? status["losses"].get<std::vector<double>>() : std::vector<double>{};
  }

  static std::string dir_;
  static std::vector<uint32_t> ids_;
};
std::string TokenDataClusterTest::dir_;
std::vector<uint32_t> TokenDataClusterTest::ids_;

TEST_F(TokenDataClusterTest, U32AndNpyFilesTrainToTheEndWithTheSameLosses) {
  const auto u32 = FinishedLosses("ids-u32", Spec("ids-u32", "path = \"ids.u32\"\nformat = \"u32\"\n"));
  ASSERT_EQ(u32.size(), 12u);
  for (double loss : u32) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(u32.back(), u32.front()) << "it learns";
  // The same ids as a u2 and an i8 .npy: the same batches, so the same losses, bit for bit.
  EXPECT_EQ(FinishedLosses("ids-npy", Spec("ids-npy", "path = \"ids.npy\"\nformat = \"npy\"\n")), u32);
  EXPECT_EQ(FinishedLosses("ids-i8", Spec("ids-i8", "path = \"ids-i8.npy\"\nformat = \"npy\"\n")), u32);
}

TEST_F(TokenDataClusterTest, AnIdOutsideTheVocabularyFailsTheRunNamingItsOffset) {
  std::vector<uint32_t> bad = ids_;
  bad[7001] = 512;
  Write("bad.u32", Bytes(bad));
  auto [run, r] = SubmitAndFollow("bad-id", Spec("bad-id", "path = \"bad.u32\"\nformat = \"u32\"\n"));
  ASSERT_FALSE(run.empty()) << r.err;
  EXPECT_EQ(r.rc, 1) << "--follow exits 1 for a failed run: " << r.out << r.err;
  json status = StrataJson("status " + run);
  EXPECT_EQ(status["state"], "failed") << status.dump();
  EXPECT_EQ(status["step"], 0) << "found before the first step";
  const std::string message = status["message"].get<std::string>();
  EXPECT_NE(message.find(dir_ + "/bad.u32"), std::string::npos) << message;
  EXPECT_NE(message.find("token id 512 at byte offset 28004 (token 7001)"), std::string::npos) << message;
  EXPECT_NE(message.find("model.vocab = 512"), std::string::npos) << message;
  EXPECT_NE(Strata("events " + run).out.find("byte offset 28004"), std::string::npos);
  // A file whose size does not fit its format is refused at submit (exit 2), naming it.
  Write("odd.u32", Bytes(ids_).substr(0, 4 * 5000 + 3));
  const std::string odd = dir_ + "/odd.toml";
  std::ofstream(odd) << Spec("odd", "path = \"odd.u32\"\nformat = \"u32\"\n");
  auto refused = Strata("submit " + odd);
  EXPECT_EQ(refused.rc, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("odd.u32\" holds 20003 bytes, not a multiple of 4"), std::string::npos) << refused.err;
}

TEST_F(TokenDataClusterTest, SamplingWithinDocumentsTrainsToTheEnd) {
  // A document every 100 tokens (each holds 100 - 32 windows of 33 tokens).
  std::vector<uint64_t> starts;
  for (uint64_t s = 0; s < ids_.size(); s += 100) starts.push_back(s);
  Write("ids.docs", Bytes(starts));
  const auto losses = FinishedLosses("docs", Spec("docs",
                                                  "path = \"ids.u32\"\nformat = \"u32\"\ndocuments = \"ids.docs\"\n"
                                                  "sample_within_documents = true\n"));
  EXPECT_EQ(losses.size(), 12u);
  // An offsets file that is not ascending fails the run at load, naming the index.
  std::swap(starts[3], starts[4]);
  Write("bad.docs", Bytes(starts));
  auto [run, r] = SubmitAndFollow("bad-docs", Spec("bad-docs",
                                                   "path = \"ids.u32\"\nformat = \"u32\"\ndocuments = \"bad.docs\"\n"
                                                   "sample_within_documents = true\n"));
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  const std::string message = StrataJson("status " + run)["message"].get<std::string>();
  EXPECT_NE(message.find("bad.docs\": offset 4 (byte 32) is 300, below offset 3 = 400"), std::string::npos) << message;
}

TEST_F(TokenDataClusterTest, ExtractReadsNpyDataAsItsBytes) {
  // The corpus's bytes as a .npy of u2 and as the text file itself: the same captured rows.
  const std::string text = ReadFile(dir_ + "/corpus.txt");
  std::vector<uint16_t> bytes(text.begin(), text.end());
  for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  Write("bytes.npy", Npy("<u2", bytes.size(), Bytes(bytes)));
  auto extract = [&](const std::string& name, const std::string& data) {
    const std::string body = "name = \"" + name +
                             "\"\nkind = \"extract\"\n[model]\nlayers = 2\nhidden = 32\nheads = 4\nvocab = 256\n"
                             "sequence = 64\n[data]\n" +
                             data +
                             "[train]\nseed = 3\n[parallel]\ndp = 2\n[extract]\nlayers = [1]\nbatch = 8\n"
                             "tokens = 4160\n";
    auto [run, r] = SubmitAndFollow(name, body);
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    json index = StrataJson("activations " + run);
    EXPECT_EQ(index["rows_total"], 4160) << index.dump();  // 65 sequences of 64: the .npy header is not data
    const std::string out = dir_ + "/" + name + ".npy";
    auto get = Strata("activations get " + run + " --layer 1 --out " + out);
    EXPECT_EQ(get.rc, 0) << get.err;
    return ReadFile(out);
  };
  const std::string from_text = extract("x-bytes", "path = \"corpus.txt\"\n");
  const std::string from_npy = extract("x-npy", "path = \"bytes.npy\"\nformat = \"npy\"\n");
  ASSERT_GT(from_text.size(), 4160u * 32 * 4);
  EXPECT_TRUE(from_text == from_npy) << "the .npy run captured other rows than the text run";
}

}  // namespace
}  // namespace strata
