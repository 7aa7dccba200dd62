// The hang watchdog on real worker processes: one rank of a dp=2 run stops before a step while
// its heartbeats go on (an injected fault, worker/fault_injector.h: a rank stuck in its own work),
// so heartbeats cannot notice. Its peer gives up waiting after --peer-timeout-ms and names it; the
// coordinator treats it as lost, the run resumes from its checkpoint on the worker left and
// finishes with the losses of a run that never hung.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class HangTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeClusterScratchDir("/tmp/strata-hang-XXXXXX"); }

  void TearDown() override {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  testing::CommandResult Strata(const std::string& args) { return testing::RunStrata(args, dir_); }

  std::string Spec(const std::string& name, int dp) {
    std::ostringstream s;
    s << "name = \"" << name << "\"\n"
      << "[model]\nlayers = 2\nhidden = 32\nheads = 4\nvocab = 256\nsequence = 32\n"
      << "[data]\npath = \"corpus.txt\"\n"
      << "[train]\nsteps = 12\nglobal_batch = 8\nlr = 0.003\nseed = 5\ncheckpoint_every = 4\n"
      << "[parallel]\ndp = " << dp << "\npp = 1\ntp = 1\nzero = 0\nrecompute = false\nmicro_batch = 4\n";
    return s.str();
  }

  std::string Follow(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    auto r = Strata("submit " + path + " --follow");
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    return r.out.substr(0, r.out.find('\n'));
  }

  json Status(const std::string& run) {
    json j = json::parse(Strata("status " + run + " --json").out);
    return j.is_array() ? j[0] : j;
  }

  // The run's "stalled" journal lines.
  std::string Stalled(const std::string& run) {
    std::string out;
    for (auto& e : json::parse(Strata("events " + run + " --json").out)) {
      if (e["kind"] == "stalled") out += e["message"].get<std::string>() + "\n";
    }
    return out;
  }

  std::vector<double> ExpectFinishedWith(const std::string& run, const std::vector<double>& reference) {
    const json status = Status(run);
    EXPECT_EQ(status["state"], "finished") << status.dump();
    const auto losses = status["losses"].get<std::vector<double>>();
    EXPECT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < std::min(losses.size(), reference.size()); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * std::abs(reference[i])) << "step " << i + 1;
    }
    return losses;
  }

  std::string dir_;
};

TEST_F(HangTest, RankStuckWhileHeartbeatingIsNamedAndTheRunFinishesWithTheSameLosses) {
  // Rank 1 hangs before step 6, once per process; the reference runs on rank 0 alone (dp = 1,
  // the same global batch), so it never meets the hang.
  auto up = testing::RunCommand(std::string(STRATA_BIN_DIR) +
                                    "/strata up --workers 2 --peer-timeout-ms 2000 --replace-grace-ms 0 "
                                    "--inject-fault hang:6:1",
                                dir_);
  ASSERT_EQ(up.rc, 0) << up.err;
  const auto reference = Status(Follow("reference", Spec("reference", 1)))["losses"].get<std::vector<double>>();
  ASSERT_EQ(reference.size(), 12u);

  const auto started = std::chrono::steady_clock::now();
  const std::string run = Follow("hang", Spec("hang", 2));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ExpectFinishedWith(run, reference);
  const json status = Status(run);
  const std::string stalled = Stalled(run);
  EXPECT_NE(stalled.find("rank 1 on worker-1 did not arrive"), std::string::npos) << stalled;
  EXPECT_NE(stalled.find("waited 2 s for rank 1"), std::string::npos) << stalled;  // the waiter's own words
  EXPECT_EQ(status["handled"]["stalled"], 1) << status.dump();
  // Named by the watchdog, not by heartbeats: the hung worker never stopped heartbeating.
  EXPECT_EQ(Strata("events " + run).out.find("stopped sending heartbeats"), std::string::npos);
  // It resumed from the checkpoint before the hang.
  EXPECT_NE(Strata("events " + run).out.find("resuming from the checkpoint at step 4"), std::string::npos);
  EXPECT_LT(seconds, 60) << "a 2 s watchdog should not make a 12-step run take this long";
}

// The stuck rank never returns from its "device call", not even when cancelled: its worker
// restarts its own process (same pid, so `strata up` and systemd still know it) and registers
// again, while the run finishes on the other worker.
TEST_F(HangTest, RankStuckForGoodRestartsItsWorkerInPlaceAndTheRunFinishes) {
  auto up = testing::RunCommand(std::string(STRATA_BIN_DIR) +
                                    "/strata up --workers 2 --peer-timeout-ms 2000 --replace-grace-ms 0 "
                                    "--stuck-task-restart-ms 2000 --inject-fault hang:6:1:stuck",
                                dir_);
  ASSERT_EQ(up.rc, 0) << up.err;
  const auto reference = Status(Follow("reference", Spec("reference", 1)))["losses"].get<std::vector<double>>();
  auto pid_of = [&](const std::string& name) {
    for (auto& w : json::parse(Strata("workers --json").out)) {
      if (w["worker_id"] == name) return std::make_pair(w["pid"].get<int64_t>(), w["state"].get<std::string>());
    }
    return std::make_pair(int64_t{0}, std::string());
  };
  const int64_t pid = pid_of("worker-1").first;
  ASSERT_GT(pid, 0);

  const std::string run = Follow("stuck", Spec("stuck", 2));
  ExpectFinishedWith(run, reference);
  EXPECT_NE(Stalled(run).find("rank 1 on worker-1 did not arrive"), std::string::npos) << Stalled(run);
  // worker-1 restarts by itself once its cancelled task has been stuck for 2 s, registers again
  // under the same pid, and is idle.
  const std::string restarted = "s of its cancel (stuck in a device call); restarting this worker process (same pid)";
  std::string log;
  size_t at = std::string::npos;
  for (int i = 0; i < 300; ++i) {
    log = testing::ReadFile(dir_ + "/state/logs/worker-1.log");
    at = log.find(restarted);
    if (at != std::string::npos && log.find("registered with the coordinator", at) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_NE(log.find("registered with the coordinator", at), std::string::npos)
      << "no registration after the restart:\n"
      << log;
  const auto [pid_after, state] = pid_of("worker-1");
  EXPECT_EQ(pid_after, pid) << "the worker restarted in place (exec), not as a new process";
  EXPECT_EQ(state, "idle");
}

}  // namespace
}  // namespace strata
