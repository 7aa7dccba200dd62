// `strata logs` and `strata metrics` through the real binary on a local cluster of 2 CPU workers:
// each rank's log holds that rank's lines of that run only (one line per step among them), and
// the metrics file has one row per step with the losses `strata status` reports.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "tensorboard/event_file.h"
#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using testing::CommandResult;

class LogsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-logs-it-XXXXXX");
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
  }

  static void TearDownTestSuite() {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  static CommandResult Strata(const std::string& args) {
    return testing::RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args, dir_);
  }

  static std::string SpecFile(const std::string& name, int steps) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << "name = \"" << name << "\"\n"
                        << "[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nsequence = 32\n"
                        << "[data]\npath = \"corpus.txt\"\n"
                        << "[train]\nsteps = " << steps << "\nglobal_batch = 8\nlr = 0.003\nseed = 7\n"
                        << "[parallel]\ndp = 2\npp = 1\ntp = 1\n";
    return path;
  }

  // Submits (following to the end when `follow`); returns the run id, the first line of stdout.
  static std::string Submit(const std::string& name, int steps, bool follow) {
    auto r = Strata("submit " + SpecFile(name, steps) + (follow ? " --follow" : ""));
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    std::istringstream lines(r.out);
    std::string run_id;
    std::getline(lines, run_id);
    return run_id;
  }

  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  static int CountSubstring(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  static std::string dir_;
};
std::string LogsTest::dir_;

