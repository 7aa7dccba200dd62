// Issue #20, "nothing lost, nothing wedged": damaged stores, a full disk and retention, each on a
// local cluster of real processes (`strata up`), checked through the CLI as a user would.
//   - 8 flipped bytes in a worker store's write-ahead log: the worker refuses to start, naming the
//     store and --salvage; salvaged, the checkpoints it lost are "missing-shard", an explicit
//     --resume of one is refused, export refuses it, and a plain resume falls back.
//   - a run record damaged in the coordinator's metadata (under a key with a NUL and an escape
//     sequence): the coordinator refuses to start, printing the key escaped; --salvage keeps the
//     intact runs.
//   - a full disk (a real 64 MiB tmpfs; skipped with the reason where mount is not allowed): the
//     run fails naming the store and its free space, no daemon aborts, cluster.json stays whole,
//     `strata down` stops everything.
//   - `strata down` with cluster.json emptied still stops the state directory's daemons.
//   - train.keep_checkpoints = 2: older checkpoints leave the listing and the store's disk.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using testing::CommandResult;

class DamageTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeClusterScratchDir("/tmp/strata-damage-XXXXXX"); }
  void TearDown() override {
    Strata("down");
    if (!mounted_.empty()) ::umount2(mounted_.c_str(), MNT_DETACH);
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  CommandResult Strata(const std::string& args) {
    return testing::RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args, dir_);
  }
  json StrataJson(const std::string& args) { return testing::RunStrataJson(args, dir_); }
  // A real 64 MiB tmpfs at `state` (unmounted at teardown): "" once mounted, else why not.
  std::string MountSmallDisk(const std::string& state) {
    fs::create_directories(state);
    if (::mount("tmpfs", state.c_str(), "tmpfs", 0, "size=64m,mode=0700") != 0) {
      return "cannot mount a 64 MiB tmpfs at " + state + " (" + std::strerror(errno) +
             "); this test needs root or CAP_SYS_ADMIN to make a real small filesystem";
    }
    mounted_ = state;
    return "";
  }
  // The events of `run` once one of kind `kind` is there (up to 60 s), else all of them.
  json EventsOnceThereIs(const std::string& run, const std::string& kind, const std::string& context = "") {
    json events;
    for (int i = 0; i < 600; ++i) {
      events = StrataJson("events " + run);
      for (const auto& e : events) {
        if (e["kind"] == kind) return events;
      }
      ::usleep(100000);
    }
    std::string log;
    if (std::ifstream in(dir_ + "/state/logs/worker-0.log"); in) log.assign(std::istreambuf_iterator<char>(in), {});
    ADD_FAILURE() << "no " << kind << " event for " << run << ": " << events.dump() << "\n"
                  << StrataJson("status " + run).dump() << context << "\nworker-0.log ends:\n"
                  << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
    return events;
  }
  std::string WriteSpec(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    return path;
  }
  static std::string Spec(const std::string& name, int steps, int checkpoint_every, const std::string& extra_train = "",
                          int hidden = 64, int layers = 2) {
    std::ostringstream s;
    s << "name = \"" << name << "\"\n"
      << "[model]\nlayers = " << layers << "\nhidden = " << hidden << "\nheads = 4\nvocab = 256\nsequence = 32\n"
      << "[data]\npath = \"corpus.txt\"\n"
      << "[train]\nsteps = " << steps
      << "\nglobal_batch = 8\nlr = 0.003\nseed = 7\ncheckpoint_every = " << checkpoint_every << "\n"
      << extra_train
      // Every checkpoint kept unless the test says otherwise: the listings are what is checked.
      << (extra_train.find("keep_checkpoints") == std::string::npos ? "keep_checkpoints = 0\n" : "")
      << "[parallel]\ndp = 1\npp = 1\ntp = 1\nzero = 0\nmicro_batch = 0\nrecompute = false\n";
    return s.str();
  }
  std::string SubmitAndFollow(const std::string& name, const std::string& body) {
    auto r = Strata("submit " + WriteSpec(name, body) + " --follow");
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    return r.out.substr(0, r.out.find('\n'));
  }
  std::vector<int> ClusterPids() {
    std::vector<int> pids;
    try {
      const json cluster = json::parse(testing::ReadFile(dir_ + "/state/cluster.json"));
      for (const auto& p : cluster["processes"]) pids.push_back(p["pid"].get<int>());
    } catch (const std::exception&) {
    }
    return pids;
  }

  std::string dir_;
  std::string mounted_;
};

