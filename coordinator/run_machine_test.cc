// The train-run state machine, table-driven, with a fake clock and no sockets: each case drives a
// CoordinatorCore (the coordinator without its socket, over a real RocksDB journal) with the
// messages workers would send, moves time, and checks the phase the run ends in, the journal's
// events and what the workers were told.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "coordinator/core.h"

namespace strata::coordinator {
namespace {

class RecordingOutbox : public Outbox {
 public:
  void Send(const std::string& identity, const std::string& bytes) override { sent.emplace_back(identity, bytes); }
  std::vector<std::pair<std::string, std::string>> sent;
};

struct Assignment {
  uint32_t rank = 0;
  uint64_t token = 0;
  bool resumes = false;
  int64_t resume_step = 0;
};

// One cluster under test. Workers named in alive_ heartbeat as time moves; the others go silent.
class Harness {
 public:
  explicit Harness(const std::string& dir) : dir_(dir) {
    options_.state_dir = dir + "/state";
    options_.heartbeat_timeout_ms = 2000;
    options_.replace_grace_ms = 10000;
    options_.snapshot_timeout_ms = 60000;
    options_.stall_window_ms = 3000;
    options_.grow_back_min_saving_s = 0;
    std::filesystem::create_directories(options_.state_dir);
    std::ofstream(dir + "/corpus.txt") << std::string(10000, 'x');
    auto store = storage::ShardStore::Open(options_.state_dir + "/metadata", {});
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    core_ = std::make_unique<CoordinatorCore>(options_, clock_, std::move(store).value(), outbox_, [] {});
    EXPECT_TRUE(core_->Load().ok());
  }

  std::string Spec(int dp, int global_batch, int steps = 100) const {
    return "name = \"t\"\n[model]\nhidden = 32\nheads = 2\nsequence = 16\n[data]\npath = \"" + dir_ +
           "/corpus.txt\"\n[train]\nsteps = " + std::to_string(steps) +
           "\nglobal_batch = " + std::to_string(global_batch) +
           "\ncheckpoint_every = 2\n[parallel]\ndp = " + std::to_string(dp) + "\npp = 1\ntp = 1\n";
  }