TEST_F(LogsTest, EachRankLogHasItsStepLinesAndNothingOfAnotherRunAndMetricsMatchStatus) {
  const std::string a = Submit("logs-a", 6, /*follow=*/true);
  ASSERT_FALSE(a.empty());
  // A second run that `strata logs --follow` follows while it runs: it returns once the run ends,
  // having printed every step.
  const std::string b = Submit("logs-b", 4, /*follow=*/false);
  ASSERT_FALSE(b.empty());
  auto followed = Strata("logs " + b + " --rank 0 --follow");
  ASSERT_EQ(followed.rc, 0) << followed.err;
  EXPECT_NE(followed.out.find("step 4 loss"), std::string::npos) << followed.out;
  json b_status = json::parse(Strata("status " + b + " --json").out);
  EXPECT_EQ(b_status["state"], "finished") << "--follow returned before the run ended";

  auto logs = Strata("logs " + a + " --rank 1");
  ASSERT_EQ(logs.rc, 0) << logs.err;
  for (int step = 1; step <= 6; ++step) {
    EXPECT_EQ(CountSubstring(logs.out, "step " + std::to_string(step) + " loss "), 1) << "step " << step << ":\n"
                                                                                      << logs.out;
  }
  EXPECT_NE(logs.out.find(" lr 0.003 grad_norm "), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("tokens/s "), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find(" memory "), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("runs run " + a + " as rank 1"), std::string::npos) << "the task thread's own log lines:\n"
                                                                              << logs.out;
  EXPECT_EQ(logs.out.find("as rank 0"), std::string::npos) << "rank 0's lines in rank 1's log:\n" << logs.out;
  EXPECT_EQ(logs.out.find(b), std::string::npos) << "run " << b << "'s lines in run " << a << "'s log:\n" << logs.out;
  for (const auto& line : Lines(logs.out))
    EXPECT_EQ(line.substr(4, 1) + line.substr(10, 1) + line.substr(23, 1), "-TZ") << line;

  // The files: one per run and rank in the worker's store, private to the user.
  int rank1_files = 0;
  std::error_code ec;  // RocksDB may delete a file while we walk
  for (fs::recursive_directory_iterator it(dir_ + "/state", ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    if (entry.path().filename() != "rank-1.log") continue;
    ++rank1_files;
    struct stat st {};
    ASSERT_EQ(::stat(entry.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << entry.path();
  }
  EXPECT_EQ(rank1_files, 2) << "one rank-1 log for each of the two runs";

  // Metrics: one CSV row per step, losses equal to the status's.
  json status = json::parse(Strata("status " + a + " --json").out);
  const auto losses = status["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 6u);
  auto csv = Strata("metrics " + a + " --csv");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  auto rows = Lines(csv.out);
  ASSERT_EQ(rows.size(), 7u) << csv.out;
  EXPECT_EQ(rows[0], "step,loss,lr,tokens_per_second,grad_norm,memory_bytes,unix_ms");
  for (size_t i = 1; i < rows.size(); ++i) {
    std::istringstream fields(rows[i]);
    std::string step, loss;
    std::getline(fields, step, ',');
    std::getline(fields, loss, ',');
    EXPECT_EQ(std::stoll(step), static_cast<long long>(i)) << rows[i];
    EXPECT_EQ(std::stod(loss), losses[i - 1]) << rows[i];
  }
  auto jsonl = Strata("metrics " + a);
  ASSERT_EQ(jsonl.rc, 0) << jsonl.err;
  auto objects = Lines(jsonl.out);
  ASSERT_EQ(objects.size(), 6u) << jsonl.out;
  for (size_t i = 0; i < objects.size(); ++i) {
    json m = json::parse(objects[i]);
    EXPECT_EQ(m["step"], i + 1);
    EXPECT_EQ(m["loss"].get<double>(), losses[i]);
    EXPECT_DOUBLE_EQ(m["lr"].get<double>(), 0.003);
    EXPECT_GT(m["tokens_per_second"].get<double>(), 0);
    EXPECT_GT(m["grad_norm"].get<double>(), 0);  // the global norm, before clipping
    EXPECT_TRUE(std::isfinite(m["grad_norm"].get<double>()));
    EXPECT_GT(m["memory_bytes"].get<int64_t>(), 0);
    EXPECT_GT(m["unix_ms"].get<int64_t>(), 0);
  }

  // TensorBoard: the coordinator's event file for the run and an export of its metrics hold each
  // step's loss (as float32, TensorBoard's scalar type) under train/loss.
  auto board_losses = [&](const std::string& dir) {
    std::vector<double> out;
    std::string file;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) file = entry.path().string();
    EXPECT_FALSE(file.empty()) << "no event file in " << dir;
    if (file.empty()) return out;
    auto events = tensorboard::ReadEventFile(file);
    EXPECT_TRUE(events.ok()) << events.status().ToString();
    if (!events.ok()) return out;
    for (const auto& e : *events) {
      if (e.tag != "train/loss") continue;
      EXPECT_EQ(e.step, static_cast<int64_t>(out.size() + 1));
      out.push_back(e.value);
    }
    return out;
  };
  std::vector<double> float_losses;
  for (double l : losses) float_losses.push_back(static_cast<float>(l));
  EXPECT_EQ(board_losses(dir_ + "/state/coordinator/tensorboard/" + a), float_losses);
  auto exported = Strata("metrics " + a + " --tensorboard " + dir_ + "/board");
  ASSERT_EQ(exported.rc, 0) << exported.err;
  EXPECT_NE(exported.out.find("wrote 6 steps"), std::string::npos) << exported.out;
  EXPECT_EQ(board_losses(dir_ + "/board"), float_losses);
  auto again = Strata("metrics " + a + " --tensorboard " + dir_ + "/board");
  EXPECT_EQ(again.rc, 2) << again.out;
  EXPECT_NE(again.err.find("already holds a TensorBoard event file"), std::string::npos) << again.err;

  // --since: every line of the run was written before the last second.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto recent = Strata("logs " + a + " --rank 1 --since 1s");
  ASSERT_EQ(recent.rc, 0) << recent.err;
  EXPECT_EQ(recent.out, "");
  auto day = Strata("logs " + a + " --rank 1 --since 1d");
  EXPECT_EQ(day.out, logs.out);
}

TEST_F(LogsTest, BadRequestsSayWhatIsWrong) {
  auto since = Strata("logs no-such-run --since 10x");
  EXPECT_EQ(since.rc, 2);
  EXPECT_NE(since.err.find("not a duration"), std::string::npos) << since.err;
  auto unknown = Strata("logs no-such-run");
  EXPECT_EQ(unknown.rc, 1);
  auto metrics = Strata("metrics no-such-run --csv");
  EXPECT_EQ(metrics.rc, 1);
}

}  // namespace
}  // namespace strata