// Each of `pids` (daemons `strata up` started, reaped by init) is gone within `ms`.
void ExpectAllExitWithin(const std::vector<int>& pids, int ms) {
  for (int pid : pids) {
    bool gone = false;
    for (int waited = 0; waited < ms && !gone; waited += 100) {
      gone = ::kill(pid, 0) != 0;
      if (!gone) ::usleep(100000);
    }
    EXPECT_TRUE(gone) << "daemon " << pid << " still runs after `strata down`";
  }
}

// Flips `count` bytes in the middle of the largest write-ahead log of the store at `store`.
void FlipBytesInTheLog(const std::string& store, int count) {
  std::string log;
  for (const auto& entry : fs::directory_iterator(store)) {
    if (entry.path().extension() == ".log" && (log.empty() || entry.file_size() > fs::file_size(log)))
      log = entry.path().string();
  }
  ASSERT_FALSE(log.empty()) << "no write-ahead log in " << store;
  const auto size = fs::file_size(log);
  ASSERT_GT(size, 4096u) << log;
  std::fstream file(log, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(size / 2));
  for (int i = 0; i < count; ++i) file.put('\x5a');
}

TEST_F(DamageTest, DamagedWorkerLogStopsTheWorkerAndSalvageMarksWhatItLost) {
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  const std::string source = SubmitAndFollow("wal", Spec("wal", 8, 2));
  const json before = StrataJson("checkpoints " + source);
  ASSERT_EQ(before.size(), 4u) << before.dump();
  for (const auto& c : before) EXPECT_EQ(c["state"], "complete");
  const std::string store = before.back()["shards"][0]["store_path"];
  ASSERT_EQ(Strata("down").rc, 0);
  FlipBytesInTheLog(store, 8);

  // The worker does not start on a damaged store: nothing is dropped without a word.
  auto refused = Strata("up --workers 1");
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.err.find(store), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--salvage"), std::string::npos) << refused.err;
  ASSERT_EQ(Strata("down").rc, 0);

  ASSERT_EQ(Strata("up --workers 1 --salvage").rc, 0);
  const json after = StrataJson("checkpoints " + source);
  ASSERT_EQ(after.size(), 4u) << "a checkpoint vanished from the listing instead of being marked: " << after.dump();
  EXPECT_EQ(after.back()["state"], "missing-shard") << after.dump();
  const std::string why = after.back().value("why", "");
  EXPECT_NE(why.find("worker-0"), std::string::npos) << why;
  EXPECT_NE(why.find("step 8"), std::string::npos) << why;
  int64_t newest_complete = 0;
  for (const auto& c : after) {
    if (c["state"] == "complete") newest_complete = c["step"];
  }
  bool told = false;
  for (const auto& e : StrataJson("events " + source)) {
    told = told || (e["kind"] == "checkpoint-unreadable" &&
                    e["message"].get<std::string>().find("step 8") != std::string::npos);
  }
  EXPECT_TRUE(told) << "no checkpoint-unreadable event names step 8";

  // An explicit resume of the lost step and its export are refused, naming why.
  auto explicit_resume = Strata("submit " + WriteSpec("again", Spec("again", 10, 0)) + " --resume " + source + "@8");
  EXPECT_EQ(explicit_resume.rc, 2) << explicit_resume.out << explicit_resume.err;
  EXPECT_NE(explicit_resume.err.find("unreadable"), std::string::npos) << explicit_resume.err;
  auto exported = Strata("export " + source + " --step 8 --out " + dir_ + "/export8");
  EXPECT_NE(exported.rc, 0);
  EXPECT_NE(exported.err.find("missing-shard"), std::string::npos) << exported.err;

  // A plain resume starts from the newest checkpoint still whole and gives the source's losses.
  auto resumed = Strata("submit " + WriteSpec("resumed", Spec("resumed", 10, 0)) + " --resume " + source + " --follow");
  ASSERT_EQ(resumed.rc, 0) << resumed.out << resumed.err;
  const std::string resumed_id = resumed.out.substr(0, resumed.out.find('\n'));
  const auto source_losses = StrataJson("status " + source)["losses"].get<std::vector<double>>();
  const auto resumed_losses = StrataJson("status " + resumed_id)["losses"].get<std::vector<double>>();
  ASSERT_EQ(resumed_losses.size(), 10u);
  for (size_t i = 0; i < source_losses.size(); ++i) {
    EXPECT_NEAR(resumed_losses[i], source_losses[i], 1e-5 * std::abs(source_losses[i])) << "step " << i + 1;
  }
  bool from_older = false;
  for (const auto& e : StrataJson("events " + resumed_id)) {
    from_older = from_older || e["message"].get<std::string>().find("at step " + std::to_string(newest_complete)) !=
                                   std::string::npos;
  }
  EXPECT_TRUE(from_older || newest_complete == 0) << "the resume did not start from step " << newest_complete;
}