  void Deliver(const std::string& identity, schema::EnvelopeBuilder& msg) {
    const std::string bytes = msg.Serialize();
    auto decoded = schema::DecodeEnvelope({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    ASSERT_TRUE(decoded.ok());
    core_->Dispatch(identity, (*decoded)->root());
  }

  void Register(const std::string& name) {
    schema::EnvelopeBuilder reg(1);
    auto r = reg.root().initRegisterWorker();
    r.setName(name);
    r.setPid(1000 + static_cast<uint32_t>(name.back()));
    r.setHost("host");
    r.setStorePath(dir_ + "/" + name + "-store");
    auto memory = r.initMemory();
    memory.setDevice("cpu");
    memory.setTotalBytes(uint64_t{8} << 30);
    memory.setFreeBytes(uint64_t{6} << 30);
    Deliver(name, reg);
    alive_.insert(name);
  }

  std::string Submit(const std::string& spec) {
    schema::EnvelopeBuilder submit(7);
    submit.root().initSubmitRun().setSpecToml(spec);
    Deliver("client", submit);
    for (auto& [identity, bytes] : outbox_.sent) {
      auto env = Decode(bytes);
      if (identity == "client" && env->root().which() == Envelope::SUBMITTED)
        return env->root().getSubmitted().getRunId().cStr();
    }
    ADD_FAILURE() << "no Submitted reply";
    return "";
  }

  // The AssignTasks of `run` sent since the last call, by worker.
  std::map<std::string, Assignment> NewAssignments(const std::string& run) {
    std::map<std::string, Assignment> out;
    for (; seen_ < outbox_.sent.size(); ++seen_) {
      auto env = Decode(outbox_.sent[seen_].second);
      if (env->root().which() != Envelope::ASSIGN_TASK) continue;
      auto a = env->root().getAssignTask();
      if (std::string(a.getRunId().cStr()) != run) continue;
      out[outbox_.sent[seen_].first] = {a.getRank(), a.getTaskToken(), a.hasResumeFrom(),
                                        a.hasResumeFrom() ? a.getResumeFrom().getStep() : 0};
      tokens_[outbox_.sent[seen_].first] = {a.getRank(), a.getTaskToken()};
    }
    return out;
  }

  // A task event from `worker` about `run`, with the rank and token of its latest assignment.
  void Report(const std::string& worker, const std::string& run, const std::function<void(TaskEvent::Builder)>& fill) {
    schema::EnvelopeBuilder msg;
    auto ev = msg.root().initTaskEvent();
    ev.setRunId(run);
    ev.setRank(tokens_[worker].first);
    ev.setTaskToken(tokens_[worker].second);
    fill(ev);
    Deliver(worker, msg);
  }
  void Step(const std::string& worker, const std::string& run, int64_t step) {
    Report(worker, run, [&](TaskEvent::Builder ev) {
      auto s = ev.initStep();
      s.setStep(step);
      s.setLoss(5.0 - 0.01 * static_cast<double>(step));
      s.setTokensPerSecond(100);
    });
  }
  void Checkpoint(const std::string& worker, const std::string& run, int64_t step) {
    Report(worker, run, [&](TaskEvent::Builder ev) {
      auto shard = ev.initCheckpointSaved();
      shard.setStep(step);
      shard.setStorePath(dir_ + "/" + worker + "-store");
      shard.initTensors(1)[0].setName("param/h.0.ln_1.weight@tp=0/1@[0,8)@8");
    });
  }
  void UnknownStall(const std::string& worker, const std::string& run) {
    Report(worker, run, [&](TaskEvent::Builder ev) {
      auto st = ev.initStalled();
      st.setRankKnown(false);
      st.setDetail("an all-reduce has not finished");
    });
  }
  void OutOfMemory(const std::string& worker, const std::string& run, int64_t step, int64_t micro_batch,
                   int64_t intact_step) {
    Report(worker, run, [&](TaskEvent::Builder ev) {
      auto o = ev.initOutOfMemory();
      o.setStep(step);
      o.setMicroBatch(micro_batch);
      o.setIntactStep(intact_step);
      o.setDetail("CUDA out of memory");
      o.setFreeBytes(uint64_t{1} << 20);
      o.setTotalBytes(uint64_t{8} << 30);
    });
  }

  // Moves time by `ms` in heartbeat-sized ticks; live workers heartbeat at every tick.
  void Advance(int64_t ms) {
    for (int64_t done = 0; done < ms; done += 100) {
      clock_.Advance(std::min<int64_t>(100, ms - done));
      for (const std::string& name : alive_) {
        schema::EnvelopeBuilder msg;
        auto hb = msg.root().initHeartbeat();
        hb.setWorkerId(name);
        auto memory = hb.initMemory();
        memory.setDevice("cpu");
        memory.setTotalBytes(uint64_t{8} << 30);
        memory.setFreeBytes(uint64_t{6} << 30);
        Deliver(name, msg);
      }
      core_->RunDueTimers();
    }
  }
  void Silence(const std::string& name) { alive_.erase(name); }

  RunEntry& Run(const std::string& id) { return core_->cluster().runs.at(id); }
  WorkerState StateOf(const std::string& worker) { return core_->cluster().workers.Find(worker)->state; }
  std::vector<std::string> Events(const std::string& run) {
    std::vector<std::string> kinds;
    auto records = core_->journal().store().ScanMetadata(keys::EventPrefix(run));
    EXPECT_TRUE(records.ok());
    for (auto& [key, value] : *records)
      kinds.push_back(schema::DecodedRecord<::Event>::Decode(value)->root().getKind().cStr());
    return kinds;
  }
  const CoordinatorOptions& options() const { return options_; }
  Journal& journal() { return core_->journal(); }

 private:
  static std::unique_ptr<schema::DecodedEnvelope> Decode(const std::string& bytes) {
    auto env = schema::DecodeEnvelope({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    EXPECT_TRUE(env.ok());
    return std::move(env).value();
  }

  std::string dir_;
  CoordinatorOptions options_;
  FakeClock clock_;
  RecordingOutbox outbox_;
  std::unique_ptr<CoordinatorCore> core_;
  std::set<std::string> alive_;
  size_t seen_ = 0;
  std::map<std::string, std::pair<uint32_t, uint64_t>> tokens_;
};

// Starts a dp-wide run on workers w0..w(n-1) and has every rank report steps 1-2 and the
// checkpoint at step 2, which commits it.
std::string RunWithCheckpoint(Harness& h, int workers, int dp, int global_batch) {
  for (int i = 0; i < workers; ++i) h.Register("w" + std::to_string(i));
  const std::string run = h.Submit(h.Spec(dp, global_batch));
  const auto assigned = h.NewAssignments(run);
  EXPECT_EQ(assigned.size(), static_cast<size_t>(dp));
  for (const auto& [w, a] : assigned) {
    h.Step(w, run, 1);
    h.Step(w, run, 2);
    h.Checkpoint(w, run, 2);
  }
  EXPECT_EQ(h.journal().LastCheckpointStep(run), 2);
  return run;
}

// The worker holding `rank` in the run's current assignment.
std::string WorkerOfRank(Harness& h, const std::string& run, uint32_t rank) { return h.Run(run).workers.at(rank); }

struct Case {
  const char* name;
  // Drives the harness; returns the run it is about.
  std::function<std::string(Harness&)> script;
  Phase phase;                      // where the run ends
  std::vector<std::string> events;  // a subsequence of its journal's event kinds
  std::function<void(Harness&, const std::string& run)> check = nullptr;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

bool IsSubsequence(const std::vector<std::string>& want, const std::vector<std::string>& have) {
  size_t i = 0;
  for (const std::string& kind : have) i += i < want.size() && kind == want[i];
  return i == want.size();
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

const Case kCases[] = {
    {"WorkerLostDuringTheSnapshotWaitReplaysFromTheLatestCheckpoint",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 2, 2, 4);
       const std::string w0 = WorkerOfRank(h, run, 0), w1 = WorkerOfRank(h, run, 1);
       h.Step(w0, run, 3);
       h.OutOfMemory(w0, run, 4, 2, /*intact_step=*/3);  // step 3's state can be saved: wait for it
       EXPECT_EQ(h.Run(run).phase, Phase::kAwaitingSnapshot);
       h.Checkpoint(w0, run, 3);  // one of two snapshot shards; then w1 dies
       h.Silence(w1);
       h.Advance(h.options().heartbeat_timeout_ms + 500);
       EXPECT_EQ(h.StateOf(w1), WorkerState::LOST);
       EXPECT_EQ(h.Run(run).phase, Phase::kAwaitingSnapshot);  // the lost worker was no longer the run's
       h.Advance(h.options().snapshot_timeout_ms);
       return run;
     },
     Phase::kQueued,
     {"oom", "replanned", "snapshot", "snapshot"},
     [](Harness& h, const std::string& run) {
       EXPECT_EQ(h.Run(run).step, 2);  // the snapshot never completed: from the checkpoint at 2
       EXPECT_EQ(h.journal().LastCheckpointStep(run), 2);
       EXPECT_TRUE(h.Run(run).workers.empty());  // one live worker, the mesh wants two: it waits
     }},
    {"SnapshotCompletedReplaysFromIt",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 2, 2, 4);
       const std::string w0 = WorkerOfRank(h, run, 0), w1 = WorkerOfRank(h, run, 1);
       h.OutOfMemory(w0, run, 4, 2, 3);
       h.Checkpoint(w0, run, 3);
       h.Checkpoint(w1, run, 3);
       return run;
     },
     Phase::kRunning,
     {"oom", "replanned", "snapshot", "checkpoint", "assigned"},
     [](Harness& h, const std::string& run) {
       const auto assigned = h.NewAssignments(run);
       ASSERT_EQ(assigned.size(), 2u);
       for (const auto& [w, a] : assigned) EXPECT_EQ(a.resume_step, 3);
     }},
    {"StallWindowClosingBlamesTheSilentRank",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 3, 3, 6);
       h.UnknownStall(WorkerOfRank(h, run, 0), run);
       h.UnknownStall(WorkerOfRank(h, run, 1), run);
       EXPECT_EQ(h.Run(run).phase, Phase::kStallWindow);
       h.Advance(h.options().stall_window_ms - 200);
       EXPECT_EQ(h.Run(run).phase, Phase::kStallWindow);  // not before the window closes
       h.Advance(400);
       EXPECT_EQ(h.StateOf("w2"), WorkerState::LOST);
       return run;
     },
     Phase::kRecovering,
     {"stalled", "worker-lost", "recovering"}},
    {"EveryRankStalledStartsAgainOnTheSameWorkers",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 2, 2, 4);
       h.UnknownStall("w0", run);
       h.UnknownStall("w1", run);
       return run;
     },
     Phase::kRunning,
     {"stalled", "recovering", "assigned"},
     [](Harness& h, const std::string& run) {
       EXPECT_EQ(h.StateOf("w0"), WorkerState::BUSY);
       EXPECT_EQ(h.StateOf("w1"), WorkerState::BUSY);
       for (const auto& [w, a] : h.NewAssignments(run)) EXPECT_EQ(a.resume_step, 2);
     }},
    {"GraceOverReplansOntoTheWorkersPresentThenGrowsBack",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 3, 3, 6);
       h.Silence("w2");
       h.Advance(h.options().heartbeat_timeout_ms + 500);
       EXPECT_EQ(h.Run(run).phase, Phase::kRecovering);
       h.NewAssignments(run);
       h.Advance(h.options().replace_grace_ms);
       EXPECT_EQ(h.Run(run).phase, Phase::kRunning);
       EXPECT_EQ(h.Run(run).spec.parallel.dp, 2);  // 6 % 2 == 0: the largest dp two workers hold
       EXPECT_EQ(h.Run(run).grow_back_to_dp, 3);
       const auto shrunk = h.NewAssignments(run);
       EXPECT_EQ(shrunk.size(), 2u);
       h.Register("w2");  // back, idle: the next complete checkpoint grows the run back
       for (const auto& [w, a] : shrunk) {
         h.Step(w, run, 3);
         h.Step(w, run, 4);
         h.Checkpoint(w, run, 4);
       }
       return run;
     },
     Phase::kRunning,
     {"worker-lost", "recovering", "replanned", "assigned", "checkpoint", "grew", "assigned"},
     [](Harness& h, const std::string& run) {
       EXPECT_EQ(h.Run(run).spec.parallel.dp, 3);
       EXPECT_EQ(h.Run(run).grow_back_to_dp, 0);
       const auto grown = h.NewAssignments(run);
       ASSERT_EQ(grown.size(), 3u);
       for (const auto& [w, a] : grown) EXPECT_EQ(a.resume_step, 4);
     }},
    {"UnreadableCheckpointRestartsFromAnOlderOne",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 2, 1, 2);
       const std::string w0 = WorkerOfRank(h, run, 0);
       h.Silence(w0);
       h.Advance(h.options().heartbeat_timeout_ms + 500);
       h.NewAssignments(run);
       h.Advance(h.options().replace_grace_ms);  // resumes on the other worker from step 2
       const auto resumed = h.NewAssignments(run);
       EXPECT_EQ(resumed.size(), 1u);
       EXPECT_EQ(resumed.begin()->second.resume_step, 2);
       h.Report(resumed.begin()->first, run, [&](TaskEvent::Builder ev) {
         auto u = ev.initCheckpointUnreadable();
         u.setSourceRun(run);
         u.setStep(2);
         u.setWhy("a record fails its checksum");
       });
       return run;
     },
     Phase::kRunning,
     {"worker-lost", "recovering", "assigned", "checkpoint-unreadable", "assigned"},
     [](Harness& h, const std::string& run) {
       EXPECT_TRUE(h.journal().Unreadable(run, 2));
       EXPECT_EQ(h.Run(run).step, 0);
       const auto fresh = h.NewAssignments(run);
       ASSERT_EQ(fresh.size(), 1u);
       EXPECT_FALSE(fresh.begin()->second.resumes);  // no older checkpoint: from step 0
     }},
    {"OutOfMemoryFromTheStoppedAttemptDuringRecoveryChangesNothing",
     [](Harness& h) {
       const std::string run = RunWithCheckpoint(h, 2, 2, 4);
       const std::string w0 = WorkerOfRank(h, run, 0), w1 = WorkerOfRank(h, run, 1);
       h.Silence(w1);
       h.Advance(h.options().heartbeat_timeout_ms + 500);
       EXPECT_EQ(h.Run(run).phase, Phase::kRecovering);
       h.OutOfMemory(w0, run, 3, 2, 2);  // w0 was still stopping its task
       return run;
     },
     Phase::kRecovering,
     {"worker-lost", "recovering"},
     [](Harness& h, const std::string& run) {
       const auto kinds = h.Events(run);
       EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "oom"), 0) << Join(kinds);
     }},
    {"OutOfMemoryAtMicroBatchOneWithNothingLeftFails",
     [](Harness& h) {
       h.Register("w0");
       std::string spec = h.Spec(1, 1);
       const std::string run = h.Submit(spec);
       h.NewAssignments(run);
       h.OutOfMemory("w0", run, 1, 1, 0);
       return run;
     },
     Phase::kFailed,
     {"oom", "failed"}},
};

