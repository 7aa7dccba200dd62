// Checkpoints across hosts, on real processes: `strata up --hosts 2` spreads 4 workers over two
// emulated hosts (worker-0 and worker-2 on host-0, worker-1 and worker-3 on host-1), whose workers
// read each other's stores only through their store servers. Every checkpoint shard gets a copy
// on the other host before the checkpoint is committed; a run resumes from shards on another host
// through the store servers, and a run that loses a whole host, disks included, resumes from the
// copies and finishes with the losses of a run that lost nothing.
#include <gtest/gtest.h>
#include <signal.h>

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

class HostsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeClusterScratchDir("/tmp/strata-hosts-XXXXXX"); }

  void TearDown() override {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  testing::CommandResult Strata(const std::string& args) { return testing::RunStrata(args, dir_); }

  // Long enough that the loss below lands mid-run: with checkpoint data files a 12-step run
  // finished between two polls of its status.
  static constexpr int kSteps = 120;

  std::string Spec(const std::string& name) {
    std::ostringstream s;
    s << "name = \"" << name << "\"\n"
      << "[model]\nlayers = 2\nhidden = 32\nheads = 4\nvocab = 256\nsequence = 32\n"
      << "[data]\npath = \"corpus.txt\"\n"
      << "[train]\nsteps = " << kSteps << "\nglobal_batch = 8\nlr = 0.003\nseed = 5\ncheckpoint_every = 4\n"
      << "keep_checkpoints = 0\n"  // every one kept: a reference resumes from step 8
      << "[parallel]\ndp = 2\npp = 1\ntp = 1\nzero = 1\nrecompute = false\nmicro_batch = 2\n";
    return s.str();
  }

  std::string Submit(const std::string& name, const std::string& flags) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << Spec(name);
    auto r = Strata("submit " + path + flags);
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    return r.out.substr(0, r.out.find('\n'));
  }

  json Status(const std::string& run) {
    json j = json::parse(Strata("status " + run + " --json").out);
    return j.is_array() ? j[0] : j;
  }

  std::string Journal(const std::string& run) { return Strata("events " + run).out; }

  int Pid(const std::string& name) {
    auto cluster = json::parse(testing::ReadFile(dir_ + "/state/cluster.json"));
    for (auto& p : cluster["processes"]) {
      if (p["name"] == name) return p["pid"].get<int>();
    }
    return 0;
  }

  void ExpectLosses(const json& status, const std::vector<double>& reference, const std::string& what) {
    EXPECT_EQ(status["state"], "finished") << what << ": " << status.dump();
    const auto losses = status["losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), reference.size()) << what;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * std::abs(reference[i])) << what << ", step " << i + 1;
    }
  }

  std::string dir_;
};

TEST_F(HostsTest, ShardsAreCopiedAcrossHostsAndARunSurvivesLosingAHostWithItsDisks) {
  auto up = Strata("up --workers 4 --hosts 2 --heartbeat-timeout-ms 1000 --replace-grace-ms 0");
  ASSERT_EQ(up.rc, 0) << up.err;
  auto workers = json::parse(Strata("workers --json").out);
  ASSERT_EQ(workers.size(), 4u);

  // A run on worker-0 (host-0) and worker-1 (host-1): each checkpoint waits for a copy of each
  // shard on the other host.
  const std::string reference = Submit("reference", " --follow");
  const json ref = Status(reference);
  ASSERT_EQ(ref["state"], "finished") << ref.dump() << Journal(reference);
  const auto losses = ref["losses"].get<std::vector<double>>();
  const std::string journal = Journal(reference);
  EXPECT_NE(journal.find("checkpoint at step 8 committed (2 shards, each with a copy on another host)"),
            std::string::npos)
      << journal;
  auto manifests = json::parse(Strata("checkpoints " + reference + " --json").out);
  ASSERT_FALSE(manifests.empty());

  // Resuming its step-8 checkpoint on the same two workers: each rank reads the other host's
  // shard through that host's store server (the log line counts them).
  const std::string resumed = Submit("resumed", " --resume " + reference + "@8 --follow");
  const json res = Status(resumed);
  ASSERT_EQ(res["state"], "finished") << res.dump() << Journal(resumed);
  const auto resumed_losses = res["losses"].get<std::vector<double>>();
  ASSERT_EQ(resumed_losses.size(), static_cast<size_t>(kSteps));
  for (size_t i = 8; i < resumed_losses.size(); ++i)
    EXPECT_NEAR(resumed_losses[i], losses[i], 1e-5 * std::abs(losses[i])) << "step " << i + 1;
  const std::string log0 = testing::ReadFile(dir_ + "/state/logs/worker-0.log");
  EXPECT_NE(log0.find("(1 of 2 shards through another host's store server)"), std::string::npos)
      << log0.substr(log0.size() > 3000 ? log0.size() - 3000 : 0);

  // Lose host-1 with its disks once the run has a complete checkpoint: kill -9 both of its
  // workers and delete their stores. The run re-plans onto host-0's workers and resumes from the
  // copies there.
  const std::string lost = Submit("lost", "");
  json status;
  for (int i = 0; i < 600; ++i) {
    status = Status(lost);
    const auto steps = status["checkpoint_steps"];
    if (status["state"] != "pending" && !steps.empty() && status["step"].get<int64_t>() >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(status["checkpoint_steps"].empty()) << status.dump();
  for (const char* name : {"worker-1", "worker-3"}) {
    const int pid = Pid(name);
    ASSERT_GT(pid, 0) << name;
    ASSERT_EQ(kill(pid, SIGKILL), 0) << name;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const char* name : {"worker-1", "worker-3"}) fs::remove_all(dir_ + "/state/workers/" + name);
  auto follow = Strata("status " + lost + " --watch");
  const json after = Status(lost);
  ExpectLosses(after, losses, "after losing host-1");
  const std::string lost_journal = Journal(lost);
  EXPECT_NE(lost_journal.find("worker-lost"), std::string::npos) << lost_journal;
  EXPECT_EQ(lost_journal.find("checkpoint-unreadable"), std::string::npos) << lost_journal;
  EXPECT_EQ(after["workers"], json::array({"worker-0", "worker-2"})) << after.dump();

  // The step-4 checkpoint written before the loss still exports: its host-1 shard from the copy.
  auto exported = Strata("export " + lost + " --step 4 --out " + dir_ + "/export");
  EXPECT_EQ(exported.rc, 0) << exported.out << exported.err;
  EXPECT_TRUE(fs::exists(dir_ + "/export/model.safetensors"));
}

}  // namespace
}  // namespace strata