TEST_F(DamageTest, DamagedCoordinatorRecordStopsItAndSalvageKeepsTheIntactRuns) {
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  const std::string first = SubmitAndFollow("first", Spec("first", 2, 0));
  const std::string second = SubmitAndFollow("second", Spec("second", 2, 0));
  ASSERT_EQ(Strata("down").rc, 0);
  const std::string metadata = dir_ + "/state/coordinator/metadata";
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const char* name : {"default", "checkpoints", "activations", "metadata"})
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), metadata, families, &handles, &raw).ok()) << metadata;
    // A record that does not decode, under a key holding a NUL and a terminal escape.
    EXPECT_TRUE(
        raw->Put(rocksdb::WriteOptions(), handles[3], std::string("run/bad\0\x1b[31mred", 16), "not a record").ok());
    for (auto* h : handles) raw->DestroyColumnFamilyHandle(h);
    EXPECT_TRUE(raw->Close().ok());
    delete raw;
  }
  auto refused = Strata("up --workers 1");
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.err.find(metadata), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("run/bad\\x00\\x1b[31mred"), std::string::npos)
      << "the key is cut or printed raw: " << refused.err;
  EXPECT_NE(refused.err.find("--salvage"), std::string::npos) << refused.err;
  ASSERT_EQ(Strata("down").rc, 0);

  ASSERT_EQ(Strata("up --workers 1 --salvage").rc, 0);
  const json runs = StrataJson("status");
  std::vector<std::string> ids;
  for (const auto& r : runs) ids.push_back(r["run_id"]);
  EXPECT_NE(std::find(ids.begin(), ids.end(), first), ids.end()) << runs.dump();
  EXPECT_NE(std::find(ids.begin(), ids.end(), second), ids.end()) << runs.dump();
  EXPECT_EQ(StrataJson("status " + second)["state"], "finished");
}

