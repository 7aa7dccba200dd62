// Coordinator tests against a real coordinator (its own thread, real ZeroMQ ipc sockets, real
// RocksDB), talking to it as workers and clients do. Its deadlines run on a FakeClock the tests
// move (heartbeat timeouts, stall windows); run_machine_test.cc covers the run state machine
// without sockets.
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "client/coordinator_client.h"
#include "common/net.h"
#include "coordinator/clock.h"
#include "spec/run_spec_capnp.h"

namespace strata::coordinator {
namespace {

using client::CoordinatorClient;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-coord-XXXXXX";
    dir_ = mkdtemp(tmpl);
    options_.state_dir = dir_ + "/state";
    options_.listen = "ipc://" + dir_ + "/c.sock";
    options_.heartbeat_timeout_ms = 600;
    options_.clock = &clock_;
    std::ofstream(dir_ + "/corpus.txt") << std::string(10000, 'x');
    Start();
  }
  void TearDown() override { Stop(); }

  void Start() {
    auto c = Coordinator::Create(options_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coordinator_ = std::move(c).value();
    thread_ = std::thread([this] { EXPECT_TRUE(coordinator_->Run().ok()); });
  }
  void Stop() {
    if (!coordinator_) return;
    coordinator_->RequestStop();
    thread_.join();
    coordinator_.reset();
  }

  std::string Spec(int dp = 1) {
    return "name = \"t\"\n[model]\nhidden = 32\nheads = 2\nsequence = 16\n[data]\npath = \"" + dir_ +
           "/corpus.txt\"\n[train]\nsteps = 3\nglobal_batch = 2\n[parallel]\ndp = " + std::to_string(dp) + "\n";
  }

  std::string dir_;
  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  std::thread thread_;
};

TEST_F(CoordinatorTest, GarbageIsDroppedAndTheCoordinatorKeepsServing) {
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(options_.listen);
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    std::string junk(1 + rng() % 300, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    raw.send(net::Buffer(junk), zmq::send_flags::none);
  }
  // Multi-frame junk too.
  raw.send(net::Buffer(std::string("a")), zmq::send_flags::sndmore);
  raw.send(net::Buffer(std::string("b")), zmq::send_flags::none);

  CoordinatorClient client(options_.listen);
  schema::EnvelopeBuilder req;
  req.root().setWorkersRequest();
  auto reply = client.Call(req);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ((*reply)->root().which(), Envelope::WORKERS_REPLY);
}

TEST_F(CoordinatorTest, WrongProtocolVersionIsAnsweredWithAnError) {
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(options_.listen);
  schema::EnvelopeBuilder req(77);
  req.root().setVersion(schema::kProtocolVersion + 1);
  req.root().setWorkersRequest();
  raw.send(net::Buffer(req.Serialize()), zmq::send_flags::none);
  std::vector<zmq::message_t> frames;
  ASSERT_TRUE(net::RecvMultipart(raw, &frames, 3000));
  auto reply = schema::DecodeEnvelope(net::Bytes(frames.back()));
  ASSERT_TRUE(reply.ok());
  ASSERT_EQ((*reply)->root().which(), Envelope::ERROR);
  EXPECT_NE(std::string((*reply)->root().getError().getMessage().cStr()).find("protocol version"), std::string::npos);
}

TEST_F(CoordinatorTest, InvalidSpecIsRejectedNamingTheKey) {
  CoordinatorClient client(options_.listen);
  schema::EnvelopeBuilder req;
  req.root().initSubmitRun().setSpecToml(Spec() + "[model2]\n");
  auto reply = client.Call(req);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(reply.status().message().find("model2"), std::string::npos);
}

// A worker as the coordinator sees one, at the protocol level: registers, heartbeats, receives its
// assignment and reports task events, so a test can make a rank say exactly what it wants.
class FakeWorker {
 public:
  // `host`: the host it reports (workers on several hosts make the coordinator copy checkpoint
  // shards across them).
  // `device`: what its memory reports describe ("cuda:0": the planner sees a GPU).
  FakeWorker(zmq::context_t& ctx, const std::string& endpoint, const std::string& name, const std::string& dir,
             const std::string& host = "", const std::string& device = "cpu")
      : socket_(ctx, zmq::socket_type::dealer), name_(name), device_(device) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::routing_id, name);
    socket_.connect(endpoint);
    schema::EnvelopeBuilder reg(1);
    auto r = reg.root().initRegisterWorker();
    r.setName(name);
    r.setPid(1000 + static_cast<uint32_t>(name.back()));
    r.setDataAddress("ipc://" + dir + "/" + name + ".sock");
    r.setHost(host);
    r.setStorePath(dir + "/" + name + "-store");
    r.setServeAddress("ipc://" + dir + "/" + name + ".serve.sock");
    auto memory = r.initMemory();
    memory.setDevice(device_);
    memory.setTotalBytes(uint64_t{8} << 30);
    memory.setFreeBytes(uint64_t{6} << 30);
    socket_.send(net::Buffer(reg.Serialize()), zmq::send_flags::none);
    std::vector<zmq::message_t> frames;
    EXPECT_TRUE(net::RecvMultipart(socket_, &frames, 3000));
  }

  void Heartbeat() {
    schema::EnvelopeBuilder msg;
    auto hb = msg.root().initHeartbeat();
    hb.setWorkerId(name_);
    auto memory = hb.initMemory();
    memory.setDevice(device_);
    memory.setTotalBytes(uint64_t{8} << 30);
    memory.setFreeBytes(uint64_t{6} << 30);
    socket_.send(net::Buffer(msg.Serialize()), zmq::send_flags::none);
  }

  // Heartbeats until a message of `kind` that `accept` takes arrives (or 3 s pass).
  bool Await(Envelope::Which kind, const std::function<bool(Envelope::Reader)>& accept) {
    const int64_t start = net::SteadyMs();
    std::vector<zmq::message_t> frames;
    while (net::SteadyMs() - start < 3000) {
      Heartbeat();
      if (!net::RecvMultipart(socket_, &frames, 100)) continue;
      auto env = schema::DecodeEnvelope(net::Bytes(frames.back()));
      if (env.ok() && (*env)->root().which() == kind && accept((*env)->root())) return true;
    }
    return false;
  }

  // Heartbeats until an AssignTask for `run_id` arrives (or 3 s pass); remembers rank and token.
  bool AwaitAssignment(const std::string& run_id) {
    return Await(Envelope::ASSIGN_TASK, [&](Envelope::Reader root) {
      auto a = root.getAssignTask();
      if (std::string(a.getRunId().cStr()) != run_id) return false;
      rank_ = a.getRank();
      token_ = a.getTaskToken();
      return true;
    });
  }

  // Reports that this rank's collective timed out, naming no one (as an NCCL rank does).
  void ReportUnknownStall(const std::string& run_id) {
    schema::EnvelopeBuilder msg;
    auto st = Event(msg, run_id).initStalled();
    st.setRankKnown(false);
    st.setDetail("an NCCL all-reduce of rank " + std::to_string(rank_) + " issued 5 s ago has not finished");
    socket_.send(net::Buffer(msg.Serialize()), zmq::send_flags::none);
  }

  // Reports this rank's shard of checkpoint `step` as saved (one tensor).
  void ReportCheckpoint(const std::string& run_id, int64_t step, const std::string& store_path) {
    schema::EnvelopeBuilder msg;
    auto shard = Event(msg, run_id).initCheckpointSaved();
    shard.setStep(step);
    shard.setStorePath(store_path);
    shard.initTensors(1)[0].setName("param/h.0.ln_1.weight@tp=0/1@[0,8)@8");
    socket_.send(net::Buffer(msg.Serialize()), zmq::send_flags::none);
  }

  // Heartbeats until a ReplicateShard arrives (or 3 s pass); answers it (`error` empty: copied).
  // The source it was told to copy from.
  std::optional<std::string> AnswerReplicateShard(const std::string& error) {
    std::optional<std::string> source;
    Await(Envelope::REPLICATE_SHARD, [&](Envelope::Reader root) {
      auto r = root.getReplicateShard();
      schema::EnvelopeBuilder msg;
      auto done = msg.root().initShardReplicated();
      done.setRunId(r.getRunId());
      done.setStep(r.getStep());
      done.setRank(r.getRank());
      done.setStorePath("/copies/" + name_);
      done.setKeyRun(r.getKeyRun());
      done.setError(error);
      socket_.send(net::Buffer(msg.Serialize()), zmq::send_flags::none);
      source = r.getSource().cStr();
      return true;
    });
    return source;
  }

  uint32_t rank() const { return rank_; }
  const std::string& name() const { return name_; }

 private:
  ::TaskEvent::Builder Event(schema::EnvelopeBuilder& msg, const std::string& run_id) {
    auto ev = msg.root().initTaskEvent();
    ev.setRunId(run_id);
    ev.setRank(rank_);
    ev.setTaskToken(token_);
    return ev;
  }

  zmq::socket_t socket_;
  std::string name_;
  std::string device_;
  uint32_t rank_ = 0;
  uint64_t token_ = 0;
};

