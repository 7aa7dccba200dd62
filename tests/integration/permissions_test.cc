// Daemons started by hand (not through `strata up`, which makes its state directory 0700) keep
// what they create to their user: a real strata-coordinator and strata-worker, started from a
// process whose umask is the common 022, train a run with checkpoints into fresh directories, and
// nothing under them may be readable, writable or searchable by group or others.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using testing::NowMs;
using testing::ReadFile;

class PermissionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-perm-XXXXXX");
    previous_umask_ = ::umask(022);  // what a login shell usually has: daemons used to inherit it
  }
  void TearDown() override {
    testing::StopDaemons(pids_);
    ::umask(previous_umask_);
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  void Spawn(std::vector<std::string> argv, const std::string& log) {
    const int pid = testing::SpawnDaemon(std::move(argv), log);
    pids_.push_back(pid);
  }
  testing::CommandResult Strata(const std::string& args) {
    return testing::RunStrata("--cluster " + endpoint_ + " " + args, dir_);
  }

  std::string dir_;
  std::string endpoint_;
  mode_t previous_umask_ = 022;
  std::vector<int> pids_;
};

TEST_F(PermissionsTest, HandStartedDaemonsKeepStoresAndCheckpointsPrivate) {
  endpoint_ = "ipc://" + dir_ + "/coordinator.sock";
  Spawn({std::string(STRATA_BIN_DIR) + "/strata-coordinator", "--listen", endpoint_, "--state-dir",
         dir_ + "/coordinator"},
        dir_ + "/coordinator.log");
  Spawn({std::string(STRATA_BIN_DIR) + "/strata-worker", "--name", "worker-0", "--coordinator", endpoint_, "--store",
         dir_ + "/worker-0", "--data-address", "ipc://" + dir_ + "/worker-0.sock"},
        dir_ + "/worker-0.log");
  const int64_t deadline = NowMs() + 60000;
  size_t live = 0;
  while (NowMs() < deadline && live < 1) {
    auto r = Strata("--timeout-ms 500 workers --json");
    if (r.rc == 0) live = json::parse(r.out).size();
    if (live < 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(1u, live) << ReadFile(dir_ + "/coordinator.log") << ReadFile(dir_ + "/worker-0.log");

  const std::string spec = dir_ + "/tiny.toml";
  std::ofstream(spec) << "name = \"tiny\"\n[model]\nlayers = 1\nhidden = 32\nheads = 2\nvocab = 256\nsequence = 16\n"
                      << "[data]\npath = \"" << dir_ << "/corpus.txt\"\n"
                      << "[train]\nsteps = 4\nglobal_batch = 4\nlr = 0.003\nseed = 7\ncheckpoint_every = 2\n";
  auto run = Strata("--timeout-ms 10000 submit --follow " + spec);
  ASSERT_EQ(run.rc, 0) << run.out << run.err << ReadFile(dir_ + "/worker-0.log");
  const std::string id = run.out.substr(0, run.out.find('\n'));
  auto checkpoints = Strata("checkpoints " + id + " --json");
  ASSERT_EQ(checkpoints.rc, 0) << checkpoints.err;
  ASSERT_EQ(json::parse(checkpoints.out).size(), 2u) << checkpoints.out;

  size_t files = 0, dirs = 0;
  for (const std::string& root : {dir_ + "/coordinator", dir_ + "/worker-0"}) {
    ASSERT_TRUE(fs::is_directory(root)) << root;
    std::vector<fs::path> paths{root};
    for (const auto& entry : fs::recursive_directory_iterator(root)) paths.push_back(entry.path());
    for (const auto& path : paths) {
      struct stat st {};
      ASSERT_EQ(0, ::lstat(path.c_str(), &st)) << path;
      if (S_ISLNK(st.st_mode)) continue;
      S_ISDIR(st.st_mode) ? ++dirs : ++files;
      EXPECT_EQ(st.st_mode & 077, 0u) << path << " is mode " << std::oct << (st.st_mode & 0777)
                                      << ": group or others can use it";
    }
  }
  EXPECT_GT(files, 5u) << "the metadata store, the shard store and the checkpoint files";
  EXPECT_GE(dirs, 2u);
}

}  // namespace
}  // namespace strata