class RunMachineTest : public ::testing::TestWithParam<Case> {};

TEST_P(RunMachineTest, EndsInThePhaseAndJournalsTheEvents) {
  char tmpl[] = "/tmp/strata-machine-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  {
    Harness h(dir);
    const Case& c = GetParam();
    const std::string run = c.script(h);
    ASSERT_FALSE(run.empty());
    EXPECT_EQ(PhaseName(h.Run(run).phase), std::string(PhaseName(c.phase)));
    const auto kinds = h.Events(run);
    EXPECT_TRUE(IsSubsequence(c.events, kinds)) << "want (in order) " << Join(c.events) << "\nhave " << Join(kinds);
    if (c.check) c.check(h, run);
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, RunMachineTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(TimerQueueTest, FiresInDeadlineOrderAndNeverACancelledTimer) {
  FakeClock clock;
  TimerQueue timers(clock);
  std::vector<int> fired;
  timers.After(300, [&] { fired.push_back(3); });
  const auto cancelled = timers.After(200, [&] { fired.push_back(2); });
  timers.After(100, [&] { fired.push_back(1); });
  int ticks = 0;
  timers.Every(150, [&] { ++ticks; });
  timers.Cancel(cancelled);
  clock.Advance(99);
  timers.RunDue();
  EXPECT_TRUE(fired.empty());
  clock.Advance(400);
  timers.RunDue();
  EXPECT_EQ(fired, (std::vector<int>{1, 3}));
  EXPECT_EQ(ticks, 1);  // a periodic timer fires once per RunDue, however late
  clock.Advance(150);
  timers.RunDue();
  EXPECT_EQ(ticks, 2);
}

}  // namespace
}  // namespace strata::coordinator