// Submits a spec for a model far over the fake worker's 6 GiB (an 8B-wide Llama of 32 layers)
// with `parallel` as its [parallel] table; the spec the worker is assigned, and the run's id.
RunSpec AssignedSpecOfABigModel(FakeWorker& worker, CoordinatorClient& client, const std::string& dir,
                                const std::string& parallel, std::string* run_id) {
  schema::EnvelopeBuilder submit;
  submit.root().initSubmitRun().setSpecToml(
      "name = \"big\"\n[model]\nhidden = 4096\nheads = 32\nlayers = 32\nsequence = 16\n[data]\npath = \"" + dir +
      "/corpus.txt\"\n[train]\nsteps = 3\nglobal_batch = 2\n[parallel]\n" + parallel);
  auto submitted = client.Call(submit);
  EXPECT_TRUE(submitted.ok()) << submitted.status().ToString();
  if (!submitted.ok()) return {};
  *run_id = (*submitted)->root().getSubmitted().getRunId().cStr();
  RunSpec spec;
  EXPECT_TRUE(worker.Await(Envelope::ASSIGN_TASK, [&](Envelope::Reader root) {
    auto assigned = ReadRunSpec(root.getAssignTask().getSpec(), "the assignment's run spec");
    EXPECT_TRUE(assigned.ok()) << assigned.status().ToString();
    if (assigned.ok()) spec = *assigned;
    return std::string(root.getAssignTask().getRunId().cStr()) == *run_id;
  }));
  return spec;
}