TEST_F(DamageTest, AFullDiskPausesTheSaveNamingTheStoreAndNoDaemonAborts) {
  const std::string state = dir_ + "/state";
  if (const std::string why = MountSmallDisk(state); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  const std::vector<int> pids = ClusterPids();
  ASSERT_EQ(pids.size(), 2u);
  // ~3.3M parameters: each checkpoint (weights and both AdamW moments) is about 38 MiB, so the
  // second does not fit next to the first on a 64 MiB disk that keeps 16 MiB in reserve.
  auto r = Strata("submit " + WriteSpec("full", Spec("full", 6, 1, "", 256, 4)));
  ASSERT_EQ(r.rc, 0) << r.err;
  // One checkpoint fits, the six it keeps (keep_checkpoints = 0) do not: submit said so.
  EXPECT_NE(r.err.find("warning: worker-0's store at " + state + "/workers/worker-0 takes one checkpoint"),
            std::string::npos)
      << r.err;
  const std::string run = r.out.substr(0, r.out.find('\n'));
  // The second save waits for room instead of failing the run and losing its state.
  std::string paused;
  for (const auto& e : EventsOnceThereIs(run, "save-paused", StrataJson("status " + run).dump())) {
    if (e["kind"] == "save-paused") paused = e["message"];
  }
  EXPECT_NE(paused.find(state + "/workers/worker-0"), std::string::npos) << paused;
  EXPECT_NE(paused.find("is full"), std::string::npos) << paused;
  EXPECT_NE(paused.find("MiB free"), std::string::npos) << paused;
  EXPECT_EQ(StrataJson("status " + run)["state"], "running");
  for (int pid : pids) EXPECT_EQ(::kill(pid, 0), 0) << "daemon " << pid << " died on the full disk";
  // Cancel still stops it.
  EXPECT_EQ(Strata("cancel " + run).rc, 0);
  json status = json::object();
  for (int i = 0; i < 300 && status.value("state", "") != "cancelled"; ++i) {
    ::usleep(100000);
    status = StrataJson("status " + run);
  }
  EXPECT_EQ(status["state"], "cancelled") << status.dump();

  // The disk filled to the last byte: `up` changes nothing it cannot write whole, and `down`
  // stops everything.
  {
    std::ofstream filler(state + "/filler", std::ios::binary);
    std::vector<char> block(1 << 20, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
  }
  Strata("up --workers 1");
  const json cluster = json::parse(testing::ReadFile(state + "/cluster.json"));
  EXPECT_EQ(cluster["processes"].size(), 2u) << cluster.dump();
  for (int pid : pids) EXPECT_EQ(::kill(pid, 0), 0) << "daemon " << pid << " died on the full disk";
  auto down = Strata("down");
  EXPECT_EQ(down.rc, 0) << down.err;
  ExpectAllExitWithin(pids, 5000);
}

// Size before you start: a run whose one checkpoint the store's disk cannot take is refused at
// submit, naming the store, what the checkpoint needs and what is free - not after it trained.
TEST_F(DamageTest, ACheckpointLargerThanTheStoresDiskIsRefusedAtSubmit) {
  const std::string state = dir_ + "/state";
  if (const std::string why = MountSmallDisk(state); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  // ~12.7M parameters: one checkpoint (weights and both AdamW moments, fp32) is ~146 MiB, three
  // times the 48 MiB a 64 MiB disk leaves beyond its 16 MiB reserve.
  auto r = Strata("submit " + WriteSpec("huge", Spec("huge", 4, 2, "", 512, 4)));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(
      r.err.find("one checkpoint of this run needs 0.14 GiB in worker-0's store at " + state + "/workers/worker-0"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("GiB free beyond what the store keeps in reserve"), std::string::npos) << r.err;
  EXPECT_EQ(StrataJson("status").size(), 0u) << "nothing was submitted";
  // The same run with the check waived is accepted, and its first save waits for room, naming the
  // disk; cancel stops it.
  auto waived = Strata("submit " + WriteSpec("huge2", Spec("huge2", 4, 2, "", 512, 4)) + " --skip-estimate");
  ASSERT_EQ(waived.rc, 0) << waived.err;
  EXPECT_NE(waived.err.find("submitting anyway (--skip-estimate): one checkpoint of this run needs"), std::string::npos)
      << waived.err;
  const std::string run = waived.out.substr(0, waived.out.find('\n'));
  EventsOnceThereIs(run, "save-paused");
  EXPECT_EQ(Strata("cancel " + run).rc, 0);
  ASSERT_EQ(Strata("down").rc, 0);
}

// The same for a capture: an extract run whose records the store's disk cannot hold is refused at
// submit, naming the store, the capture's size and the shortfall.
TEST_F(DamageTest, ACaptureLargerThanTheStoresDiskIsRefusedAtSubmit) {
  const std::string state = dir_ + "/state";
  if (const std::string why = MountSmallDisk(state); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  // Three fp32 sites of width 512 at two layers: 12 KiB a row, over every row of the corpus -
  // several times the 48 MiB the disk leaves beyond its reserve.
  const std::string body =
      "name = \"big-capture\"\nkind = \"extract\"\n"
      "[model]\nlayers = 2\nhidden = 512\nheads = 4\nvocab = 256\nsequence = 32\n"
      "[data]\npath = \"corpus.txt\"\n"
      "[extract]\nsites = [\"resid_post\", \"attn_out\", \"mlp_out\"]\n";
  auto r = Strata("submit " + WriteSpec("big-capture", body));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.err.find("not submitted: this capture writes about"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("go to worker-0's store at " + state + "/workers/worker-0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("GiB short"), std::string::npos) << r.err;
  EXPECT_EQ(StrataJson("status").size(), 0u) << "nothing was submitted";
  // A capture that fits (one layer, one site, 64 wide: 256 bytes a row) is accepted and stored.
  const std::string small =
      "name = \"small-capture\"\nkind = \"extract\"\n"
      "[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nsequence = 32\n"
      "[data]\npath = \"corpus.txt\"\n[extract]\nlayers = [1]\n";
  auto ok = Strata("submit " + WriteSpec("small-capture", small) + " --follow");
  EXPECT_EQ(ok.rc, 0) << ok.err;
  ASSERT_EQ(Strata("down").rc, 0);
}

// A disk filled between two saves pauses the save, not the run; once space is freed the save is
// written and the run finishes with the losses of a run that never waited.
TEST_F(DamageTest, ASaveThatMeetsAFullDiskWaitsAndTheRunFinishesOnceThereIsRoom) {
  const std::string state = dir_ + "/state";
  if (const std::string why = MountSmallDisk(state); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  // ~0.8M parameters, ~9 MiB a checkpoint; one kept.
  const std::string body = Spec("waits", 9, 3, "keep_checkpoints = 1\n", 128, 4);
  const std::string reference = SubmitAndFollow("reference", body);
  const auto expected = StrataJson("status " + reference)["losses"].get<std::vector<double>>();
  ASSERT_EQ(expected.size(), 9u);
  // Leave the store 4 MiB beyond its reserve: the next checkpoint does not fit.
  struct statvfs fs_info {};
  ASSERT_EQ(::statvfs(state.c_str(), &fs_info), 0);
  const uint64_t free_bytes = static_cast<uint64_t>(fs_info.f_bavail) * fs_info.f_frsize;
  const uint64_t reserve = uint64_t{16} << 20;  // 5% of 64 MiB is under the store's 16 MiB floor
  ASSERT_GT(free_bytes, reserve + (uint64_t{4} << 20));
  {
    std::ofstream filler(state + "/filler", std::ios::binary);
    std::vector<char> block(1 << 20, 'x');
    for (uint64_t left = free_bytes - reserve - (uint64_t{4} << 20); left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, block.size());
      filler.write(block.data(), static_cast<std::streamsize>(n));
      left -= n;
    }
  }
  // The filler stands in for a disk that fills after the run was accepted: once a heartbeat has
  // reported it, submit's size check rightly refuses the run (the test above), so the check is
  // waived here; whether it has been reported yet is a race.
  auto r = Strata("submit " + WriteSpec("waits", body) + " --skip-estimate");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string run = r.out.substr(0, r.out.find('\n'));
  EventsOnceThereIs(run, "save-paused");
  // The run shows the wait, naming the worker and its disk, in status and its JSON.
  const json waiting = StrataJson("status " + run)["saves_waiting_for_disk"];
  ASSERT_EQ(waiting.size(), 1u) << waiting.dump();
  EXPECT_EQ(waiting[0]["worker"], "worker-0") << waiting.dump();
  EXPECT_NE(waiting[0]["message"].get<std::string>().find(state + "/workers/worker-0"), std::string::npos)
      << waiting.dump();
  const auto text = Strata("status " + run);
  EXPECT_NE(text.out.find("saving paused: worker-0: the checkpoint of step"), std::string::npos) << text.out;
  // Training went on meanwhile: every step is done, and the run waits only for its saves.
  json status = json::object();
  for (int i = 0; i < 100 && status.value("step", 0) < 9; ++i) {
    ::usleep(100000);
    status = StrataJson("status " + run);
  }
  EXPECT_EQ(status["step"], 9) << status.dump();
  EXPECT_EQ(status["state"], "running") << status.dump();
  fs::remove(state + "/filler");
  for (int i = 0; i < 600 && status.value("state", "") == "running"; ++i) {
    ::usleep(100000);
    status = StrataJson("status " + run);
  }
  ASSERT_EQ(status["state"], "finished") << status.dump();
  EXPECT_EQ(status["losses"].get<std::vector<double>>(), expected) << "the wait changed the training";
  EXPECT_EQ(status["checkpoint_steps"].back(), 9) << status.dump();
  int resumed = 0;
  for (const auto& e : StrataJson("events " + run)) resumed += e["kind"] == "save-resumed";
  EXPECT_GE(resumed, 1);
  ASSERT_EQ(Strata("down").rc, 0);
}

// An older `up` on a full disk left cluster.json empty, after which `down` refused and the
// daemons ran on unmanaged: `down` now finds them by their command lines.
TEST_F(DamageTest, DownStopsTheDaemonsOfAStateDirWhoseClusterJsonIsGone) {
  ASSERT_EQ(Strata("up --workers 2").rc, 0);
  const std::vector<int> pids = ClusterPids();
  ASSERT_EQ(pids.size(), 3u);
  { std::ofstream truncate(dir_ + "/state/cluster.json", std::ios::trunc); }
  auto down = Strata("down");
  EXPECT_EQ(down.rc, 0) << down.err;
  EXPECT_NE(down.err.find("3 process(es)"), std::string::npos) << down.err;
  ExpectAllExitWithin(pids, 5000);
}

TEST_F(DamageTest, KeepCheckpointsDeletesOlderOnesFromTheListingAndTheDisk) {
  ASSERT_EQ(Strata("up --workers 1").rc, 0);
  const std::string run = SubmitAndFollow("kept", Spec("kept", 10, 2, "keep_checkpoints = 2\n"));
  const json listed = StrataJson("checkpoints " + run);
  std::vector<int64_t> steps;
  for (const auto& c : listed) steps.push_back(c["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{8, 10}));
  const std::string store = listed.back()["shards"][0]["store_path"];
  std::vector<std::string> data_steps;
  // The last deletion reaches the worker just after the run ends.
  for (int attempt = 0; attempt < 50; ++attempt) {
    data_steps.clear();
    for (const auto& entry : fs::recursive_directory_iterator(store + "/checkpoints")) {
      if (entry.path().extension() == ".bin") data_steps.push_back(entry.path().filename().string().substr(0, 2));
    }
    std::sort(data_steps.begin(), data_steps.end());
    if (data_steps.size() <= 2) break;
    ::usleep(100000);
  }
  EXPECT_EQ(data_steps, (std::vector<std::string>{"10", "8-"})) << "older checkpoints' data files are still on disk";
  int deleted = 0;
  for (const auto& e : StrataJson("events " + run)) deleted += e["kind"] == "checkpoint-deleted";
  EXPECT_EQ(deleted, 3);
  // What is kept still resumes.
  auto resumed = Strata("submit " + WriteSpec("more", Spec("more", 12, 0)) + " --resume " + run + "@8 --follow");
  EXPECT_EQ(resumed.rc, 0) << resumed.out << resumed.err;
}

}  // namespace
}  // namespace strata