// A ZeRO-3 mesh fixed in every field but keep_gathered (left out, so the planner's) starts as a
// fixed mesh always did when the planner finds no plan for it - here its estimate is far over the
// worker's 6 GiB - keeping no layer gathered, rather than failing to plan.
TEST_F(CoordinatorTest, AFixedZero3MeshTheEstimateRefusesStillStartsKeepingNothingGathered) {
  zmq::context_t ctx;
  FakeWorker worker(ctx, options_.listen, "w0", dir_);
  CoordinatorClient client(options_.listen);
  std::string run_id;
  const RunSpec spec = AssignedSpecOfABigModel(
      worker, client, dir_,
      "dp = 1\npp = 1\ntp = 1\nzero = 3\nrecompute = false\nmicro_batch = 0\noffload = \"none\"\n", &run_id);
  EXPECT_TRUE(spec.parallel.planned());
  EXPECT_EQ(spec.parallel.keep_gathered, 0);
  EXPECT_EQ(spec.parallel.zero, 3);
}

// The same one-worker mesh with zero, recompute, micro_batch and offload left to the planner:
// nothing fits on the device, so the plan offloads the optimizer's state and the parameters
// (streamed ZeRO-3), and its event says why. (A cluster of CPU workers never offloads by itself:
// their device memory is their host's; this fake worker reports a GPU.)
TEST_F(CoordinatorTest, AMeshThatFitsOnlyOffloadedIsPlannedWithOffload) {
  zmq::context_t ctx;
  FakeWorker worker(ctx, options_.listen, "w0", dir_, "", "cuda:0");
  CoordinatorClient client(options_.listen);
  std::string run_id;
  const RunSpec spec = AssignedSpecOfABigModel(worker, client, dir_, "dp = 1\npp = 1\ntp = 1\n", &run_id);
  EXPECT_EQ(spec.parallel.offload, Offload::kOptimizerAndParams);
  EXPECT_EQ(spec.parallel.dp, 1);
  schema::EnvelopeBuilder events;
  events.root().initEventsRequest().setRunId(run_id);
  auto reply = client.Call(events);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  std::string planned;
  for (auto e : (*reply)->root().getEventsReply().getEvents()) {
    if (std::string(e.getKind().cStr()) == "planned") planned = e.getMessage().cStr();
  }
  EXPECT_NE(planned.find("Offloads the optimizer's state and the parameters to host memory: without it the leanest "
                         "plan on 1 worker needs"),
            std::string::npos)
      << planned;
}

// The run is not failed: it goes back to pending, to resume (here from step 0: no checkpoint)
// once workers for it are there (mesh_test covers the whole recovery with real workers).
// The run's files are its workers' to open and check (their hosts may be the only ones holding
// them): a data path that does not exist on the coordinator's host is still planned and assigned.
TEST_F(CoordinatorTest, ARunWhoseFilesOnlyItsWorkersHoldIsAssigned) {
  zmq::context_t ctx;
  FakeWorker worker(ctx, options_.listen, "w0", dir_);
  std::string spec = Spec();
  spec.replace(spec.find("/corpus.txt"), 11, "/on-the-worker-host-only.txt");
  CoordinatorClient client(options_.listen);
  schema::EnvelopeBuilder submit;
  submit.root().initSubmitRun().setSpecToml(spec);
  auto submitted = client.Call(submit);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  EXPECT_TRUE(worker.AwaitAssignment((*submitted)->root().getSubmitted().getRunId().cStr()));
}

TEST_F(CoordinatorTest, SilentWorkerIsMarkedLostAndItsRunWaitsToRecover) {
  zmq::context_t ctx;
  FakeWorker worker(ctx, options_.listen, "w0", dir_);

  CoordinatorClient client(options_.listen);
  schema::EnvelopeBuilder submit;
  submit.root().initSubmitRun().setSpecToml(Spec());
  auto submitted = client.Call(submit);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const std::string run_id = (*submitted)->root().getSubmitted().getRunId().cStr();

  // The worker receives its assignment, then goes silent.
  ASSERT_TRUE(worker.AwaitAssignment(run_id));

  const int64_t start = net::SteadyMs();
  WorkerState state = WorkerState::IDLE;
  while (net::SteadyMs() - start < 5000) {
    schema::EnvelopeBuilder req;
    req.root().setWorkersRequest();
    auto reply = client.Call(req);
    ASSERT_TRUE(reply.ok());
    state = (*reply)->root().getWorkersReply().getWorkers()[0].getState();
    if (state == WorkerState::LOST) break;
    clock_.Advance(100);  // the worker stays silent while time passes
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(state, WorkerState::LOST);

  schema::EnvelopeBuilder status;
  status.root().initStatusRequest().setRunId(run_id);
  auto reply = client.Call(status);
  ASSERT_TRUE(reply.ok());
  auto run = (*reply)->root().getStatusReply().getRuns()[0];
  EXPECT_EQ(run.getState(), RunState::PENDING);
  EXPECT_EQ(run.getStep(), 0);
  EXPECT_EQ(run.getWorkers().size(), 0u);
}

// The NCCL hang watchdog's arbitration: ranks whose collective timed out report it without a name;
// when the stall window closes, the rank that reported nothing (it heartbeats, but is stuck in its
// own work) is the one treated as lost, and the run goes back to recover.
class StallTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    options_.stall_window_ms = 400;
    options_.heartbeat_timeout_ms = 1500;
    CoordinatorTest::SetUp();
  }

  // Three fake workers running one dp=3 run; returns its id.
  std::string StartRun(zmq::context_t& ctx, std::vector<std::unique_ptr<FakeWorker>>& workers) {
    for (const char* name : {"w0", "w1", "w2"})
      workers.push_back(std::make_unique<FakeWorker>(ctx, options_.listen, name, dir_));
    CoordinatorClient client(options_.listen);
    schema::EnvelopeBuilder submit;
    std::string spec = Spec(3);
    spec.replace(spec.find("global_batch = 2"), 16, "global_batch = 6");
    submit.root().initSubmitRun().setSpecToml(spec);
    auto submitted = client.Call(submit);
    EXPECT_TRUE(submitted.ok()) << submitted.status().ToString();
    if (!submitted.ok()) return "";
    const std::string run_id = (*submitted)->root().getSubmitted().getRunId().cStr();
    for (auto& w : workers) EXPECT_TRUE(w->AwaitAssignment(run_id));
    return run_id;
  }

  // The run's events of `kind`, waiting up to 3 s (heartbeating meanwhile) for the first.
  std::vector<std::string> AwaitEvents(const std::string& run_id, const std::string& kind,
                                       std::vector<std::unique_ptr<FakeWorker>>& workers) {
    CoordinatorClient client(options_.listen);
    std::vector<std::string> found;
    const int64_t start = net::SteadyMs();
    while (found.empty() && net::SteadyMs() - start < 3000) {
      for (auto& w : workers) w->Heartbeat();
      clock_.Advance(100);  // towards the stall window's end (every worker heartbeats meanwhile)
      schema::EnvelopeBuilder req;
      req.root().initEventsRequest().setRunId(run_id);
      auto reply = client.Call(req);
      if (!reply.ok()) break;
      for (auto e : (*reply)->root().getEventsReply().getEvents()) {
        if (std::string(e.getKind().cStr()) == kind) found.push_back(e.getMessage().cStr());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return found;
  }

  std::map<std::string, WorkerState> States() {
    CoordinatorClient client(options_.listen);
    schema::EnvelopeBuilder req;
    req.root().setWorkersRequest();
    auto reply = client.Call(req);
    std::map<std::string, WorkerState> states;
    if (!reply.ok()) return states;
    for (auto w : (*reply)->root().getWorkersReply().getWorkers()) states[w.getName().cStr()] = w.getState();
    return states;
  }
};

TEST_F(StallTest, TheRankThatReportsNoStallIsTreatedAsLost) {
  zmq::context_t ctx;
  std::vector<std::unique_ptr<FakeWorker>> workers;
  const std::string run_id = StartRun(ctx, workers);
  ASSERT_FALSE(run_id.empty());
  for (auto& w : workers) {
    if (w->rank() == 1) continue;
    w->ReportUnknownStall(run_id);
  }
  const auto stalled = AwaitEvents(run_id, "stalled", workers);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_NE(stalled[0].find("rank 1 on "), std::string::npos) << stalled[0];
  EXPECT_NE(stalled[0].find("did not arrive: 2 of 3 ranks timed out in a collective"), std::string::npos) << stalled[0];
  EXPECT_NE(stalled[0].find("NCCL all-reduce"), std::string::npos) << "the rank's own words: " << stalled[0];
  const auto states = States();
  for (auto& w : workers) {
    EXPECT_EQ(states.at(w->name()) == WorkerState::LOST, w->rank() == 1) << w->name() << " (rank " << w->rank() << ")";
  }
  EXPECT_EQ(AwaitEvents(run_id, "recovering", workers).size(), 1u);
}

TEST_F(StallTest, WhenEveryRankTimedOutNoneIsBlamedAndTheRunStartsAgain) {
  zmq::context_t ctx;
  std::vector<std::unique_ptr<FakeWorker>> workers;
  const std::string run_id = StartRun(ctx, workers);
  ASSERT_FALSE(run_id.empty());
  for (auto& w : workers) w->ReportUnknownStall(run_id);
  const auto stalled = AwaitEvents(run_id, "stalled", workers);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_NE(stalled[0].find("every rank timed out in a collective and none can be blamed: 3 of 3"), std::string::npos)
      << stalled[0];
  EXPECT_EQ(AwaitEvents(run_id, "recovering", workers).size(), 1u);
  for (auto& [id, state] : States()) EXPECT_NE(state, WorkerState::LOST) << id;
}

// Workers on two hosts: a checkpoint is committed only once each rank's shard has a copy on the
// other host; a copy that fails leaves the checkpoint uncommitted (the journal says why).
TEST_F(CoordinatorTest, CheckpointsOfAClusterSpanningHostsWaitForACopyOfEveryShard) {
  zmq::context_t ctx;
  std::vector<std::unique_ptr<FakeWorker>> workers;
  workers.push_back(std::make_unique<FakeWorker>(ctx, options_.listen, "w0", dir_, "host-a"));
  workers.push_back(std::make_unique<FakeWorker>(ctx, options_.listen, "w1", dir_, "host-b"));
  CoordinatorClient client(options_.listen);
  schema::EnvelopeBuilder submit;
  submit.root().initSubmitRun().setSpecToml(Spec(2));
  auto submitted = client.Call(submit);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const std::string run_id = (*submitted)->root().getSubmitted().getRunId().cStr();
  for (auto& w : workers) ASSERT_TRUE(w->AwaitAssignment(run_id));
  auto checkpoints = [&] {
    schema::EnvelopeBuilder req;
    req.root().initCheckpointsRequest().setRunId(run_id);
    auto reply = client.Call(req);
    EXPECT_TRUE(reply.ok());
    std::vector<int64_t> steps;
    if (reply.ok()) {
      for (auto m : (*reply)->root().getCheckpointsReply().getCheckpoints()) {
        steps.push_back(m.getStep());
        for (auto shard : m.getShards()) {
          EXPECT_EQ(shard.getCopies().size(), 1u);
          if (shard.getCopies().size() != 1) continue;
          // Each copy is on the other host than its shard.
          EXPECT_NE(std::string(shard.getHost().cStr()), std::string(shard.getCopies()[0].getHost().cStr()));
          EXPECT_NE(std::string(shard.getCopies()[0].getKeyRun().cStr()), run_id);
        }
      }
    }
    return steps;
  };
  auto events = [&](const std::string& kind) {
    schema::EnvelopeBuilder req;
    req.root().initEventsRequest().setRunId(run_id);
    auto reply = client.Call(req);
    std::string found;
    if (reply.ok()) {
      for (auto e : (*reply)->root().getEventsReply().getEvents()) {
        if (std::string(e.getKind().cStr()) == kind) found += std::string(e.getMessage().cStr()) + "\n";
      }
    }
    return found;
  };

  // Step 2: every shard reported; w1's copy of w0's shard fails.
  for (auto& w : workers) w->ReportCheckpoint(run_id, 2, dir_ + "/" + w->name() + "-store");
  ASSERT_EQ(workers[0]->AnswerReplicateShard(""), "ipc://" + dir_ + "/w1.serve.sock") << "w0 copies w1's shard";
  ASSERT_EQ(workers[1]->AnswerReplicateShard("disk full"), "ipc://" + dir_ + "/w0.serve.sock");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(checkpoints().empty()) << "a shard without a copy on another host does not make a checkpoint";
  EXPECT_NE(events("checkpoint-incomplete").find("checkpoint at step 2 not committed: copying rank"), std::string::npos)
      << events("checkpoint-incomplete");
  EXPECT_NE(events("checkpoint-incomplete").find("failed: disk full"), std::string::npos);

  // Step 4: both copies made; the checkpoint is committed with them.
  for (auto& w : workers) w->ReportCheckpoint(run_id, 4, dir_ + "/" + w->name() + "-store");
  for (auto& w : workers) ASSERT_TRUE(w->AnswerReplicateShard("").has_value()) << w->name();
  std::vector<int64_t> steps;
  for (int i = 0; i < 30 && steps.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    steps = checkpoints();
  }
  EXPECT_EQ(steps, std::vector<int64_t>{4});
  EXPECT_NE(events("checkpoint").find("checkpoint at step 4 committed (2 shards, each with a copy on another host)"),
            std::string::npos)
      << events("checkpoint");
}

TEST_F(CoordinatorTest, RunsSurviveARestart) {
  std::string run_id;
  {
    CoordinatorClient client(options_.listen);
    schema::EnvelopeBuilder submit;
    submit.root().initSubmitRun().setSpecToml(Spec(2));
    auto submitted = client.Call(submit);
    ASSERT_TRUE(submitted.ok());
    run_id = (*submitted)->root().getSubmitted().getRunId().cStr();
  }
  Stop();
  Start();
  CoordinatorClient client(options_.listen);
  schema::EnvelopeBuilder status;
  status.root().initStatusRequest();
  auto reply = client.Call(status);
  ASSERT_TRUE(reply.ok());
  auto runs = (*reply)->root().getStatusReply().getRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(std::string(runs[0].getRunId().cStr()), run_id);
  EXPECT_EQ(runs[0].getState(), RunState::PENDING);  // no workers yet
  EXPECT_EQ(runs[0].getWorldSize(), 2u);
}

// A coordinator restarted under a running run keeps a placeholder for each of its workers (no
// address until it registers again). The first to re-register has lost its task, so the run
// re-plans; the other's placeholder is not a worker to plan onto: assigning it a rank handed the
// ranks an empty peer address, the re-registering worker then ignored its second assignment and
// the run hung (seen under Slurm, tests/slurm/slurm_test.sh, when both re-registered at once).
TEST_F(CoordinatorTest, AfterARestartARunIsNotAssignedToWorkersThatHaveNotRegisteredAgain) {
  std::string run_id;
  {
    zmq::context_t ctx;
    FakeWorker a(ctx, options_.listen, "wa", dir_), b(ctx, options_.listen, "wb", dir_);
    CoordinatorClient client(options_.listen);
    schema::EnvelopeBuilder submit;
    submit.root().initSubmitRun().setSpecToml(Spec(2));
    auto submitted = client.Call(submit);
    ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
    run_id = (*submitted)->root().getSubmitted().getRunId().cStr();
    ASSERT_TRUE(a.AwaitAssignment(run_id));
    ASSERT_TRUE(b.AwaitAssignment(run_id));
  }
  Stop();
  Start();
  zmq::context_t ctx;
  FakeWorker a(ctx, options_.listen, "wa", dir_);  // registers again, without its task
  std::vector<std::string> peers;
  a.Await(Envelope::ASSIGN_TASK, [&](Envelope::Reader root) {
    for (auto p : root.getAssignTask().getPeerDataAddresses()) peers.push_back(p.cStr());
    return true;
  });
  for (const auto& p : peers)
    EXPECT_FALSE(p.empty()) << "a rank was assigned to a worker that has not registered since the restart";
  EXPECT_TRUE(peers.empty()) << "assigned before wb registered again: " << peers.size() << " peers";
  FakeWorker b(ctx, options_.listen, "wb", dir_);  // once both are back, the run resumes on them
  EXPECT_TRUE(a.AwaitAssignment(run_id));
  EXPECT_TRUE(b.AwaitAssignment(run_id));
}

// Issue #20: a client can bypass the CLI, so the coordinator checks names itself. A name with a
// NUL byte wedged the cluster (workers trained under the id cut at the NUL); a long one failed its
// checkpoint after training ("File name too long").
TEST_F(CoordinatorTest, SubmitMessagesWithUnsafeRunNamesAreRefused) {
  CoordinatorClient client(options_.listen);
  for (const std::string& name :
       {std::string("a\\u0000b"), std::string(115, 'n'), std::string("x\\u001b[2J"), std::string("../up")}) {
    std::string spec = Spec();
    spec.replace(spec.find("name = \"t\""), 10, "name = \"" + name + "\"");
    schema::EnvelopeBuilder req;
    req.root().initSubmitRun().setSpecToml(spec);
    auto reply = client.Call(req);
    ASSERT_FALSE(reply.ok()) << name;
    EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(reply.status().message().find("a run name is 1 to 64 characters"), std::string::npos)
        << reply.status().message();
  }
  schema::EnvelopeBuilder status;
  status.root().initStatusRequest();
  auto runs = client.Call(status);
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ((*runs)->root().getStatusReply().getRuns().size(), 0u);
}

// Issue #20: an extract run with dp = 64 on 2 workers stayed pending forever without a word; like
// a train run that cannot be placed, it fails at once with the reason.
TEST_F(CoordinatorTest, ExtractRunNeedingMoreWorkersThanTheClusterHasFailsAtOnce) {
  zmq::context_t ctx;
  FakeWorker w0(ctx, options_.listen, "w0", dir_), w1(ctx, options_.listen, "w1", dir_);
  CoordinatorClient client(options_.listen);
  auto submit = [&](int dp) {
    schema::EnvelopeBuilder req;
    std::string spec =
        "kind = \"extract\"\nname = \"cap\"\n[model]\nhidden = 32\nheads = 2\nsequence = 16\n[data]\npath = \"" + dir_ +
        "/corpus.txt\"\n[parallel]\ndp = " + std::to_string(dp) + "\n";
    req.root().initSubmitRun().setSpecToml(spec);
    auto reply = client.Call(req);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    return reply.ok() ? std::string((*reply)->root().getSubmitted().getRunId().cStr()) : std::string();
  };
  auto state_of = [&](const std::string& run_id) {
    schema::EnvelopeBuilder status;
    status.root().initStatusRequest().setRunId(run_id);
    auto reply = client.Call(status);
    EXPECT_TRUE(reply.ok());
    auto r = (*reply)->root().getStatusReply().getRuns()[0];
    return std::make_pair(r.getState(), std::string(r.getMessage().cStr()));
  };
  const std::string too_wide = submit(64);
  ASSERT_FALSE(too_wide.empty());
  const auto [state, message] = state_of(too_wide);  // the submit's reply came after the schedule pass
  EXPECT_EQ(state, RunState::FAILED);
  EXPECT_NE(message.find("parallel.dp = 64"), std::string::npos) << message;
  EXPECT_NE(message.find("2 live worker"), std::string::npos) << message;
  // One the cluster can place still starts.
  const std::string fits = submit(2);
  ASSERT_FALSE(fits.empty());
  EXPECT_NE(state_of(fits).first, RunState::FAILED) << state_of(fits).second;
}

TEST(CoordinatorClientTest, UnreachableCoordinatorFailsFastWithAHint) {
  CoordinatorClient client("ipc:///tmp/strata-nobody-listens-here.sock", 500);
  schema::EnvelopeBuilder req;
  req.root().setWorkersRequest();
  const int64_t start = net::SteadyMs();
  auto reply = client.Call(req);
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("strata up"), std::string::npos);
  EXPECT_LT(net::SteadyMs() - start, 3000);
}

}  // namespace
}  // namespace strata::coordinator
