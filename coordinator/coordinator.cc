// Coordinator event loop.
//
// One thread, one ROUTER socket, one poll loop: every handler runs to completion on this thread,
// so no state here needs a lock. Each tick (at most 100 ms apart) also checks heartbeat deadlines.
//
// Run lifecycle: submit -> pending -> (enough idle workers) running -> finished | failed |
// cancelled. A checkpoint of a run is complete when every rank has reported its shard durable in
// its own store; only then is the manifest committed here (and listed by `strata checkpoints`).
//
// Persistence (metadata store, keys order-preserving):
//   "run/"  + run id                     -> RunRecord
//   "evt/"  + str(run id) + u64(seq)     -> Event
//   "ckpt/" + str(run id) + u64(step)    -> CheckpointManifest
//   "loss/" + str(run id) + u64(step)    -> StepReport (one small record per step, so a long run
//                                           never rewrites its whole history)
//   "act/"  + str(run id) + u64(chunk)   -> ChunkLocation: the index of an extract run's stored
//                                           chunks (which worker's store holds which rows)
//   "task/" + str(run id) + str(worker)  -> ChunkList: the chunks an extract task was given
//   "ckptdel/" + str(store path) + str(key run) + u64(step) -> (empty) a shard retention deleted
//                                           from the coordinator's view, until its store no longer holds it
//   "ckptbad/" + str(run id) + u64(step) -> why that checkpoint cannot be resumed from (a rank
//                                           could not read it, or a store no longer holds a shard)
//
// Extract runs are scheduled by chunk, not by rank: each worker of the run gets a contiguous block
// of chunks; a worker that finishes is free for other runs; a lost worker's unstored chunks wait
// replace_grace_ms for it to return (its store may hold some of them already, and it skips those),
// then go to whichever workers are idle. The run finishes when every chunk is in the index.
//
// Train runs survive a lost worker (heartbeat timeout, or a restart that lost its task): the
// surviving ranks are told to stop, the run goes back to pending and resumes from its latest
// complete checkpoint (or from the start, or from the checkpoint it was itself resumed from). It
// waits replace_grace_ms for enough workers for its mesh; after that it is re-planned onto the
// workers present: pp and tp stay, dp shrinks to the largest value that fits and divides the
// global batch, so the losses stay those of the uninterrupted run (checkpoints are mesh-free).
#include "coordinator/coordinator.h"

#include "model/hf_checkpoint.h"
#include "shard/plan_summary.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>

#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <numeric>
#include <limits>
#include <map>
#include <optional>
#include <iomanip>
#include <random>
#include <sstream>
#include <set>
#include <vector>

#include <zmq.hpp>

#include "common/log.h"
#include "common/task_log.h"
#include "common/curve.h"
#include "common/net.h"
#include "common/run_spec.h"
#include "common/token_file.h"
#include "coordinator/dashboard.h"
#include "schema/envelope.h"
#include "shard/layout.h"
#include "shard/planner.h"
#include "storage/shard_store.h"

namespace strata::coordinator {
namespace {

using storage::EncodeKeyString;
using storage::EncodeKeyU64;

std::string FormatBytes(uint64_t bytes) {
  char text[32];
  const bool gib = bytes >= (uint64_t{1} << 30);
  std::snprintf(text, sizeof(text), gib ? "%.2f GiB" : "%.1f MiB", static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << (gib ? 30 : 20)));
  return text;
}

std::span<const uint8_t> AsBytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }


struct WorkerEntry {
  std::string id;        // == its name: stable across worker and coordinator restarts
  std::string identity;  // ROUTER routing id (the worker sets it to its name)
  std::string host;
  uint32_t pid = 0;
  WorkerState state = WorkerState::IDLE;
  MemorySnapshot memory;
  std::string store_path;
  std::string data_address;
  std::string serve_address;  // its store server (activation reads)
  std::string current_run;
  int64_t last_heartbeat_ms = 0;  // steady clock
  // For the dashboard's memory chart: a heartbeat's memory at most once a second, the last
  // kMemoryHistory of them (10 minutes).
  std::deque<DashboardMemorySample> memory_history;
};

constexpr size_t kMemoryHistory = 600;

// Extract runs: where each stored chunk is, and who is capturing what.
struct ExtractState {
  uint64_t total_chunks = 0;
  uint64_t total_rows = 0;
  std::map<uint64_t, std::string> stored;  // chunk -> serialized ChunkLocation (persisted under act/)
  uint64_t stored_bytes = 0;
  uint64_t stored_rows = 0;
  std::map<std::string, std::set<uint64_t>> tasks;  // worker -> its task's chunks not yet stored
  struct Reservation {
    int64_t until_ms = 0;  // steady clock
    std::set<uint64_t> chunks;
  };
  std::map<std::string, Reservation> reserved;  // lost worker -> chunks waiting for it
  int64_t started_ms = 0;                        // steady clock of the first assignment here
  uint64_t computed_rows = 0;                    // rows computed since started_ms
  uint64_t computed_bytes = 0;                   // their bytes
  double bytes_per_second = 0;                   // computed_bytes over the time since started_ms
  // Reports since this coordinator started: chunks computed (duplicates included, so a chunk
  // computed twice shows), and chunks a resumed task found already in its store.
  uint64_t computed_reports = 0, found_reports = 0;
};

struct RunEntry {
  std::string id;
  std::string name;
  std::string spec_toml;
  RunSpec spec;
  RunState state = RunState::PENDING;
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  int64_t step = 0;
  std::vector<double> losses;
  std::vector<std::string> workers;  // by rank
  std::string message;
  double tokens_per_second = 0;
  uint64_t next_event_seq = 0;
  uint64_t task_token = 0;
  std::set<uint32_t> finished_ranks;
  // step -> rank -> serialized CheckpointShard, until every rank has reported.
  std::map<int64_t, std::map<uint32_t, std::string>> pending_shards;
  // A cluster spanning hosts: step -> rank -> the copy of that rank's shard being made on another
  // host (ReplicateAcrossHosts); the checkpoint is committed once every copy is.
  struct PendingCopy {
    std::string target;  // the worker making it
    std::string key_run;
    std::string store_path;  // once made
  };
  std::map<int64_t, std::map<uint32_t, PendingCopy>> pending_copies;
  // Train runs started from a checkpoint (of another run, under any mesh): its run and step.
  std::string resume_run;
  int64_t resume_step = 0;
  bool resume_step_asked = false;  // `submit --resume RUN@STEP` named the step: never another one
  int64_t recover_until_ms = 0;  // steady clock: after a lost worker, when to re-plan onto who is there
  int64_t grow_back_to_dp = 0;   // the dp it ran with before a lost worker made it smaller (0: never shrunk)
  // After an out-of-memory stop: the step whose state the ranks of attempt `token` are saving (its
  // checkpoint is the replay's start), how many shards make it whole, and until when (steady
  // clock) the run waits for them before replaying from its latest complete checkpoint.
  struct Snapshot {
    int64_t step = 0;
    uint64_t token = 0;
    size_t ranks = 0;
    int64_t until_ms = 0;  // 0: not waiting
  } snapshot;
  // Ranks of attempt `token` whose collective timed out without naming who did not arrive; at
  // until_ms (steady clock) the ranks not among them are blamed (options.stall_window_ms).
  struct Stall {
    uint64_t token = 0;
    std::set<uint32_t> ranks;
    std::string detail;  // the first report's
    int64_t until_ms = 0;  // 0: no stall pending
  } stall;
  // Train runs, by rank: the planner's estimate and the highest peak the rank has reported.
  struct RankMemory {
    std::string worker;
    uint64_t estimate = 0, workspace = 0, measured = 0;
  };
  std::vector<RankMemory> memory;
  std::map<std::string, uint32_t> handled;  // failure event kind -> how many (RunRecord.handled)
  ExtractState extract;  // kind == "extract" only

  bool terminal() const {
    return state == RunState::FINISHED || state == RunState::FAILED || state == RunState::CANCELLED;
  }
};

class CoordinatorImpl final : public Coordinator {
 public:
  CoordinatorImpl(CoordinatorOptions options, std::unique_ptr<storage::ShardStore> store)
      : options_(std::move(options)), store_(std::move(store)), router_(context_, zmq::socket_type::router) {}

  Status Init() {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::router_handover, 1);  // a restarted worker takes over its routing id
    router_.set(zmq::sockopt::router_mandatory, 1);  // sends to a vanished peer fail instead of vanishing
    STRATA_RETURN_IF_ERROR(SetUpCurve());
    try {
      router_.bind(options_.listen);
    } catch (const zmq::error_t& e) {
      return Unavailable("cannot listen on " + options_.listen + ": " + e.what() +
                         "; is another coordinator running there? (`strata down` stops it)");
    }
    return LoadRuns();
  }

  // Anyone who can send this socket a message controls the cluster (submits runs, whose specs
  // name files and code to load), so a network address without CURVE is refused outright.
  Status SetUpCurve() {
    if (options_.keys_dir.empty()) {
      if (!curve::RequiresCurve(options_.listen)) return Status::Ok();
      return InvalidArgument("refusing to listen on " + options_.listen +
                             " without authentication: anyone who can reach it could run commands. Make keys "
                             "with `strata keygen DIR` and pass --keys DIR (or listen on ipc://PATH)");
    }
    STRATA_ASSIGN_OR_RETURN(curve::ServerKeys keys, curve::LoadServerKeys(options_.keys_dir));
    // The ZAP handler must be bound before the ROUTER: without one libzmq admits any client.
    STRATA_ASSIGN_OR_RETURN(zap_, curve::ZapHandler::Bind(context_, keys.authorized, "coordinator"));
    curve::ConfigureServer(router_, keys.own);
    STRATA_LOG(kInfo) << "CURVE on: " << keys.authorized.size() << " authorized key(s) from " << options_.keys_dir;
    return Status::Ok();
  }

  void RequestStop() override { stop_requested_.store(true); }

  Status Run() override {
    STRATA_LOG(kInfo) << "coordinator listening on " << options_.listen << " with " << runs_.size()
                      << " runs loaded";
    if (options_.on_ready) options_.on_ready(Summary());
    int64_t last_status_ms = net::SteadyMs();
    std::vector<zmq::message_t> frames;
    while (!stop_requested_.load()) {
      // Handshakes wait on ZAP answers, so this thread serves them while it waits for messages.
      if (curve::PollWithZap(router_, zap_.get(), 100) && net::RecvMultipart(router_, &frames, 0)) HandleFrames(frames);
      CheckHeartbeats();
      if (options_.on_tick) options_.on_tick();
      PublishSnapshot();
      if (options_.on_status && net::SteadyMs() - last_status_ms >= 1000) {
        last_status_ms = net::SteadyMs();
        options_.on_status(Summary());
      }
    }
    STRATA_LOG(kInfo) << "coordinator stopping";
    return Status::Ok();
  }

 private:
  // One line for `systemctl status`: "serving ipc://...: 2/3 workers live, 1 runs running, 0 pending".
  std::string Summary() const {
    size_t live = 0, running = 0, pending = 0;
    for (const auto& [id, w] : workers_) live += w.state != WorkerState::LOST;
    for (const auto& [id, r] : runs_) {
      running += r.state == RunState::RUNNING;
      pending += r.state == RunState::PENDING;
    }
    return "serving " + options_.listen + ": " + std::to_string(live) + "/" + std::to_string(workers_.size()) +
           " workers live, " + std::to_string(running) + " runs running, " + std::to_string(pending) + " pending";
  }

  // ---------------------------------------------------------------- dispatch
  void HandleFrames(std::vector<zmq::message_t>& frames) {
    if (frames.size() != 2) {
      STRATA_LOG(kWarn) << "dropped a message of " << frames.size() << " frames (expected identity + envelope)";
      return;
    }
    const std::string identity(static_cast<const char*>(frames[0].data()), frames[0].size());
    auto decoded = schema::DecodeEnvelope(net::Bytes(frames[1]));
    if (!decoded.ok()) {
      STRATA_LOG(kWarn) << "dropped an undecodable message (" << frames[1].size()
                        << " bytes): " << decoded.status().message();
      Send(identity, schema::MakeErrorReply(0, decoded.status()));
      return;
    }
    auto root = (*decoded)->root();
    try {
      Dispatch(identity, root);
    } catch (const std::exception& e) {
      // A handler must never take the loop down: a malformed-but-decodable message lands here.
      STRATA_LOG(kError) << "handler failed: " << e.what();
      Send(identity, schema::MakeErrorReply(root.getRequestId(), InvalidArgument(std::string("bad request: ") + e.what())));
    }
  }

  void Dispatch(const std::string& identity, Envelope::Reader root) {
    const uint64_t rid = root.getRequestId();
    switch (root.which()) {
      case Envelope::REGISTER_WORKER: return HandleRegisterWorker(identity, rid, root.getRegisterWorker());
      case Envelope::HEARTBEAT: return HandleHeartbeat(identity, rid, root.getHeartbeat());
      case Envelope::TASK_EVENT: return HandleTaskEvent(identity, root.getTaskEvent());
      case Envelope::SUBMIT_RUN: return HandleSubmitRun(identity, rid, root.getSubmitRun());
      case Envelope::STATUS_REQUEST: return HandleStatusRequest(identity, rid, root.getStatusRequest());
      case Envelope::WORKERS_REQUEST: return HandleWorkersRequest(identity, rid);
      case Envelope::EVENTS_REQUEST: return HandleEventsRequest(identity, rid, root.getEventsRequest());
      case Envelope::CANCEL_RUN: return HandleCancelRun(identity, rid, root.getCancelRun());
      case Envelope::CHECKPOINTS_REQUEST: return HandleCheckpointsRequest(identity, rid, root.getCheckpointsRequest());
      case Envelope::ACTIVATIONS_REQUEST: return HandleActivationsRequest(identity, rid, root.getActivationsRequest());
      case Envelope::RUN_FILE_REQUEST: return HandleRunFileRequest(identity, rid, root.getRunFileRequest());
      case Envelope::SHARD_REPLICATED: return HandleShardReplicated(identity, root.getShardReplicated());
      case Envelope::SHUTDOWN: return HandleShutdown(identity, rid);
      case Envelope::ACK: return;
      default:
        STRATA_LOG(kWarn) << "dropped a message of unexpected kind " << static_cast<int>(root.which());
        Send(identity, schema::MakeErrorReply(rid, InvalidArgument("the coordinator does not accept this message kind")));
    }
  }

  void Send(const std::string& identity, const std::string& bytes) {
    try {
      router_.send(net::Buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router_.send(net::Buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      STRATA_LOG(kDebug) << "could not reach peer: " << e.what();  // peer gone: its timeout handles it
    }
  }

  void Ack(const std::string& identity, uint64_t rid) {
    schema::EnvelopeBuilder reply(rid);
    reply.root().setAck();
    Send(identity, reply.Serialize());
  }

  // ---------------------------------------------------------------- workers
  void HandleRegisterWorker(const std::string& identity, uint64_t rid, RegisterWorker::Reader req) {
    const std::string name = req.getName().cStr();
    if (name.empty()) {
      Send(identity, schema::MakeErrorReply(rid, InvalidArgument("registerWorker.name is empty")));
      return;
    }
    WorkerEntry& w = workers_[name];
    const bool known = !w.id.empty();
    // A worker we believe busy that registers without its task has restarted: the task is gone.
    const std::string previous_run = w.state == WorkerState::BUSY ? w.current_run : "";
    const uint32_t previous_pid = w.pid;
    w.id = name;
    w.identity = identity;
    w.host = req.getHost().cStr();
    w.pid = req.getPid();
    w.memory = schema::ReadMemoryStats(req.getMemory());
    w.store_path = req.getStorePath().cStr();
    w.data_address = req.getDataAddress().cStr();
    w.serve_address = req.getServeAddress().cStr();
    w.last_heartbeat_ms = net::SteadyMs();
    w.current_run = req.getCurrentRun().cStr();
    w.state = WorkerState::IDLE;
    if (!previous_run.empty() && previous_run != w.current_run) {
      auto run = runs_.find(previous_run);
      const std::string why = "worker " + name + " restarted (pid " + std::to_string(previous_pid) + " -> " +
                              std::to_string(w.pid) + ") and lost its task";
      if (run != runs_.end() && !run->second.terminal() && run->second.spec.is_extract()) {
        ExtractWorkerLost(run->second, w, why);
      } else if (run != runs_.end() && !run->second.terminal()) {
        TrainWorkerLost(run->second, name, why);
      }
    }
    if (!w.current_run.empty()) {
      // Re-registration while running (e.g. after a coordinator restart): re-attach if the run
      // still expects it, otherwise tell it to stop.
      auto it = runs_.find(w.current_run);
      if (it != runs_.end() && it->second.state == RunState::RUNNING &&
          std::count(it->second.workers.begin(), it->second.workers.end(), name)) {
        w.state = WorkerState::BUSY;
      } else {
        SendCancel(w, w.current_run, "the coordinator no longer runs this task");
        w.current_run.clear();
      }
    }
    ReconcileStoredCheckpoints(w, req);
    STRATA_LOG(kInfo) << (known ? "worker re-registered: " : "worker registered: ") << name << " pid " << w.pid
                      << " store " << w.store_path;
    schema::EnvelopeBuilder reply(rid);
    auto r = reply.root().initRegistered();
    r.setWorkerId(name);
    r.setHeartbeatIntervalMs(options_.heartbeat_interval_ms);
    Send(identity, reply.Serialize());
    Schedule();
  }

  void HandleHeartbeat(const std::string& identity, uint64_t rid, Heartbeat::Reader hb) {
    auto it = workers_.find(hb.getWorkerId().cStr());
    if (it == workers_.end() || it->second.state == WorkerState::LOST || it->second.pid == 0) {
      // Unknown (coordinator restarted), a placeholder this coordinator made at restart for a
      // running run's worker (it knows no address yet), or declared lost: ask it to register again.
      Send(identity, schema::MakeErrorReply(rid, NotFound("unknown worker; register again")));
      return;
    }
    WorkerEntry& w = it->second;
    w.identity = identity;
    w.last_heartbeat_ms = net::SteadyMs();
    w.memory = schema::ReadMemoryStats(hb.getMemory());
    const int64_t now_ms = net::NowUnixMs();
    if (w.memory_history.empty() || now_ms - w.memory_history.back().unix_ms >= 1000) {
      const uint64_t used = w.memory.total_bytes >= w.memory.free_bytes ? w.memory.total_bytes - w.memory.free_bytes : 0;
      w.memory_history.push_back({now_ms, used, w.memory.allocated_bytes});
      if (w.memory_history.size() > kMemoryHistory) w.memory_history.pop_front();
    }
  }

  void CheckHeartbeats() {
    const int64_t now = net::SteadyMs();
    if (now - last_check_ms_ < 100) return;
    last_check_ms_ = now;
    CheckReservations(now);
    for (auto& [id, w] : workers_) {
      if (w.state == WorkerState::LOST || now - w.last_heartbeat_ms <= options_.heartbeat_timeout_ms) continue;
      w.state = WorkerState::LOST;
      ++workers_lost_;
      STRATA_LOG(kWarn) << "worker " << id << " (pid " << w.pid << ") lost: no heartbeat for "
                        << (now - w.last_heartbeat_ms) << " ms";
      AbandonCopiesTo(id);
      if (!w.current_run.empty()) {
        auto run = runs_.find(w.current_run);
        if (run != runs_.end() && !run->second.terminal() && run->second.spec.is_extract()) {
          ExtractWorkerLost(run->second, w, "worker " + id + " (pid " + std::to_string(w.pid) + ") stopped sending heartbeats");
        } else if (run != runs_.end() && !run->second.terminal()) {
          w.current_run.clear();
          TrainWorkerLost(run->second, id, "worker " + id + " (pid " + std::to_string(w.pid) + ") stopped sending heartbeats");
        }
        w.current_run.clear();
      }
    }
    for (auto& [id, run] : runs_) {
      if (run.snapshot.until_ms > 0 && now >= run.snapshot.until_ms) SnapshotDone(run, false);
      if (run.stall.until_ms > 0 && now >= run.stall.until_ms) StallWindowClosed(run);
    }
    // A recovering run whose grace period just ended is re-planned onto the workers present.
    for (auto& [id, run] : runs_) {
      if (run.state == RunState::PENDING && run.recover_until_ms > 0 && now >= run.recover_until_ms) {
        Schedule();
        break;
      }
    }
  }

  // The ranks in `missing` of a running train run did not arrive at a collective (the hang
  // watchdog): each is lost to the run, even if it still heartbeats (a live one registers again
  // and is told to drop the task), and the run re-plans without them.
  void RanksStalled(RunEntry& run, const std::vector<uint32_t>& missing, const std::string& how) {
    std::string names;
    for (uint32_t r : missing) names += (names.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " on " + run.workers[r];
    AddEvent(run, "stalled", names + " did not arrive: " + how + "; treated as lost");
    for (uint32_t r : missing) {
      auto w = workers_.find(run.workers[r]);
      if (w != workers_.end() && w->second.state != WorkerState::LOST) {
        w->second.state = WorkerState::LOST;
        w->second.current_run.clear();
        ++workers_lost_;
        AbandonCopiesTo(w->first);
      }
    }
    TrainWorkerLost(run, run.workers[missing.front()], names + " stalled");
    Schedule();
  }

  // Every rank of the stalled attempt reported, or the window closed: blame the silent ones. If
  // every rank timed out, no one can be blamed (the fabric, or a hang inside the collective
  // itself): the run starts again from its latest checkpoint on the same workers.
  void StallWindowClosed(RunEntry& run) {
    RunEntry::Stall stall = std::move(run.stall);
    run.stall = {};
    if (run.state != RunState::RUNNING || stall.token != run.task_token) return;  // already recovering
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < run.workers.size(); ++r) {
      if (!stall.ranks.count(r)) missing.push_back(r);
    }
    const std::string how = std::to_string(stall.ranks.size()) + " of " + std::to_string(run.workers.size()) +
                            " ranks timed out in a collective (" + stall.detail + ")";
    if (!missing.empty()) return RanksStalled(run, missing, how);
    AddEvent(run, "stalled", "every rank timed out in a collective and none can be blamed: " + how +
                                 "; the run starts again from its latest checkpoint");
    TrainRecover(run, "a collective timed out on every rank: the run starts again");
    Schedule();
  }

  // A train run lost rank `lost`: stop the others, go back to pending, resume from the latest
  // complete checkpoint on whoever is there (see the top of this file).
  void TrainWorkerLost(RunEntry& run, const std::string& lost, const std::string& why) {
    AddEvent(run, "worker-lost", why + " at step " + std::to_string(run.step));
    TrainRecover(run, "rank on " + lost + " was lost: the run re-plans", lost);
  }

  // Stops the run's ranks still reachable but `lost` (told `why`), then resumes as TrainWorkerLost
  // says.
  void TrainRecover(RunEntry& run, const std::string& why, const std::string& lost = "") {
    CancelRanks(run, why, lost);
    ReleaseWorkers(run);
    run.workers.clear();
    ResumeFromLatest(run);
    const int64_t from = run.step;
    run.state = RunState::PENDING;
    run.recover_until_ms = net::SteadyMs() + options_.replace_grace_ms;
    AddEvent(run, "recovering",
             (from > 0 ? "resuming from the checkpoint " + (run.resume_run == run.id ? std::string() : "of " + run.resume_run + " ") +
                             "at step " + std::to_string(from)
                       : std::string("restarting from step 0 (no complete checkpoint)")) +
                 "; waiting up to " + std::to_string(options_.replace_grace_ms / 1000) + " s for " +
                 std::to_string(run.spec.parallel.workers()) + " workers, then re-planning onto the workers present");
    Persist(run);
  }

  // The newest complete checkpoint of `run_id` before step `before` that no rank found
  // unreadable; 0 if none.
  int64_t LastCheckpointStep(const std::string& run_id, int64_t before = std::numeric_limits<int64_t>::max()) {
    auto list = store_->ScanMetadata("ckpt/" + EncodeKeyString(run_id));
    if (!list.ok()) return 0;
    for (auto it = list->rbegin(); it != list->rend(); ++it) {
      auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(it->second);
      if (!manifest.ok()) continue;
      const int64_t step = manifest->root().getStep();
      if (step >= before || Unreadable(run_id, step)) continue;
      return step;
    }
    return 0;
  }

  bool Unreadable(const std::string& run_id, int64_t step) { return !UnreadableWhy(run_id, step).empty(); }

  // Why checkpoint (run_id, step) cannot be resumed from; empty when it can.
  std::string UnreadableWhy(const std::string& run_id, int64_t step) {
    auto mark = store_->GetMetadata("ckptbad/" + EncodeKeyString(run_id) + EncodeKeyU64(step));
    if (!mark.ok()) return "its mark could not be read (" + mark.status().message() + ")";
    if (!mark->has_value()) return "";
    std::string why((*mark)->begin(), (*mark)->end());
    return why.empty() ? "marked unreadable" : why;
  }

  // A worker registered with the list of committed checkpoints its store holds. A shard of a
  // committed checkpoint that this store should hold and does not (the store was salvaged after
  // damage, or replaced) leaves that checkpoint without it: when the shard has no copy elsewhere,
  // the checkpoint is marked unreadable (so resumes and `strata checkpoints` stop counting on it)
  // with an event naming the worker, run, step and why; a lost copy is an event only.
  void ReconcileStoredCheckpoints(const WorkerEntry& w, RegisterWorker::Reader req) {
    if (!req.getStoredCheckpointsKnown() || w.store_path.empty()) return;
    std::set<std::pair<std::string, int64_t>> held;
    for (auto c : req.getStoredCheckpoints()) held.insert({c.getKeyRun().cStr(), c.getStep()});
    RetryDeletedShards(w, held);
    auto manifests = store_->ScanMetadata("ckpt/");
    if (!manifests.ok()) {
      STRATA_LOG(kError) << "cannot reconcile the checkpoints of " << w.id << "'s store: " << manifests.status().message();
      return;
    }
    for (auto& [key, value] : *manifests) {
      auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(value);
      if (!manifest.ok()) continue;
      const std::string run_id = manifest->root().getRunId().cStr();
      const int64_t step = manifest->root().getStep();
      if (Unreadable(run_id, step)) continue;
      uint32_t rank = 0;
      for (auto shard : manifest->root().getShards()) {
        const uint32_t this_rank = rank++;
        const std::string key_run = shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : run_id;
        size_t locations = 1, missing_here = 0;
        if (shard.getStorePath() == w.store_path && !held.count({key_run, step})) ++missing_here;
        for (auto copy : shard.getCopies()) {
          ++locations;
          const std::string copy_key = copy.getKeyRun().size() > 0 ? copy.getKeyRun().cStr() : run_id;
          if (copy.getStorePath() == w.store_path && !held.count({copy_key, step})) ++missing_here;
        }
        if (missing_here == 0) continue;
        auto run = runs_.find(run_id);
        const std::string what = "missing shard: worker " + w.id + "'s store at " + w.store_path + " no longer holds rank " +
                                 std::to_string(this_rank) + "'s shard of the checkpoint at step " + std::to_string(step) +
                                 " (the store was salvaged after damage, or replaced)";
        if (missing_here < locations) {
          if (run != runs_.end()) AddEvent(run->second, "checkpoint-copy-lost", what + "; another copy remains");
          continue;
        }
        Status st = store_->PutMetadata("ckptbad/" + EncodeKeyString(run_id) + EncodeKeyU64(step), AsBytes(what), true);
        if (!st.ok()) STRATA_LOG(kError) << "could not mark the checkpoint of " << run_id << " at step " << step << " unreadable: " << st.ToString();
        if (run != runs_.end()) {
          AddEvent(run->second, "checkpoint-unreadable", what + "; it is marked unreadable and resumes use an older one");
        } else {
          STRATA_LOG(kWarn) << "run " << run_id << ": " << what;
        }
        break;
      }
    }
  }

  // A rank could not read the checkpoint the run resumed from. The checkpoint is kept (no data is
  // deleted) but marked unreadable, and the run starts again from the next older complete one
  // (the same run's checkpoints, or the source run's for `submit --resume`).
  void CheckpointUnreadable(RunEntry& run, uint32_t rank, ::CheckpointUnreadable::Reader u) {
    const std::string source = u.getSourceRun().cStr();
    const int64_t step = u.getStep();
    if (source != run.resume_run || step != run.resume_step) return;  // about an earlier attempt
    const std::string why = u.getWhy().cStr();
    Status st = store_->PutMetadata("ckptbad/" + EncodeKeyString(source) + EncodeKeyU64(step), AsBytes(why), true);
    if (!st.ok()) STRATA_LOG(kError) << "could not mark the checkpoint of " << source << " at step " << step << " unreadable: " << st.ToString();
    const std::string worker = rank < run.workers.size() ? run.workers[rank] : "?";
    CancelRanks(run, "the checkpoint to resume from is unreadable");
    ReleaseWorkers(run);
    run.workers.clear();
    const int64_t older = LastCheckpointStep(source, step);
    std::string what = "rank " + std::to_string(rank) + " on " + worker + " cannot read the checkpoint of " + source + " at step " +
                       std::to_string(step) + " (" + why + "); it is kept and marked unreadable";
    if (older == 0 && source != run.id) {
      AddEvent(run, "checkpoint-unreadable", what);
      return FailRun(run, "the checkpoint of " + source + " at step " + std::to_string(step) + " is unreadable and " + source +
                              " has no older complete one; resume from another run or start fresh");
    }
    if (run.resume_step_asked && source != run.id) {  // the user named this one: no other
      AddEvent(run, "checkpoint-unreadable", what);
      return FailRun(run, "the checkpoint of " + source + " at step " + std::to_string(step) + " that --resume named is unreadable (" +
                              why + "); " +
                              (older > 0 ? "resume from " + source + "@" + std::to_string(older) + ", the newest readable one before it"
                                         : std::string("no older checkpoint of it is readable")));
    }
    if (older == 0) {
      run.resume_run.clear();
      run.resume_step = 0;
      what += "; no older complete checkpoint: restarting from step 0";
    } else {
      run.resume_step = older;
      what += "; resuming from the checkpoint at step " + std::to_string(older) + " instead";
    }
    AddEvent(run, "checkpoint-unreadable", what);
    run.losses.resize(std::min<size_t>(run.losses.size(), static_cast<size_t>(older)));
    run.step = older;
    run.state = RunState::PENDING;
    Persist(run);
    Schedule();
  }

  // The newest complete checkpoint the run can resume from: its own, else the one it started from
  // (another run's, via --resume), else none (step 0).
  void ResumeFromLatest(RunEntry& run) {
    if (auto step = LastCheckpointStep(run.id); step > 0) {
      run.resume_run = run.id;
      run.resume_step = step;
    }
    const int64_t from = run.resume_run.empty() ? 0 : run.resume_step;
    run.losses.resize(std::min<size_t>(run.losses.size(), static_cast<size_t>(from)));
    run.step = from;
  }

  // A rank ran out of memory in step `oom.step`. No rank applied that step (the update waits on a
  // world all-reduce), so the run stops every rank, each leaving its state of the step before as a
  // checkpoint shard (a snapshot), re-plans for less memory per rank and replays the step from the
  // snapshot under the new plan: same global batch, same data, same losses. The reduced setting is
  // kept for the rest of the run.
  void TrainOutOfMemory(RunEntry& run, uint32_t rank, ::OutOfMemory::Reader oom) {
    if (run.state != RunState::RUNNING) return;
    const std::string worker = rank < run.workers.size() ? run.workers[rank] : "?";
    const int64_t failed_micro_batch = oom.getMicroBatch();
    AddEvent(run, "oom", "rank " + std::to_string(rank) + " on " + worker + " (" + FormatBytes(oom.getFreeBytes()) + " of " +
                             FormatBytes(oom.getTotalBytes()) + " free after it): " + oom.getDetail().cStr());
    const int64_t latest = LastCheckpointStep(run.id);
    const int64_t snapshot = oom.getIntactStep() > std::max<int64_t>(latest, run.resume_run == run.id ? 0 : run.resume_step)
                                 ? oom.getIntactStep() : 0;
    if (snapshot > 0) {
      run.snapshot.step = snapshot;
      run.snapshot.token = run.task_token;
      run.snapshot.ranks = run.workers.size();
      run.snapshot.until_ms = net::SteadyMs() + options_.snapshot_timeout_ms;
      // Shards of this step already here (the failed rank saves before it reports) are this
      // attempt's: pending_shards is cleared at every assignment.
      if (auto it = run.pending_shards.find(snapshot); it != run.pending_shards.end() && it->second.size() == run.snapshot.ranks) {
        CommitCheckpoint(run, snapshot);
        run.snapshot = {};
      }
    }
    const std::string stop = "rank " + std::to_string(rank) + " ran out of memory: the run re-plans and replays step " +
                             std::to_string(oom.getStep());
    std::vector<WorkerEntry*> ranks;
    for (auto& id : run.workers) {
      auto it = workers_.find(id);
      if (it == workers_.end() || it->second.state == WorkerState::LOST) continue;
      ranks.push_back(&it->second);
      SendCancel(it->second, run.id, stop, snapshot);
    }
    if (!ShrinkForMemory(run, worker, failed_micro_batch, oom.getFreeBytes(), oom.getTotalBytes(), ranks)) return;  // failed: nothing fits
    ReleaseWorkers(run);
    run.workers.clear();
    run.state = RunState::PENDING;
    if (run.snapshot.until_ms > 0) {  // the resume point is set once the snapshot is in (SnapshotDone)
      AddEvent(run, "snapshot", "waiting up to " + std::to_string(options_.snapshot_timeout_ms / 1000) + " s for the " +
                                    std::to_string(run.snapshot.ranks) + " ranks to save their state of step " + std::to_string(snapshot));
    } else {
      ResumeFromLatest(run);
    }
    Persist(run);
    Schedule();
  }

  // The snapshot of an out-of-memory stop is committed (`complete`), or did not come in time:
  // the run replays from its latest complete checkpoint.
  void SnapshotDone(RunEntry& run, bool complete) {
    if (!complete) {
      run.pending_shards.erase(run.snapshot.step);
      AddEvent(run, "snapshot", "the state of step " + std::to_string(run.snapshot.step) +
                                    " was not saved by every rank in time; replaying from the latest complete checkpoint");
    }
    run.snapshot = {};
    if (run.state == RunState::PENDING) {
      ResumeFromLatest(run);
      Persist(run);
      Schedule();
    }
  }

  // Changes the run's plan after an out-of-memory at `micro_batch` on `worker`: the planner's
  // cheapest change that fits (shard::Replan: a smaller micro-batch with more accumulation, then
  // recompute, a higher ZeRO stage, more stages); if the planner finds none (its estimate is what
  // just proved wrong), the micro-batch alone is halved while it can be. False when nothing is
  // left to try: the run has failed, saying what was needed against what is free.
  bool ShrinkForMemory(RunEntry& run, const std::string& worker, int64_t micro_batch, uint64_t free_bytes, uint64_t total_bytes,
                       const std::vector<WorkerEntry*>& ranks) {
    ParallelSpec& p = run.spec.parallel;
    const int64_t local = run.spec.local_batch();
    const int64_t current = run.spec.micro_batch_rows();
    std::string change;
    // The plan that failed, with its estimates: evaluated as if memory were unbounded (it did not
    // fit, which is the point). The view to re-plan on: the failed worker's memory as it reported
    // it once its task's memory is released; the other ranks, whose heartbeats may still count
    // their stopped tasks' memory, at their total.
    shard::ClusterView unbounded = ClusterOf(ranks, true), after = ClusterOf(ranks, true);
    for (auto& w : unbounded.workers) w.total_bytes = w.free_bytes = int64_t{1} << 50;
    for (auto& w : after.workers) {
      if (w.name != worker || total_bytes == 0) continue;
      w.total_bytes = static_cast<int64_t>(total_bytes);
      w.free_bytes = static_cast<int64_t>(std::min(free_bytes, total_bytes));
    }
    auto plan = shard::ChoosePlan(run.spec.model, shard::JobForRun(run.spec), unbounded);
    if (plan.ok()) {
      auto replanned = shard::Replan(*plan, run.spec.model, shard::JobForRun(run.spec), after,
                                     shard::ReplanReason::OutOfMemory(worker, micro_batch));
      if (replanned.ok() && replanned->plan.workers.size() == ranks.size()) {
        ApplyPlan(run, replanned->plan);
        change = replanned->description;
      }
    }
    if (change.empty()) {
      if (current <= 1) {
        FailRun(run, "out of memory at micro-batch 1 on " + worker + " and no plan for the run's " + std::to_string(ranks.size()) +
                         " workers fits their free memory: " + (plan.ok() ? std::string("the estimate was too low") : plan.status().message()) +
                         "; add workers, set parallel.recompute = true or parallel.zero = 3, or use workers with more memory, then "
                         "resume with `strata submit SPEC --resume " + run.id + "`");
        return false;
      }
      p.micro_batch = current / 2;
      while (local % p.micro_batch != 0) --p.micro_batch;
      change = "micro_batch " + std::to_string(current) + " -> " + std::to_string(p.micro_batch) + " (gradient accumulation " +
               std::to_string(local / current) + " -> " + std::to_string(local / p.micro_batch) + ")";
    }
    run.spec_toml = RunSpecToToml(run.spec);
    AddEvent(run, "replanned", change + "; global batch " + std::to_string(run.spec.train.global_batch) +
                                   " unchanged, so the losses continue as before");
    return true;
  }

  // The run's data-parallel size becomes `dp` (a divisor of the global batch); a fixed micro-batch
  // that no longer divides the rank's share becomes the largest that does.
  void SetDataParallel(RunEntry& run, int64_t dp) {
    ParallelSpec& p = run.spec.parallel;
    const int64_t local = run.spec.train.global_batch / dp;
    if (p.micro_batch > 0 && local % p.micro_batch != 0) p.micro_batch = std::gcd(local, p.micro_batch);
    p.dp = dp;
    run.spec_toml = RunSpecToToml(run.spec);
  }

  // After the grace period: the largest dp (pp and tp kept) that fits `available` workers and
  // divides the global batch; micro_batch shrinks to a divisor of the new per-rank batch.
  bool Replan(RunEntry& run, size_t available) {
    ParallelSpec& p = run.spec.parallel;
    const int64_t unit = p.pp * p.tp;
    const int64_t before = p.dp;
    for (int64_t dp = std::min<int64_t>(p.dp, static_cast<int64_t>(available) / unit); dp >= 1; --dp) {
      if (run.spec.train.global_batch % dp != 0) continue;
      SetDataParallel(run, dp);
      if (dp < before) run.grow_back_to_dp = std::max(run.grow_back_to_dp, before);
      AddEvent(run, "replanned", "dp " + std::to_string(before) + " -> " + std::to_string(dp) + " (pp=" +
                                     std::to_string(p.pp) + " tp=" + std::to_string(p.tp) + ", " +
                                     std::to_string(p.workers()) + " workers of the " + std::to_string(available) +
                                     " idle); global batch " + std::to_string(run.spec.train.global_batch) +
                                     " unchanged, so the losses continue as before");
      Persist(run);
      return true;
    }
    return false;
  }

  // ---------------------------------------------------------------- runs
  void HandleSubmitRun(const std::string& identity, uint64_t rid, SubmitRun::Reader req) {
    // The CLI resolved paths; check again here, as the coordinator is the one that must not start
    // a run it cannot finish.
    auto spec = ParseRunSpec(req.getSpecToml().cStr(), "", /*check_files=*/true);
    if (spec.ok() && !spec->model.init_from.empty()) {
      if (Status weights = model::CheckHfCheckpoint(spec->model.init_from, spec->model); !weights.ok()) spec = weights;
    }
    if (!spec.ok()) {
      Send(identity, schema::MakeErrorReply(rid, spec.status()));
      return;
    }
    RunEntry run;
    run.id = NewRunId(spec->name);
    run.name = spec->name;
    run.spec = *spec;
    ParallelSpec& parallel = run.spec.parallel;
    if (!run.spec.is_extract() && !parallel.automatic.count("pp") && parallel.pp > 1 && parallel.stages.empty()) {
      auto stages = shard::BalancedStages(run.spec.model, parallel.pp);  // what the planner estimated
      if (!stages.ok()) {
        Send(identity, schema::MakeErrorReply(rid, stages.status()));
        return;
      }
      parallel.stages = *stages;
    }
    run.spec_toml = RunSpecToToml(run.spec);
    run.created_ms = run.updated_ms = net::NowUnixMs();
    if (run.spec.is_extract()) {
      Status st = SizeExtract(run);
      if (!st.ok()) {
        Send(identity, schema::MakeErrorReply(rid, st));
        return;
      }
    }
    if (!run.spec.is_extract() && req.getResumeRun().size() > 0) {
      Status st = SetUpResume(run, req.getResumeRun().cStr(), req.getResumeStep());
      if (!st.ok()) {
        Send(identity, schema::MakeErrorReply(rid, st));
        return;
      }
    }
    // The run is accepted only once its record is durable: a submit that cannot be journaled (a
    // full disk) is refused, never a run that a restart would forget.
    if (Status st = PersistRecord(run); !st.ok()) {
      Send(identity, schema::MakeErrorReply(rid, Status(st.code(), "the run was not submitted: " + st.message())));
      return;
    }
    RunEntry& stored = runs_[run.id] = std::move(run);
    if (stored.spec.is_extract()) {
      AddEvent(stored, "submitted", "run " + stored.id + " submitted: capture " + std::to_string(stored.extract.total_rows) +
                                        " token rows of " + std::to_string(stored.spec.extract.layers.size()) + " layer(s) in " +
                                        std::to_string(stored.extract.total_chunks) + " chunks on " +
                                        std::to_string(stored.spec.parallel.dp) + " worker(s)");
    } else {
      // An auto-planned run's mesh is chosen when it starts (the `planned` event says what): until
      // then its parallel fields hold placeholders, so they are not printed as if decided.
      const ParallelSpec& p = stored.spec.parallel;
      std::string automatic;
      for (const std::string& field : p.automatic) automatic += (automatic.empty() ? "" : ", ") + field;
      const bool fixed_mesh = !p.automatic.count("dp") && !p.automatic.count("pp") && !p.automatic.count("tp");
      const std::string mesh = !fixed_mesh ? ", mesh planned when it starts (auto: " + automatic + ")"
                               : " on " + std::to_string(p.workers()) + " worker(s) (dp=" + std::to_string(p.dp) + " pp=" +
                                     std::to_string(p.pp) + " tp=" + std::to_string(p.tp) + ")" +
                                     (p.planned() ? "" : "; " + automatic + " planned when it starts");
      AddEvent(stored, "submitted", "run " + stored.id + " submitted: " + std::to_string(stored.spec.train.steps) +
                                        " steps" + mesh +
                                        (stored.resume_run.empty() ? std::string()
                                                                   : ", resuming from " + stored.resume_run + " at step " +
                                                                         std::to_string(stored.resume_step)));
    }
    Persist(stored);
    schema::EnvelopeBuilder reply(rid);
    reply.root().initSubmitted().setRunId(stored.id);
    Send(identity, reply.Serialize());
    Schedule();
  }

  // A run that starts from `source`'s checkpoint at `step` (0 = its latest): same model, any
  // mesh. It takes over the source's losses up to that step.
  Status SetUpResume(RunEntry& run, const std::string& source_id, int64_t step) {
    auto source = runs_.find(source_id);
    if (source == runs_.end()) return NotFound("--resume: no run '" + source_id + "'; `strata status` lists the runs");
    const RunSpec& from = source->second.spec;
    if (from.is_extract()) return InvalidArgument("--resume: run " + source_id + " is a capture and has no checkpoints");
    const ModelSpec &a = from.model, &b = run.spec.model;
    const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
        {"layers", {a.layers, b.layers}}, {"hidden", {a.hidden, b.hidden}}, {"heads", {a.heads, b.heads}},
        {"kv_heads", {a.kv_heads, b.kv_heads}}, {"ffn", {a.ffn, b.ffn}}, {"vocab", {a.vocab, b.vocab}},
        {"sequence", {a.sequence, b.sequence}}};
    if (a.family != b.family) {
      return InvalidArgument("--resume: model.family = \"" + b.family + "\" but run " + source_id + " trained \"" + a.family + "\"");
    }
    for (const auto& [field, values] : fields) {
      if (values.first != values.second) {
        return InvalidArgument("--resume: model." + std::string(field) + " = " + std::to_string(values.second) + " but run " +
                               source_id + " trained model." + field + " = " + std::to_string(values.first) +
                               "; a checkpoint resumes only the same model (the mesh may differ)");
      }
    }
    STRATA_ASSIGN_OR_RETURN(auto list, store_->ScanMetadata("ckpt/" + EncodeKeyString(source_id)));
    std::string steps;
    int64_t chosen = 0;
    for (auto& [key, value] : list) {
      auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(value);
      if (!manifest.ok()) continue;
      const int64_t s = manifest->root().getStep();
      steps += (steps.empty() ? "" : ", ") + std::to_string(s);
      if (s == step || (step == 0 && !Unreadable(source_id, s))) chosen = s;  // in step order: 0 ends on the latest readable
    }
    if (step != 0 && chosen == step) {
      if (const std::string why = UnreadableWhy(source_id, step); !why.empty()) {
        const int64_t older = LastCheckpointStep(source_id, step);
        return InvalidArgument("--resume " + source_id + "@" + std::to_string(step) + ": that checkpoint is unreadable (" + why +
                               "); " + (older > 0 ? "resume from " + source_id + "@" + std::to_string(older) + ", the newest readable one before it"
                                                  : std::string("no older checkpoint is readable")));
      }
    }
    if (chosen == 0) {
      return InvalidArgument("--resume: run " + source_id + " has no complete checkpoint" +
                             (step ? " at step " + std::to_string(step) : std::string()) +
                             (steps.empty() ? std::string("; set train.checkpoint_every in its spec") : "; complete ones: " + steps));
    }
    if (chosen >= run.spec.train.steps) {
      return InvalidArgument("--resume: train.steps = " + std::to_string(run.spec.train.steps) +
                             " leaves nothing to train after step " + std::to_string(chosen) + "; raise train.steps");
    }
    run.resume_run = source_id;
    run.resume_step = chosen;
    run.resume_step_asked = step != 0;
    run.step = chosen;
    run.losses.assign(source->second.losses.begin(),
                      source->second.losses.begin() + std::min<size_t>(chosen, source->second.losses.size()));
    // The history is the new run's too (persisted like its own steps, so a restart keeps it).
    STRATA_ASSIGN_OR_RETURN(auto history, store_->ScanMetadata("loss/" + EncodeKeyString(source_id)));
    for (auto& [key, value] : history) {
      auto report = schema::DecodedRecord<StepReport>::Decode(value);
      if (!report.ok() || report->root().getStep() > chosen) continue;
      STRATA_RETURN_IF_ERROR(store_->PutMetadata("loss/" + EncodeKeyString(run.id) + EncodeKeyU64(report->root().getStep()),
                                                 value, false));
    }
    return Status::Ok();
  }

  std::string NewRunId(const std::string& name) {
    std::string id;
    do {
      id = name + "-" + std::to_string(net::NowUnixMs() % 100000000) + "-" + std::to_string(rng_() % 1000);
    } while (runs_.count(id));
    return id;
  }

  // Starts pending runs, oldest first, on idle workers (sorted by name for reproducibility).
  void Schedule() {
    // Running extract runs first: their unassigned chunks are older work than any pending run.
    for (auto& [id, run] : runs_) {
      if (run.state == RunState::RUNNING && run.spec.is_extract()) ScheduleExtractChunks(run);
    }
    std::vector<RunEntry*> pending;
    for (auto& [id, run] : runs_) {
      if (run.state == RunState::PENDING) pending.push_back(&run);
    }
    std::sort(pending.begin(), pending.end(), [](auto* a, auto* b) { return a->created_ms < b->created_ms; });
    for (RunEntry* run : pending) {
      if (run->snapshot.until_ms > 0) return;  // FIFO: its replay waits for the ranks' snapshot
      std::vector<WorkerEntry*> idle;
      for (auto& [id, w] : workers_) {
        if (w.state == WorkerState::IDLE) idle.push_back(&w);
      }
      if (!run->spec.is_extract() && !run->spec.parallel.planned()) {
        if (!PlanRun(*run, &idle)) return;  // FIFO: it waits for workers (or it failed)
      }
      // A train run takes a worker per rank of its mesh; a capture, parallel.dp workers.
      auto wanted = static_cast<size_t>(run->spec.is_extract() ? run->spec.parallel.dp : run->spec.parallel.workers());
      if (run->spec.is_extract() && FailUnplaceableExtract(*run)) continue;
      if (idle.size() < wanted && run->recover_until_ms > 0 && net::SteadyMs() >= run->recover_until_ms &&
          Replan(*run, idle.size())) {
        wanted = static_cast<size_t>(run->spec.parallel.workers());
      }
      if (idle.size() < wanted) return;  // FIFO: a big run waits rather than being overtaken
      run->recover_until_ms = 0;
      idle.resize(wanted);
      if (run->spec.is_extract()) {
        StartExtract(*run, idle);
      } else {
        Assign(*run, idle);
      }
    }
  }

  // A capture wanting more workers (parallel.dp) than the cluster has fails at once with the
  // reason, as a train run whose mesh no plan can place does (PlanRun), rather than waiting
  // without a word. Counts every live worker, busy ones too; with none registered yet it waits.
  bool FailUnplaceableExtract(RunEntry& run) {
    const auto live = std::count_if(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.state != WorkerState::LOST; });
    if (live == 0 || run.spec.parallel.dp <= live) return false;
    run.state = RunState::FAILED;
    run.message = "cannot place the run: parallel.dp = " + std::to_string(run.spec.parallel.dp) + " capture workers but the cluster has " +
                  std::to_string(live) + " live worker(s); set parallel.dp <= " + std::to_string(live) + " or add workers (`strata up --workers N`)";
    AddEvent(run, "failed", run.message);
    Persist(run);
    return true;
  }

  // The workers' latest heartbeats as the planner sees them.
  static shard::ClusterView ClusterOf(const std::vector<WorkerEntry*>& workers, bool assume_all_free) {
    shard::ClusterView view;
    for (const WorkerEntry* w : workers) {
      if (w->memory.total_bytes == 0) continue;  // its first memory report has not arrived
      view.workers.push_back(shard::WorkerFromMemory(w->id, w->host, w->memory));
      if (assume_all_free) view.workers.back().free_bytes = view.workers.back().total_bytes;
    }
    return view;
  }

  // Fills the [parallel] fields a train run left to the planner ("auto") with the fastest plan
  // that fits the idle workers' free memory, and orders `idle` as its ranks. False when the run
  // must wait (workers busy or not yet reporting) or has failed (nothing could ever fit).
  bool PlanRun(RunEntry& run, std::vector<WorkerEntry*>* idle) {
    shard::ClusterView cluster = ClusterOf(*idle, false);
    if (cluster.workers.empty()) return false;
    // A fixed dp x pp x tp waits for that many idle workers (busy ones may free up, more may
    // register; `strata submit` refuses one larger than the live cluster unless --queue).
    const ParallelSpec& mesh = run.spec.parallel;
    if (!mesh.automatic.count("dp") && !mesh.automatic.count("pp") && !mesh.automatic.count("tp") &&
        mesh.workers() > static_cast<int64_t>(cluster.workers.size())) {
      return false;
    }
    auto plan = shard::ChoosePlan(run.spec.model, shard::JobForRun(run.spec), cluster);
    const bool others_busy = std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.state == WorkerState::BUSY; });
    if (!plan.ok()) {
      if (plan.status().code() == StatusCode::kResourceExhausted && others_busy) return false;  // more may free up
      run.state = RunState::FAILED;
      run.message = "cannot plan the run: " + plan.status().message();
      AddEvent(run, "failed", run.message);
      Persist(run);
      return false;
    }
    ApplyPlan(run, *plan);
    std::vector<WorkerEntry*> ranks;
    for (const auto& w : plan->workers) ranks.push_back(&workers_.at(w.worker));
    *idle = std::move(ranks);
    AddEvent(run, "planned", plan->why);
    Persist(run);
    return true;
  }

  // The plan's mesh into the run's [parallel] fields, its stage boundaries included, so the ranks
  // run what the planner estimated.
  void ApplyPlan(RunEntry& run, const shard::Plan& plan) {
    ParallelSpec& p = run.spec.parallel;
    p.dp = plan.dp, p.pp = plan.pp, p.tp = plan.tp, p.zero = plan.zero, p.micro_batch = plan.micro_batch;
    p.recompute = !plan.recompute.empty() && plan.recompute.front();
    p.stages.clear();
    if (plan.pp > 1) {
      for (const shard::LayerRange& stage : plan.stages) p.stages.push_back(stage.size());
    }
    p.automatic.clear();
    run.spec_toml = RunSpecToToml(run.spec);
  }

  // The planner's per-rank estimate for the run's mesh on these workers (0 where it has none).
  void EstimateMemory(RunEntry& run, const std::vector<WorkerEntry*>& workers) {
    run.memory.assign(workers.size(), {});
    for (size_t rank = 0; rank < workers.size(); ++rank) run.memory[rank].worker = workers[rank]->id;
    auto plan = shard::ChoosePlan(run.spec.model, shard::JobForRun(run.spec), ClusterOf(workers, true));
    if (!plan.ok()) return;
    for (const auto& w : plan->workers) {
      for (auto& m : run.memory) {
        if (m.worker != w.worker) continue;
        m.workspace = static_cast<uint64_t>(w.memory.workspace);
        m.estimate = static_cast<uint64_t>(w.memory.total() - w.memory.workspace);
      }
    }
  }

  // How ranks on other hosts reach each copy of each shard: the store server of the worker that
  // holds it, while that worker is alive (a lost one's would only time out).
  void AddServeAddresses(CheckpointManifest::Builder manifest) {
    auto address_of = [&](const std::string& store_path) -> std::string {
      const WorkerEntry* w = WorkerWithStore(store_path);
      return w && w->state != WorkerState::LOST ? w->serve_address : "";
    };
    for (auto shard : manifest.getShards()) {
      shard.setServeAddress(address_of(shard.getStorePath().cStr()));
      for (auto copy : shard.getCopies()) copy.setServeAddress(address_of(copy.getStorePath().cStr()));
    }
  }

  void Assign(RunEntry& run, const std::vector<WorkerEntry*>& workers) {
    // Every rank gets the manifest of the checkpoint to start from and reads what its place in
    // the mesh needs from the stores it names.
    std::optional<schema::DecodedRecord<CheckpointManifest>> resume;
    if (!run.resume_run.empty()) {
      auto bytes = store_->GetMetadata("ckpt/" + EncodeKeyString(run.resume_run) + EncodeKeyU64(run.resume_step));
      if (bytes.ok() && *bytes) {
        auto decoded = schema::DecodedRecord<CheckpointManifest>::Decode(**bytes);
        if (decoded.ok()) resume.emplace(std::move(decoded).value());
      }
      if (!resume) {  // nothing was assigned: fail without touching the workers
        run.state = RunState::FAILED;
        run.message = "the checkpoint of " + run.resume_run + " at step " + std::to_string(run.resume_step) +
                      " to resume from is gone from the coordinator's store";
        AddEvent(run, "failed", run.message);
        Persist(run);
        return;
      }
    }
    run.state = RunState::RUNNING;
    run.workers.clear();
    run.finished_ranks.clear();
    run.pending_shards.clear();  // shards of an earlier attempt never complete a checkpoint of this one
    run.pending_copies.clear();
    run.task_token = rng_();
    for (auto* w : workers) run.workers.push_back(w->id);
    EstimateMemory(run, workers);
    for (uint32_t rank = 0; rank < workers.size(); ++rank) {
      WorkerEntry& w = *workers[rank];
      w.state = WorkerState::BUSY;
      w.current_run = run.id;
      schema::EnvelopeBuilder msg;
      auto a = msg.root().initAssignTask();
      a.setRunId(run.id);
      a.setSpecToml(run.spec_toml);
      a.setRank(rank);
      a.setWorldSize(workers.size());
      a.setTaskToken(run.task_token);
      auto peers = a.initPeerDataAddresses(workers.size());
      for (uint32_t i = 0; i < workers.size(); ++i) peers.set(i, workers[i]->data_address);
      if (resume) {
        a.setResumeFrom(resume->root());
        AddServeAddresses(a.getResumeFrom());
      }
      Send(w.identity, msg.Serialize());
    }
    std::string names;
    for (auto& n : run.workers) names += (names.empty() ? "" : ", ") + n;
    AddEvent(run, "assigned", "running on " + names);
    Persist(run);
  }

  void HandleTaskEvent(const std::string& identity, TaskEvent::Reader ev) {
    auto it = runs_.find(ev.getRunId().cStr());
    if (it == runs_.end()) return;
    RunEntry& run = it->second;
    if (run.terminal()) return;
    if (ev.which() == TaskEvent::NOTICE) {
      const auto it_w = workers_.find(identity);
      AddEvent(run, ev.getNotice().getKind().cStr(),
               (it_w != workers_.end() ? it_w->first + ": " : std::string()) + ev.getNotice().getMessage().cStr());
      return;
    }
    if (run.spec.is_extract()) return HandleExtractEvent(identity, run, ev);
    // Reports of an earlier attempt of this run (a rank still stopping after the run re-planned)
    // change nothing, except the shards of the snapshot that attempt was asked to leave.
    const uint64_t token = ev.getTaskToken();
    const bool snapshot_shard = ev.which() == TaskEvent::CHECKPOINT_SAVED && run.snapshot.token != 0 && token == run.snapshot.token &&
                                ev.getCheckpointSaved().getStep() == run.snapshot.step;
    if (token != 0 && run.task_token != 0 && token != run.task_token && !snapshot_shard) return;
    const uint32_t rank = ev.getRank();
    switch (ev.which()) {
      case TaskEvent::STARTED:
        break;
      case TaskEvent::STEP: {
        auto s = ev.getStep();
        if (rank < run.memory.size()) {
          auto& m = run.memory[rank];
          m.measured = std::max({m.measured, s.getSchedulePeakBytes(), s.getUpdatePeakBytes()});
        }
        if (rank != 0) break;  // every rank sees the same all-reduced loss; rank 0 reports it
        const int64_t step = s.getStep();
        if (step < 1) break;
        // A re-registered worker resends its reports: older steps only fill gaps.
        run.step = std::max(run.step, step);
        if (static_cast<int64_t>(run.losses.size()) < step) run.losses.resize(step, 0.0);
        run.losses[step - 1] = s.getLoss();
        if (step == run.step) run.tokens_per_second = s.getTokensPerSecond();
        run.updated_ms = net::NowUnixMs();
        // Not synced: after a crash the run resumes from a checkpoint and re-reports later steps.
        const std::string bytes = schema::StructToBytes(s);
        Status st = store_->PutMetadata("loss/" + EncodeKeyString(run.id) + EncodeKeyU64(step), AsBytes(bytes), false);
        if (!st.ok()) STRATA_LOG(kError) << "could not persist step " << step << " of " << run.id << ": " << st.ToString();
        AppendMetrics(run, step, s);
        break;
      }
      case TaskEvent::CHECKPOINT_SAVED: {
        auto shard = ev.getCheckpointSaved();
        // A resent report of a checkpoint already committed changes nothing.
        auto committed = store_->GetMetadata("ckpt/" + EncodeKeyString(run.id) + EncodeKeyU64(shard.getStep()));
        if (committed.ok() && committed->has_value()) break;
        auto& by_rank = run.pending_shards[shard.getStep()];
        by_rank[rank] = schema::StructToBytes(shard);
        if (by_rank.size() == (snapshot_shard ? run.snapshot.ranks : run.workers.size())) {
          // A snapshot (an out-of-memory replay's start, on the same workers) is not copied.
          if (snapshot_shard || !ReplicateAcrossHosts(run, shard.getStep())) CommitCheckpoint(run, shard.getStep());
          if (snapshot_shard) SnapshotDone(run, true);
        }
        break;
      }
      case TaskEvent::OUT_OF_MEMORY:
        TrainOutOfMemory(run, rank, ev.getOutOfMemory());
        break;
      case TaskEvent::STALLED: {
        // The hang watchdog: the rank that did not arrive is lost to this run, heartbeats or not.
        if (run.state != RunState::RUNNING) break;
        auto stalled = ev.getStalled();
        if (!stalled.getRankKnown()) {  // decided once the window closes (StallWindowClosed)
          if (run.stall.until_ms == 0 || run.stall.token != run.task_token) {
            run.stall = {run.task_token, {}, stalled.getDetail().cStr(), net::SteadyMs() + options_.stall_window_ms};
          }
          run.stall.ranks.insert(rank);
          if (run.stall.ranks.size() == run.workers.size()) StallWindowClosed(run);
          break;
        }
        const uint32_t missing = stalled.getMissingRank();
        if (missing >= run.workers.size()) break;
        const std::string waiter = rank < run.workers.size() ? run.workers[rank] : "?";
        RanksStalled(run, {missing}, "rank " + std::to_string(rank) + " on " + waiter + " gave up (" + stalled.getDetail().cStr() + ")");
        break;
      }
      case TaskEvent::FINISHED:
        run.finished_ranks.insert(rank);
        if (run.finished_ranks.size() == run.workers.size()) {
          run.state = RunState::FINISHED;
          AddEvent(run, "finished", "finished " + std::to_string(run.step) + " steps, final loss " +
                                        (run.losses.empty() ? "n/a" : std::to_string(run.losses.back())));
          ReleaseWorkers(run);
          Persist(run);
          Schedule();
        }
        break;
      case TaskEvent::CHECKPOINT_UNREADABLE:
        CheckpointUnreadable(run, rank, ev.getCheckpointUnreadable());
        break;
      case TaskEvent::FAILED:
        AddEvent(run, "rank-failed", "rank " + std::to_string(rank) + ": " + ev.getFailed().cStr());
        FailRun(run, std::string("rank ") + std::to_string(rank) + " failed: " + ev.getFailed().cStr());
        break;
      default:
        break;
    }
  }

  const WorkerEntry* WorkerWithStore(const std::string& store_path) const {
    for (const auto& [id, w] : workers_) {
      if (w.store_path == store_path) return &w;
    }
    return nullptr;
  }

  // A checkpoint must outlive any one host with its disks: when the live workers span hosts,
  // each rank's shard is copied to a store on another host (the worker there pulls it from the
  // shard's store server: ReplicateShard), and the checkpoint is committed once every copy is
  // durable (HandleShardReplicated). True when copies were asked for; false when the cluster is
  // one host (commit now), or a shard cannot be copied (its worker serves no store: committed
  // without copies, and the journal says so).
  bool ReplicateAcrossHosts(RunEntry& run, int64_t step) {
    std::set<std::string> hosts;
    for (const auto& [id, w] : workers_) {
      if (w.state != WorkerState::LOST) hosts.insert(w.host);
    }
    if (hosts.size() < 2) return false;
    struct Planned {
      uint32_t rank;
      const WorkerEntry* origin;
      const WorkerEntry* target;
      schema::DecodedRecord<CheckpointShard> shard;
    };
    std::vector<Planned> plan;
    std::map<std::string, int> load;  // copies per target, to spread them
    for (const auto& [rank, bytes] : run.pending_shards[step]) {
      auto decoded = schema::DecodedRecord<CheckpointShard>::Decode(AsBytes(bytes));
      if (!decoded.ok()) return false;
      const WorkerEntry* origin = WorkerWithStore(decoded->root().getStorePath().cStr());
      const WorkerEntry* target = nullptr;
      for (const auto& [id, w] : workers_) {
        if (!origin || w.state == WorkerState::LOST || w.host == origin->host || w.identity.empty()) continue;
        if (!target || load[w.id] < load[target->id]) target = &w;
      }
      if (!origin || origin->serve_address.empty() || !target) {
        AddEvent(run, "checkpoint-not-copied", "checkpoint at step " + std::to_string(step) + ": rank " + std::to_string(rank) +
                                                   "'s shard has no copy on another host (" +
                                                   (!origin ? "its store's worker is unknown" : origin->serve_address.empty() ? "worker " + origin->id + " serves no store: start it with --serve-address" : "no live worker on another host") +
                                                   "); losing its host loses this checkpoint");
        return false;
      }
      ++load[target->id];
      plan.push_back({rank, origin, target, std::move(decoded).value()});
    }
    auto& copies = run.pending_copies[step];
    copies.clear();
    for (const Planned& p : plan) {
      const std::string key_run = run.id + "/copy-of-rank-" + std::to_string(p.rank);
      schema::EnvelopeBuilder msg;
      auto r = msg.root().initReplicateShard();
      r.setRunId(run.id);
      r.setStep(step);
      r.setRank(p.rank);
      r.setSource(p.origin->serve_address);
      r.setSourceKeyRun(p.shard.root().getKeyRun().size() > 0 ? p.shard.root().getKeyRun() : capnp::Text::Reader(run.id));
      r.setKeyRun(key_run);
      r.setTensors(p.shard.root().getTensors());
      Send(p.target->identity, msg.Serialize());
      copies[p.rank] = {p.target->id, key_run, ""};
    }
    return true;
  }

  void HandleShardReplicated(const std::string& identity, ShardReplicated::Reader done) {
    auto run_it = runs_.find(done.getRunId().cStr());
    if (run_it == runs_.end()) return;
    RunEntry& run = run_it->second;
    const int64_t step = done.getStep();
    auto step_it = run.pending_copies.find(step);
    if (step_it == run.pending_copies.end()) return;  // committed, or abandoned
    auto copy = step_it->second.find(done.getRank());
    if (copy == step_it->second.end() || copy->second.target != identity || copy->second.key_run != done.getKeyRun().cStr()) return;
    if (done.getError().size() > 0) {
      AbandonCopies(run, step, "copying rank " + std::to_string(done.getRank()) + "'s shard to " + identity + " failed: " + done.getError().cStr());
      return;
    }
    copy->second.store_path = done.getStorePath().cStr();
    for (const auto& [rank, c] : step_it->second) {
      if (c.store_path.empty()) return;
    }
    CommitCheckpoint(run, step);
  }

  // A copy that will not come (its worker failed it or was lost): the checkpoint is not committed;
  // the run's latest complete checkpoint stays the one before, and its next one is copied afresh.
  void AbandonCopies(RunEntry& run, int64_t step, const std::string& why) {
    run.pending_copies.erase(step);
    run.pending_shards.erase(step);
    AddEvent(run, "checkpoint-incomplete", "checkpoint at step " + std::to_string(step) + " not committed: " + why +
                                               "; the latest complete checkpoint is still the one before it");
  }

  void AbandonCopiesTo(const std::string& worker) {
    for (auto& [id, run] : runs_) {
      for (auto step_it = run.pending_copies.begin(); step_it != run.pending_copies.end();) {
        const int64_t step = step_it->first;
        const bool waiting_on_it = std::any_of(step_it->second.begin(), step_it->second.end(), [&](const auto& c) {
          return c.second.target == worker && c.second.store_path.empty();
        });
        ++step_it;
        if (waiting_on_it) AbandonCopies(run, step, "worker " + worker + ", which was making a copy of a shard on another host, was lost");
      }
    }
  }

  void CommitCheckpoint(RunEntry& run, int64_t step) {
    auto& by_rank = run.pending_shards[step];
    const auto copies_it = run.pending_copies.find(step);
    capnp::MallocMessageBuilder message;
    auto manifest = message.initRoot<CheckpointManifest>();
    manifest.setRunId(run.id);
    manifest.setStep(step);
    manifest.setCommittedUnixMs(net::NowUnixMs());
    auto shards = manifest.initShards(by_rank.size());
    size_t i = 0, copied = 0;
    for (auto& [rank, bytes] : by_rank) {
      auto decoded = schema::DecodedRecord<CheckpointShard>::Decode(AsBytes(bytes));
      if (decoded.ok()) {
        shards.setWithCaveats(i, decoded->root());
        auto shard = shards[i];
        if (const WorkerEntry* origin = WorkerWithStore(decoded->root().getStorePath().cStr())) shard.setHost(origin->host);
        if (copies_it != run.pending_copies.end() && copies_it->second.count(rank)) {
          const RunEntry::PendingCopy& c = copies_it->second.at(rank);
          auto list = shard.initCopies(1);
          list[0].setStorePath(c.store_path);
          list[0].setKeyRun(c.key_run);
          auto target = workers_.find(c.target);
          if (target != workers_.end()) list[0].setHost(target->second.host);
          ++copied;
        }
      }
      ++i;
    }
    const std::string bytes = schema::StructToBytes(manifest.asReader());
    Status st = store_->PutMetadata("ckpt/" + EncodeKeyString(run.id) + EncodeKeyU64(step), AsBytes(bytes), true);
    if (!st.ok()) {
      STRATA_LOG(kError) << "could not commit checkpoint manifest: " << st.ToString();
      return;
    }
    run.pending_copies.erase(step);
    const size_t shard_count = by_rank.size();
    run.pending_shards.erase(step);
    AddEvent(run, "checkpoint", "checkpoint at step " + std::to_string(step) + " committed (" + std::to_string(shard_count) +
                                    " shards" + (copied == shard_count && copied > 0 ? ", each with a copy on another host" : "") + ")");
    ApplyRetention(run);
    MaybeGrowBack(run, step);
  }

  // train.keep_checkpoints = N: once a checkpoint is complete, readable ones older than the newest
  // N go. Safe order: a tombstone per shard location first, then the manifest (from then on no
  // resume or export can choose it), then each holder is told to delete its shard; a holder that
  // is away is told again when it registers (ReconcileStoredCheckpoints) until its store no
  // longer holds it. Unreadable checkpoints are kept for inspection, and a checkpoint a live run
  // resumes from is never deleted.
  void ApplyRetention(RunEntry& run) {
    const int64_t keep = run.spec.train.keep_checkpoints;
    if (keep <= 0) return;
    auto list = store_->ScanMetadata("ckpt/" + EncodeKeyString(run.id));
    if (!list.ok()) return;
    int64_t readable = 0;
    for (auto it = list->rbegin(); it != list->rend(); ++it) {
      auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(it->second);
      if (!manifest.ok()) continue;
      const int64_t step = manifest->root().getStep();
      if (Unreadable(run.id, step) || ++readable <= keep) continue;
      bool in_use = false;
      for (const auto& [id, other] : runs_) in_use = in_use || (!other.terminal() && other.resume_run == run.id && other.resume_step == step);
      if (in_use) continue;
      std::vector<std::pair<std::string, std::string>> locations;  // store path, key run
      for (auto shard : manifest->root().getShards()) {
        locations.emplace_back(shard.getStorePath().cStr(), shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : run.id);
        for (auto copy : shard.getCopies()) {
          locations.emplace_back(copy.getStorePath().cStr(), copy.getKeyRun().size() > 0 ? copy.getKeyRun().cStr() : run.id);
        }
      }
      Status st = Status::Ok();
      for (const auto& [store_path, key_run] : locations) {
        if (st.ok()) st = store_->PutMetadata(DeletedShardKey(store_path, key_run, step), {}, true);
      }
      if (st.ok()) st = store_->DeleteMetadata(it->first);
      if (!st.ok()) {
        STRATA_LOG(kError) << "run " << run.id << ": could not retire the checkpoint at step " << step << ": " << st.ToString();
        return;
      }
      for (const auto& [store_path, key_run] : locations) {
        if (const WorkerEntry* holder = WorkerWithStore(store_path); holder && holder->state != WorkerState::LOST) {
          SendDeleteCheckpoint(*holder, key_run, step);
        }
      }
      AddEvent(run, "checkpoint-deleted", "checkpoint at step " + std::to_string(step) + " deleted from " +
                                              std::to_string(locations.size()) + " store(s) (train.keep_checkpoints = " +
                                              std::to_string(keep) + ")");
    }
  }

  static std::string DeletedShardKey(const std::string& store_path, const std::string& key_run, int64_t step) {
    return "ckptdel/" + EncodeKeyString(store_path) + EncodeKeyString(key_run) + EncodeKeyU64(step);
  }

  void SendDeleteCheckpoint(const WorkerEntry& w, const std::string& key_run, int64_t step) {
    schema::EnvelopeBuilder msg;
    auto d = msg.root().initDeleteCheckpoint();
    d.setKeyRun(key_run);
    d.setStep(step);
    Send(w.identity, msg.Serialize());
  }

  // Shards retention deleted that this worker's store still holds are deleted again; tombstones
  // of shards it no longer holds are done.
  void RetryDeletedShards(const WorkerEntry& w, const std::set<std::pair<std::string, int64_t>>& held) {
    const std::string prefix = "ckptdel/" + EncodeKeyString(w.store_path);
    auto tombstones = store_->ScanMetadata(prefix);
    if (!tombstones.ok()) return;
    for (auto& [key, value] : *tombstones) {
      std::string_view rest(key);
      rest.remove_prefix(prefix.size());
      std::string key_run;
      uint64_t step = 0;
      if (!storage::ConsumeKeyString(&rest, &key_run) || !storage::ConsumeKeyU64(&rest, &step)) continue;
      if (held.count({key_run, static_cast<int64_t>(step)})) {
        SendDeleteCheckpoint(w, key_run, static_cast<int64_t>(step));
      } else {
        (void)store_->DeleteMetadata(key);
      }
    }
  }

  // A run that a lost worker made smaller (Replan) takes workers back at a complete checkpoint:
  // when enough are idle again for a larger dp (up to what it ran with) and the time that saves
  // over the remaining steps - each rank's share of the same global batch shrinks by dp/new_dp -
  // is at least --grow-back-min-saving-s, its ranks stop and it resumes from this checkpoint on
  // the larger mesh. Same global batch, so the losses continue as before.
  void MaybeGrowBack(RunEntry& run, int64_t step) {
    ParallelSpec& p = run.spec.parallel;
    if (options_.grow_back_min_saving_s < 0 || run.state != RunState::RUNNING || run.spec.is_extract() ||
        run.snapshot.until_ms > 0 || run.grow_back_to_dp <= p.dp || run.tokens_per_second <= 0 || run.step < step) {
      return;
    }
    const int64_t unit = p.pp * p.tp;
    int64_t idle = 0;
    for (const auto& [id, w] : workers_) idle += w.state == WorkerState::IDLE;
    int64_t grow_to = 0;
    for (int64_t dp = run.grow_back_to_dp; dp > p.dp && !grow_to; --dp) {
      if (run.spec.train.global_batch % dp == 0 && (dp - p.dp) * unit <= idle) grow_to = dp;
    }
    if (!grow_to) return;
    const double step_seconds =
        static_cast<double>(run.spec.train.global_batch * run.spec.model.sequence) / run.tokens_per_second;
    const double saving = static_cast<double>(run.spec.train.steps - step) * step_seconds *
                          (1.0 - static_cast<double>(p.dp) / static_cast<double>(grow_to));
    if (saving < options_.grow_back_min_saving_s) return;
    char estimate[96];
    std::snprintf(estimate, sizeof(estimate), "about %.0f s saved over the %lld steps left", saving,
                  static_cast<long long>(run.spec.train.steps - step));
    const int64_t before = p.dp;
    CancelRanks(run, "the run grows back to more workers");
    ReleaseWorkers(run);
    run.workers.clear();
    SetDataParallel(run, grow_to);
    if (grow_to >= run.grow_back_to_dp) run.grow_back_to_dp = 0;
    ResumeFromLatest(run);
    run.state = RunState::PENDING;
    AddEvent(run, "grew", "dp " + std::to_string(before) + " -> " + std::to_string(grow_to) + " (workers are idle again): " +
                              "resuming from the checkpoint at step " + std::to_string(run.step) + ", " + estimate +
                              "; global batch " + std::to_string(run.spec.train.global_batch) +
                              " unchanged, so the losses continue as before");
    Persist(run);
    Schedule();
  }

  void FailRun(RunEntry& run, const std::string& why) {
    run.state = RunState::FAILED;
    run.message = why;
    AddEvent(run, "failed", why);
    CancelRanks(run, why);
    ReleaseWorkers(run);
    Persist(run);
    Schedule();
  }

  void SendCancel(const WorkerEntry& w, const std::string& run_id, const std::string& why, int64_t snapshot_step = 0) {
    schema::EnvelopeBuilder msg;
    auto c = msg.root().initCancelTask();
    c.setRunId(run_id);
    c.setReason(why);
    c.setSnapshotStep(snapshot_step);
    Send(w.identity, msg.Serialize());
  }

  // Tells every live worker of the run (but `except`) to stop its task.
  void CancelRanks(const RunEntry& run, const std::string& why, const std::string& except = "") {
    for (const auto& id : run.workers) {
      auto it = workers_.find(id);
      if (id != except && it != workers_.end() && it->second.state != WorkerState::LOST) SendCancel(it->second, run.id, why);
    }
  }

  void ReleaseWorkers(RunEntry& run) {
    for (auto& id : run.workers) {
      auto it = workers_.find(id);
      if (it == workers_.end() || it->second.current_run != run.id) continue;
      it->second.current_run.clear();
      if (it->second.state == WorkerState::BUSY) it->second.state = WorkerState::IDLE;
    }
  }

  void HandleCancelRun(const std::string& identity, uint64_t rid, RunRef::Reader req) {
    auto it = runs_.find(req.getRunId().cStr());
    if (it == runs_.end()) {
      Send(identity, schema::MakeErrorReply(rid, NotFound(UnknownRun(req.getRunId().cStr()))));
      return;
    }
    RunEntry& run = it->second;
    if (run.terminal()) {
      Send(identity, schema::MakeErrorReply(rid, InvalidArgument("run " + run.id + " already " + schema::RunStateName(run.state))));
      return;
    }
    for (auto& id : run.workers) {
      auto w = workers_.find(id);
      if (w != workers_.end() && w->second.state != WorkerState::LOST) SendCancel(w->second, run.id, "cancelled by user");
    }
    run.state = RunState::CANCELLED;
    run.message = "cancelled by user";
    AddEvent(run, "cancelled", "cancelled by user at step " + std::to_string(run.step));
    ReleaseWorkers(run);
    Persist(run);
    Ack(identity, rid);
    Schedule();
  }

  std::string UnknownRun(const std::string& id) {
    return "no run '" + id + "'; `strata status` lists the runs";
  }

  // ---------------------------------------------------------------- extract runs
  int64_t TotalSteps(const RunEntry& run) const {
    return run.spec.is_extract() ? static_cast<int64_t>(run.extract.total_chunks) : run.spec.train.steps;
  }

  // Counts the run's rows and chunks from its data file (the coordinator's host sees the same
  // data path as the workers, as for training runs).
  static Status SizeExtract(RunEntry& run) {
    STRATA_ASSIGN_OR_RETURN(TokenFileLayout layout, ReadTokenFileLayout(run.spec.data.path, run.spec.data.format));
    const int64_t tokens = static_cast<int64_t>(layout.tokens);
    const int64_t sequences = ExtractSequences(run.spec, tokens);
    if (sequences <= 0) {
      return InvalidArgument("data.path = \"" + run.spec.data.path + "\" holds fewer tokens than one sequence (model.sequence = " +
                             std::to_string(run.spec.model.sequence) + "); nothing to capture");
    }
    run.extract.total_chunks = static_cast<uint64_t>(ExtractChunks(run.spec, tokens));
    run.extract.total_rows = static_cast<uint64_t>(sequences * run.spec.model.sequence);
    return Status::Ok();
  }

  static std::string TaskKey(const RunEntry& run, const std::string& worker) {
    return "task/" + EncodeKeyString(run.id) + EncodeKeyString(worker);
  }

  // Chunks of the run neither stored, nor in a running task, nor waiting for a lost worker.
  static std::vector<uint64_t> UnassignedChunks(const RunEntry& run) {
    std::vector<uint64_t> out;
    const ExtractState& x = run.extract;
    for (uint64_t c = 0; c < x.total_chunks; ++c) {
      if (x.stored.count(c)) continue;
      bool taken = false;
      for (const auto& [w, chunks] : x.tasks) taken = taken || chunks.count(c);
      for (const auto& [w, r] : x.reserved) taken = taken || r.chunks.count(c);
      if (!taken) out.push_back(c);
    }
    return out;
  }

  // Splits `chunks` into contiguous blocks, one per worker (rows of one block sit in one store,
  // so a query over a row range reads few stores).
  void AssignBlocks(RunEntry& run, const std::vector<uint64_t>& chunks, const std::vector<WorkerEntry*>& workers) {
    const size_t n = std::min(workers.size(), chunks.size());
    for (size_t i = 0; i < n; ++i) {
      const size_t begin = chunks.size() * i / n, end = chunks.size() * (i + 1) / n;
      AssignExtractTask(run, *workers[i], std::vector<uint64_t>(chunks.begin() + begin, chunks.begin() + end));
    }
  }

  void StartExtract(RunEntry& run, const std::vector<WorkerEntry*>& workers) {
    run.state = RunState::RUNNING;
    run.workers.clear();
    run.extract.started_ms = net::SteadyMs();
    run.extract.computed_rows = 0;
    run.extract.computed_bytes = 0;
    const std::vector<uint64_t> chunks = UnassignedChunks(run);
    if (chunks.empty()) return FinishExtract(run);
    AssignBlocks(run, chunks, workers);
    std::string names;
    for (auto& n : run.workers) names += (names.empty() ? "" : ", ") + n;
    AddEvent(run, "assigned", std::to_string(chunks.size()) + " chunks on " + names);
    Persist(run);
  }

  void AssignExtractTask(RunEntry& run, WorkerEntry& w, const std::vector<uint64_t>& chunks) {
    w.state = WorkerState::BUSY;
    w.current_run = run.id;
    run.extract.tasks[w.id].insert(chunks.begin(), chunks.end());
    if (!std::count(run.workers.begin(), run.workers.end(), w.id)) run.workers.push_back(w.id);
    std::string list;
    for (uint64_t c : chunks) list += EncodeKeyU64(c);
    Status st = store_->PutMetadata(TaskKey(run, w.id), AsBytes(list), true);
    if (!st.ok()) STRATA_LOG(kError) << "could not persist the task of " << w.id << ": " << st.ToString();
    schema::EnvelopeBuilder msg;
    auto a = msg.root().initAssignTask();
    a.setRunId(run.id);
    a.setSpecToml(run.spec_toml);
    a.setRank(0);
    a.setWorldSize(1);
    a.setTaskToken(rng_());
    a.initPeerDataAddresses(1).set(0, w.data_address);
    auto list_builder = a.initChunks(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) list_builder.set(i, chunks[i]);
    Send(w.identity, msg.Serialize());
  }

  // Gives returning workers their reserved chunks, and unassigned chunks to idle workers (at
  // most parallel.dp capturing at once).
  void ScheduleExtractChunks(RunEntry& run) {
    ExtractState& x = run.extract;
    for (auto it = x.reserved.begin(); it != x.reserved.end();) {
      auto w = workers_.find(it->first);
      if (w == workers_.end() || w->second.state != WorkerState::IDLE) {
        ++it;
        continue;
      }
      std::vector<uint64_t> chunks;
      for (uint64_t c : it->second.chunks) {
        if (!x.stored.count(c)) chunks.push_back(c);
      }
      AddEvent(run, "resumed", w->first + " is back: it resumes its " + std::to_string(chunks.size()) + " unfinished chunks");
      it = x.reserved.erase(it);
      if (!chunks.empty()) AssignExtractTask(run, w->second, chunks);
    }
    const std::vector<uint64_t> chunks = UnassignedChunks(run);
    if (chunks.empty()) return;
    const size_t room = static_cast<size_t>(run.spec.parallel.dp) > x.tasks.size() ? run.spec.parallel.dp - x.tasks.size() : 0;
    std::vector<WorkerEntry*> idle;
    for (auto& [id, w] : workers_) {
      if (w.state == WorkerState::IDLE && idle.size() < room) idle.push_back(&w);
    }
    if (idle.empty()) return;
    AssignBlocks(run, chunks, idle);
    AddEvent(run, "reassigned", std::to_string(chunks.size()) + " unfinished chunks go to " + std::to_string(std::min(idle.size(), chunks.size())) + " worker(s)");
    Persist(run);
  }

  void CheckReservations(int64_t now) {
    bool changed = false;
    for (auto& [id, run] : runs_) {
      if (run.state != RunState::RUNNING || !run.spec.is_extract()) continue;
      for (auto it = run.extract.reserved.begin(); it != run.extract.reserved.end();) {
        if (it->second.until_ms > now) {
          ++it;
          continue;
        }
        AddEvent(run, "replan", it->first + " did not come back within " + std::to_string(options_.replace_grace_ms) +
                                    " ms: its " + std::to_string(it->second.chunks.size()) + " chunks go to the other workers");
        it = run.extract.reserved.erase(it);
        changed = true;
      }
    }
    if (changed) Schedule();
  }

  void ExtractWorkerLost(RunEntry& run, WorkerEntry& w, std::string what) {
    ExtractState& x = run.extract;
    std::set<uint64_t> chunks;
    if (auto it = x.tasks.find(w.id); it != x.tasks.end()) {
      chunks = std::move(it->second);
      x.tasks.erase(it);
    }
    (void)store_->DeleteMetadata(TaskKey(run, w.id));
    run.workers.erase(std::remove(run.workers.begin(), run.workers.end(), w.id), run.workers.end());
    if (!chunks.empty()) {
      x.reserved[w.id] = {net::SteadyMs() + options_.replace_grace_ms, chunks};
      what += "; its " + std::to_string(chunks.size()) + " unfinished chunks wait " + std::to_string(options_.replace_grace_ms) +
              " ms for it to come back, then go to the other workers";
    }
    AddEvent(run, "worker-lost", what);
    Persist(run);
  }

  void HandleExtractEvent(const std::string& worker, RunEntry& run, TaskEvent::Reader ev) {
    switch (ev.which()) {
      case TaskEvent::CHUNK_STORED:
        return RecordChunk(run, worker, ev.getChunkStored());
      case TaskEvent::FINISHED:
        return EndExtractTask(run, worker);
      case TaskEvent::FAILED:
        AddEvent(run, "rank-failed", worker + ": " + ev.getFailed().cStr());
        return FailRun(run, worker + " failed: " + ev.getFailed().cStr());
      default:
        return;
    }
  }

  void RecordChunk(RunEntry& run, const std::string& worker, ChunkStored::Reader c) {
    ExtractState& x = run.extract;
    const uint64_t chunk = c.getChunk();
    if (chunk >= x.total_chunks) {
      STRATA_LOG(kWarn) << worker << " reported chunk " << chunk << " of " << run.id << ", which has " << x.total_chunks;
      return;
    }
    if (auto it = x.tasks.find(worker); it != x.tasks.end()) it->second.erase(chunk);
    for (auto& [w, r] : x.reserved) r.chunks.erase(chunk);
    ++(c.getComputed() ? x.computed_reports : x.found_reports);
    if (x.stored.count(chunk)) {
      // Only after a reassignment past the grace period: the index keeps the first copy.
      STRATA_LOG(kWarn) << "chunk " << chunk << " of " << run.id << " reported again by " << worker << "; keeping the first";
      return;
    }
    capnp::MallocMessageBuilder message;
    auto loc = message.initRoot<ChunkLocation>();
    loc.setChunk(chunk);
    loc.setRowBegin(c.getRowBegin());
    loc.setRowCount(c.getRowCount());
    loc.setBytes(c.getBytes());
    loc.setWorker(worker);
    if (auto w = workers_.find(worker); w != workers_.end()) {
      loc.setStorePath(w->second.store_path);
      loc.setServeAddress(w->second.serve_address);
    }
    const std::string bytes = schema::StructToBytes(loc.asReader());
    Status st = store_->PutMetadata("act/" + EncodeKeyString(run.id) + EncodeKeyU64(chunk), AsBytes(bytes), true);
    if (!st.ok()) {
      STRATA_LOG(kError) << "could not index chunk " << chunk << " of " << run.id << ": " << st.ToString();
      return;
    }
    x.stored[chunk] = bytes;
    x.stored_bytes += c.getBytes();
    x.stored_rows += c.getRowCount();
    run.step = static_cast<int64_t>(x.stored.size());
    run.updated_ms = net::NowUnixMs();
    if (c.getComputed()) {
      x.computed_rows += c.getRowCount();
      const double seconds = std::max(1e-3, (net::SteadyMs() - x.started_ms) / 1000.0);
      run.tokens_per_second = static_cast<double>(x.computed_rows) / seconds;
      x.computed_bytes += c.getBytes();
      x.bytes_per_second = static_cast<double>(x.computed_bytes) / seconds;
    }
    if (x.stored.size() == x.total_chunks) FinishExtract(run);
  }

  void EndExtractTask(RunEntry& run, const std::string& worker) {
    run.extract.tasks.erase(worker);
    (void)store_->DeleteMetadata(TaskKey(run, worker));
    run.workers.erase(std::remove(run.workers.begin(), run.workers.end(), worker), run.workers.end());
    if (auto w = workers_.find(worker); w != workers_.end() && w->second.current_run == run.id) {
      w->second.current_run.clear();
      if (w->second.state == WorkerState::BUSY) w->second.state = WorkerState::IDLE;
    }
    if (run.extract.stored.size() == run.extract.total_chunks) return FinishExtract(run);
    Persist(run);
    Schedule();
  }

  void FinishExtract(RunEntry& run) {
    run.state = RunState::FINISHED;
    const double gib = run.extract.stored_bytes / double(1ull << 30);
    std::ostringstream msg;
    msg << "captured " << run.extract.total_rows << " token rows in " << run.extract.total_chunks << " chunks ("
        << std::fixed << std::setprecision(2) << gib << " GiB): " << run.extract.computed_reports << " chunk(s) computed, "
        << run.extract.found_reports << " found already stored by a resumed task";
    AddEvent(run, "finished", msg.str());
    CancelRanks(run, "run finished");
    for (auto& [worker, chunks] : run.extract.tasks) (void)store_->DeleteMetadata(TaskKey(run, worker));
    run.extract.tasks.clear();
    run.extract.reserved.clear();
    ReleaseWorkers(run);
    Persist(run);
    Schedule();
  }

  Status LoadExtract(RunEntry& run) {
    STRATA_RETURN_IF_ERROR(SizeExtract(run));
    STRATA_ASSIGN_OR_RETURN(auto index, store_->ScanMetadata("act/" + EncodeKeyString(run.id)));
    for (auto& [key, value] : index) {
      auto loc = schema::DecodedRecord<ChunkLocation>::Decode(value);
      if (!loc.ok()) continue;
      run.extract.stored[loc->root().getChunk()] = std::string(value.begin(), value.end());
      run.extract.stored_bytes += loc->root().getBytes();
      run.extract.stored_rows += loc->root().getRowCount();
    }
    run.step = static_cast<int64_t>(run.extract.stored.size());
    const std::string prefix = "task/" + EncodeKeyString(run.id);
    STRATA_ASSIGN_OR_RETURN(auto tasks, store_->ScanMetadata(prefix));
    for (auto& [key, value] : tasks) {
      std::string_view rest = std::string_view(key).substr(prefix.size());
      std::string worker;
      if (!storage::ConsumeKeyString(&rest, &worker)) continue;
      std::string_view list(reinterpret_cast<const char*>(value.data()), value.size());
      uint64_t c = 0;
      while (storage::ConsumeKeyU64(&list, &c)) {
        if (!run.extract.stored.count(c)) run.extract.tasks[worker].insert(c);
      }
    }
    return Status::Ok();
  }

  // The run `id`, or null after answering the request with NotFound.
  RunEntry* RunOrReplyNotFound(const std::string& identity, uint64_t rid, const std::string& id) {
    auto it = runs_.find(id);
    if (it != runs_.end()) return &it->second;
    Send(identity, schema::MakeErrorReply(rid, NotFound(UnknownRun(id))));
    return nullptr;
  }

  void HandleActivationsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req) {
    const std::string id = req.getRunId().cStr();
    const RunEntry* found = RunOrReplyNotFound(identity, rid, id);
    if (!found) return;
    const RunEntry& run = *found;
    if (!run.spec.is_extract()) {
      Send(identity, schema::MakeErrorReply(rid, InvalidArgument("run " + id + " is a training run; activations are stored by "
                                                                 "runs of kind = \"extract\"")));
      return;
    }
    schema::EnvelopeBuilder reply(rid);
    auto r = reply.root().initActivationsReply();
    r.setRunId(run.id);
    r.setState(run.state);
    auto layers = r.initLayers(run.spec.extract.layers.size());
    for (size_t i = 0; i < run.spec.extract.layers.size(); ++i) layers.set(i, static_cast<uint32_t>(run.spec.extract.layers[i]));
    auto sites = r.initSites(run.spec.extract.sites.size());
    for (size_t i = 0; i < run.spec.extract.sites.size(); ++i) sites.set(i, run.spec.extract.sites[i]);
    const std::string& dtype = run.spec.extract.dtype;
    r.setDtype(dtype == "bf16" ? ::DType::BF16 : dtype == "fp16" ? ::DType::F16 : ::DType::F32);
    r.setHidden(static_cast<uint64_t>(run.spec.model.hidden));
    r.setTotalRows(run.extract.total_rows);
    auto chunks = r.initChunks(run.extract.stored.size());
    size_t i = 0;
    for (const auto& [chunk, bytes] : run.extract.stored) {
      auto loc = schema::DecodedRecord<ChunkLocation>::Decode(AsBytes(bytes));
      if (!loc.ok()) continue;
      chunks.setWithCaveats(i, loc->root());
      // A worker that re-registered may serve from a new address: give the live one.
      auto w = workers_.find(loc->root().getWorker().cStr());
      if (w != workers_.end() && !w->second.serve_address.empty()) chunks[i].setServeAddress(w->second.serve_address);
      ++i;
    }
    Send(identity, reply.Serialize());
  }

  // ---------------------------------------------------------------- queries
  void HandleStatusRequest(const std::string& identity, uint64_t rid, StatusRequest::Reader req) {
    const std::string only = req.getRunId().cStr();
    if (!only.empty() && !runs_.count(only)) {
      Send(identity, schema::MakeErrorReply(rid, NotFound(UnknownRun(only))));
      return;
    }
    std::vector<const RunEntry*> list;
    for (auto& [id, run] : runs_) {
      if (only.empty() || id == only) list.push_back(&run);
    }
    std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->created_ms < b->created_ms; });
    schema::EnvelopeBuilder reply(rid);
    auto runs = reply.root().initStatusReply().initRuns(list.size());
    const bool last_only = req.getLastLossOnly();
    for (size_t i = 0; i < list.size(); ++i) {
      FillRunRecord(*list[i], runs[i], /*with_losses=*/!last_only);
      if (last_only && !list[i]->losses.empty()) runs[i].initLosses(1).set(0, list[i]->losses.back());
    }
    Send(identity, reply.Serialize());
  }

  void HandleWorkersRequest(const std::string& identity, uint64_t rid) {
    schema::EnvelopeBuilder reply(rid);
    auto list = reply.root().initWorkersReply().initWorkers(workers_.size());
    size_t i = 0;
    const int64_t now = net::SteadyMs();
    for (auto& [id, w] : workers_) {
      auto b = list[i++];
      b.setWorkerId(w.id);
      b.setName(w.id);
      b.setHost(w.host);
      b.setPid(w.pid);
      b.setState(w.state);
      schema::WriteMemoryStats(w.memory, b.initMemory());
      b.setStorePath(w.store_path);
      b.setDataAddress(w.data_address);
      b.setServeAddress(w.serve_address);
      b.setCurrentRun(w.current_run);
      b.setLastHeartbeatMsAgo(now - w.last_heartbeat_ms);
    }
    Send(identity, reply.Serialize());
  }

  // --- Per-run files: metrics (written here) and each rank's log (written by its worker) ---

  std::string MetricsPath(const std::string& run_id) const { return options_.state_dir + "/metrics/" + run_id + ".jsonl"; }

  // One JSON line per step, from rank 0's report, appended to STATE_DIR/metrics/RUN.jsonl (0600):
  // a step already written (a replay after a recovery, a resent report) is not written again, so
  // the file has one line per step with the loss `strata status` shows. The learning rate is the
  // spec's schedule at that step; the reports carry no gradient norm, so there is none.
  void AppendMetrics(const RunEntry& run, int64_t step, StepReport::Reader s) {
    auto written = metrics_step_.find(run.id);
    if (written == metrics_step_.end()) written = metrics_step_.emplace(run.id, LastMetricsStep(run.id)).first;
    if (step <= written->second) return;
    written->second = step;
    auto number = [](double v) {
      if (!std::isfinite(v)) return std::string("null");
      char text[40];
      const auto end = std::to_chars(text, text + sizeof(text), v).ptr;  // shortest that reads back equal
      return std::string(text, end);
    };
    const std::string line = "{\"step\":" + std::to_string(step) + ",\"loss\":" + number(s.getLoss()) +
                             ",\"lr\":" + number(LearningRate(run.spec.train, step)) +
                             ",\"grad_norm\":" + number(s.getGradNorm()) +
                             ",\"tokens_per_second\":" + number(s.getTokensPerSecond()) +
                             ",\"memory_bytes\":" + std::to_string(std::max(s.getSchedulePeakBytes(), s.getUpdatePeakBytes())) +
                             ",\"unix_ms\":" + std::to_string(net::NowUnixMs()) + "}\n";
    std::error_code ec;
    std::filesystem::create_directories(options_.state_dir + "/metrics", ec);
    const std::string path = MetricsPath(run.id);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      STRATA_LOG(kWarn) << "could not append step " << step << " of " << run.id << " to " << path << ": " << std::strerror(errno);
    }
    if (fd >= 0) ::close(fd);
  }

  // The last step in a run's metrics file (0 if none): a restarted coordinator goes on after it.
  int64_t LastMetricsStep(const std::string& run_id) const {
    std::ifstream in(MetricsPath(run_id));
    int64_t last = 0;
    for (std::string line; std::getline(in, line);) {
      long long step = 0;
      if (std::sscanf(line.c_str(), "{\"step\":%lld", &step) == 1) last = std::max<int64_t>(last, step);
    }
    return last;
  }

  // A piece of a run's metrics file or of one rank's log. Logs are read by path: the store of the
  // worker that ran the rank last (else any known worker's store holding that rank's log) must be
  // on this host's filesystem; a worker on another host gets an error saying so.
  void HandleRunFileRequest(const std::string& identity, uint64_t rid, RunFileRequest::Reader req) {
    const std::string id = req.getRunId().cStr();
    const RunEntry* found = RunOrReplyNotFound(identity, rid, id);
    if (!found) return;
    const RunEntry& run = *found;
    std::string path;
    if (req.getKind() == RunFileRequest::Kind::METRICS) {
      path = MetricsPath(id);
    } else {
      const uint32_t rank = req.getRank();
      std::vector<const WorkerEntry*> candidates;
      if (rank < run.workers.size()) {
        if (auto w = workers_.find(run.workers[rank]); w != workers_.end()) candidates.push_back(&w->second);
      }
      for (const auto& [name, w] : workers_) candidates.push_back(&w);
      std::string tried;
      for (const WorkerEntry* w : candidates) {
        if (w->store_path.empty()) continue;
        const std::string p = log::TaskLogPath(w->store_path, id, rank);
        std::error_code ec;
        if (std::filesystem::exists(p, ec)) {
          path = p;
          break;
        }
        if (tried.empty() && w->host != own_host_) {
          tried = " (worker " + w->id + " is on host " + w->host + " and this coordinator, on " + own_host_ +
                  ", reads logs only from stores on its own host)";
        }
      }
      // A rank of a live run that has not started yet (the run waits for workers, or is being
      // re-planned) has no log so far: empty, so `strata logs --follow` waits for it.
      if (path.empty() && !run.terminal() && rank < std::max<int64_t>(1, run.spec.parallel.workers())) {
        schema::EnvelopeBuilder reply(rid);
        reply.root().initRunFileReply();
        Send(identity, reply.Serialize());
        return;
      }
      if (path.empty()) {
        Send(identity, schema::MakeErrorReply(rid, NotFound("no log of rank " + std::to_string(rank) + " of run " + id +
                                                            " in the stores of the known workers" + tried +
                                                            "; the run has ranks 0-" + std::to_string(std::max<int64_t>(1, run.spec.parallel.workers()) - 1))));
        return;
      }
    }
    schema::EnvelopeBuilder reply(rid);
    auto r = reply.root().initRunFileReply();
    r.setPath(path);
    r.setTerminal(run.terminal());
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st {};
      ::fstat(fd, &st);
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      r.setSize(size);
      const uint64_t offset = std::min<uint64_t>(req.getOffset(), size);
      std::string data(std::min<uint64_t>(size - offset, kRunFileChunk), '\0');
      const ssize_t n = ::pread(fd, data.data(), data.size(), static_cast<off_t>(offset));
      data.resize(n > 0 ? static_cast<size_t>(n) : 0);
      ::close(fd);
      r.setData(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(data.data()), data.size()));
    }  // no metrics file yet: no step reported, empty
    Send(identity, reply.Serialize());
  }

  static constexpr uint64_t kRunFileChunk = 1 << 20;

  void HandleEventsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req) {
    ReplyWithRunRecords<Event>(identity, rid, req, "evt/",
                               [](schema::EnvelopeBuilder& reply, size_t n) { return reply.root().initEventsReply().initEvents(n); });
  }

  void HandleCheckpointsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req) {
    const std::string id = req.getRunId().cStr();
    ReplyWithRunRecords<CheckpointManifest>(identity, rid, req, "ckpt/", [&](schema::EnvelopeBuilder& reply, size_t n) {
      auto checkpoints = reply.root().initCheckpointsReply();
      return checkpoints.initCheckpoints(n);
    }, [&](schema::EnvelopeBuilder& reply) {
      auto checkpoints = reply.root().getCheckpointsReply();
      auto list = checkpoints.getCheckpoints();
      auto why = checkpoints.initUnreadable(list.size());
      for (unsigned i = 0; i < list.size(); ++i) why.set(i, UnreadableWhy(id, list[i].getStep()));
    });
  }

  // Answers with every persisted record of type T under prefix + run id, in key order.
  template <typename T, typename InitList>
  void ReplyWithRunRecords(const std::string& identity, uint64_t rid, RunRef::Reader req, const std::string& prefix,
                           InitList init_list, const std::function<void(schema::EnvelopeBuilder&)>& finish = nullptr) {
    const std::string id = req.getRunId().cStr();
    if (!RunOrReplyNotFound(identity, rid, id)) return;
    auto records = store_->ScanMetadata(prefix + EncodeKeyString(id));
    if (!records.ok()) {
      Send(identity, schema::MakeErrorReply(rid, records.status()));
      return;
    }
    schema::EnvelopeBuilder reply(rid);
    auto list = init_list(reply, records->size());
    for (size_t i = 0; i < records->size(); ++i) {
      auto record = schema::DecodedRecord<T>::Decode((*records)[i].second);
      if (record.ok()) list.setWithCaveats(i, record->root());
    }
    if (finish) finish(reply);
    Send(identity, reply.Serialize());
  }

  void HandleShutdown(const std::string& identity, uint64_t rid) {
    STRATA_LOG(kInfo) << "shutdown requested: stopping workers";
    for (auto& [id, w] : workers_) {
      if (w.state == WorkerState::LOST) continue;
      schema::EnvelopeBuilder msg;
      msg.root().setShutdown();
      Send(w.identity, msg.Serialize());
    }
    Ack(identity, rid);
    stop_requested_.store(true);
  }

  // ---------------------------------------------------------------- dashboard
  // Copies what the HTTP dashboard shows into an immutable snapshot (the HTTP thread never sees
  // workers_ or runs_). Events are re-read from the store only for runs that logged new ones.
  void PublishSnapshot() {
    if (!options_.publish_snapshot || net::SteadyMs() - last_snapshot_ms_ < 250) return;
    last_snapshot_ms_ = net::SteadyMs();
    auto s = std::make_shared<DashboardSnapshot>();
    s->unix_ms = net::NowUnixMs();
    s->endpoint = options_.listen;
    s->workers_lost_total = workers_lost_;
    for (const auto& [id, w] : workers_) {
      s->workers.push_back({w.id, w.host, w.pid, schema::WorkerStateName(w.state), w.memory.device, w.memory.total_bytes,
                            w.memory.free_bytes, w.memory.allocated_bytes, w.memory.peak_bytes, last_snapshot_ms_ - w.last_heartbeat_ms,
                            w.current_run, {w.memory_history.begin(), w.memory_history.end()}});
    }
    std::vector<const RunEntry*> runs;
    for (const auto& [id, run] : runs_) runs.push_back(&run);
    std::sort(runs.begin(), runs.end(), [](auto* a, auto* b) { return a->created_ms < b->created_ms; });
    size_t terminal_left = std::count_if(runs.begin(), runs.end(), [](auto* r) { return r->terminal(); });
    for (const RunEntry* run : runs) {
      RunEventCache& cache = event_cache_[run->id];
      if (cache.seq != run->next_event_seq) RefreshEvents(*run, cache);
      s->checkpoints_total += cache.checkpoints;
      s->run_workers_lost_total += cache.workers_lost;
      s->ooms_total += cache.ooms;
      // Every active run, and the 50 most recent finished ones: old history stays in `strata status`.
      if (run->terminal() && terminal_left-- > 50) continue;
      DashboardRun& r = s->runs.emplace_back();
      r.id = run->id;
      r.name = run->name;
      r.state = schema::RunStateName(run->state);
      r.created_unix_ms = run->created_ms;
      r.updated_unix_ms = run->updated_ms;
      r.step = run->step;
      r.total_steps = TotalSteps(*run);
      r.tokens_per_step = int64_t{run->spec.train.global_batch} * run->spec.model.sequence;
      r.losses = run->losses;
      r.tokens_per_second = run->tokens_per_second;
      r.workers = run->workers;
      r.message = run->message;
      r.events = cache.events;
      r.checkpoints = cache.checkpoints;
      r.workers_lost = cache.workers_lost;
      r.ooms = cache.ooms;
      r.kind = run->spec.kind;
      for (const auto& [kind, count] : run->handled) r.handled.emplace_back(kind, count);
      for (const auto& m : run->memory) r.memory.push_back({m.worker, m.estimate, m.workspace, m.measured});
      if (run->spec.is_extract()) {
        r.rows_stored = run->extract.stored_rows;
        r.rows_total = run->extract.total_rows;
        r.bytes_stored = run->extract.stored_bytes;
        r.bytes_per_second = run->extract.bytes_per_second;
      } else {
        r.plan = PlanOf(run->spec);
      }
    }
    options_.publish_snapshot(std::move(s));
  }

  // The run's parallel plan as it stands (shard::SummarizePlan, as `strata status` shows it).
  static DashboardPlan PlanOf(const RunSpec& spec) {
    const shard::PlanSummary summary = shard::SummarizePlan(spec);
    return {true, summary.dp, summary.pp, summary.tp, summary.zero, summary.micro_batch, summary.gradient_accumulation,
            summary.recompute, summary.stages};
  }

  struct RunEventCache {
    uint64_t seq = ~uint64_t{0};
    std::vector<DashboardEvent> events;  // the last 100
    uint64_t checkpoints = 0, workers_lost = 0, ooms = 0;
  };

  void RefreshEvents(const RunEntry& run, RunEventCache& cache) {
    auto records = store_->ScanMetadata("evt/" + EncodeKeyString(run.id));
    if (!records.ok()) return;
    cache = RunEventCache{};
    cache.seq = run.next_event_seq;
    for (auto& [key, bytes] : *records) {
      auto ev = schema::DecodedRecord<Event>::Decode(bytes);
      if (!ev.ok()) continue;
      DashboardEvent e{ev->root().getUnixMs(), ev->root().getKind().cStr(), ev->root().getMessage().cStr()};
      cache.checkpoints += e.kind == "checkpoint";
      cache.workers_lost += e.kind == "worker-lost";
      cache.ooms += e.kind == "oom";
      cache.events.push_back(std::move(e));
    }
    if (cache.events.size() > 100) cache.events.erase(cache.events.begin(), cache.events.end() - 100);
  }

  // ---------------------------------------------------------------- persistence
  // The persisted record leaves the losses out (they live under "loss/"); replies carry them.
  void FillRunRecord(const RunEntry& run, RunRecord::Builder b, bool with_losses = true) {
    b.setRunId(run.id);
    b.setName(run.name);
    b.setSpecToml(run.spec_toml);
    b.setState(run.state);
    b.setCreatedUnixMs(run.created_ms);
    b.setUpdatedUnixMs(run.updated_ms);
    b.setTotalSteps(TotalSteps(run));
    b.setKind(run.spec.kind);
    b.setStep(run.step);
    if (with_losses) {
      auto losses = b.initLosses(run.losses.size());
      for (size_t i = 0; i < run.losses.size(); ++i) losses.set(i, run.losses[i]);
    }
    auto workers = b.initWorkers(run.workers.size());
    for (size_t i = 0; i < run.workers.size(); ++i) workers.set(i, run.workers[i]);
    b.setMessage(run.message);
    b.setWorldSize(run.spec.is_extract() ? run.spec.parallel.dp : run.spec.parallel.workers());
    b.setTokensPerSecond(run.tokens_per_second);
    b.setResumeRun(run.resume_run);
    b.setResumeStep(run.resume_step);
    b.setGrowBackToDp(run.grow_back_to_dp);
    b.setTaskToken(run.task_token);
    auto handled = b.initHandled(static_cast<unsigned>(run.handled.size()));
    size_t h = 0;
    for (const auto& [kind, count] : run.handled) {
      handled[h].setKind(kind);
      handled[h++].setCount(count);
    }
    auto memory = b.initMemory(run.memory.size());
    for (size_t i = 0; i < run.memory.size(); ++i) {
      memory[i].setWorker(run.memory[i].worker);
      memory[i].setEstimateBytes(run.memory[i].estimate);
      memory[i].setWorkspaceBytes(run.memory[i].workspace);
      memory[i].setMeasuredPeakBytes(run.memory[i].measured);
    }
  }

  // Journals the run record. A failure (a full disk) is logged; the run goes on in memory, and the
  // next transition that persists writes the record whole again. Submit, which must not accept a
  // run it could not journal, uses PersistRecord for the status.
  void Persist(RunEntry& run) { static_cast<void>(PersistRecord(run)); }
  Status PersistRecord(RunEntry& run) {
    run.updated_ms = net::NowUnixMs();
    capnp::MallocMessageBuilder message;
    FillRunRecord(run, message.initRoot<RunRecord>(), /*with_losses=*/false);
    const std::string bytes = schema::StructToBytes(message.getRoot<RunRecord>().asReader());
    Status st = store_->PutMetadata("run/" + run.id, AsBytes(bytes), /*sync=*/true);
    if (!st.ok()) STRATA_LOG(kError) << "could not persist run " << run.id << ": " << st.ToString();
    return st;
  }

  // Events that say the run got through a failure (counted for `strata status`).
  static bool IsHandledFailure(const std::string& kind) {
    return kind == "oom" || kind == "worker-lost" || kind == "stalled" || kind == "checkpoint-unreadable" || kind == "coordinator-restarted";
  }

  void AddEvent(RunEntry& run, const std::string& kind, const std::string& message) {
    if (IsHandledFailure(kind)) ++run.handled[kind];
    capnp::MallocMessageBuilder builder;
    auto ev = builder.initRoot<Event>();
    ev.setUnixMs(net::NowUnixMs());
    ev.setKind(kind);
    ev.setMessage(message);
    const std::string bytes = schema::StructToBytes(ev.asReader());
    Status st = store_->PutMetadata("evt/" + EncodeKeyString(run.id) + EncodeKeyU64(run.next_event_seq++), AsBytes(bytes), true);
    if (!st.ok()) STRATA_LOG(kError) << "could not persist event: " << st.ToString();
    STRATA_LOG(kInfo) << "run " << run.id << " " << kind << ": " << message;
  }

  // A run record that does not decode: without --salvage the coordinator does not start (it would
  // otherwise forget the run without a word); with it, the record moves under "salvaged/" (kept,
  // not deleted) and the rest loads.
  Status UnreadableRunRecord(const std::string& key, const std::vector<uint8_t>& bytes, const std::string& why) {
    const std::string where = "the run record " + storage::PrintableKey(key) + " in the metadata store " + options_.state_dir + "/metadata";
    if (!options_.salvage) {
      return Corruption(where + " is damaged (" + why + "); the coordinator did not start, so nothing is lost yet. Restore "
                        "the state directory from a backup, or start with --salvage to keep every intact run (the damaged "
                        "record is kept under the salvaged/ prefix)");
    }
    STRATA_LOG(kError) << where << " is damaged (" << why << "): salvaging, it is kept under salvaged/ and its run is not loaded";
    STRATA_RETURN_IF_ERROR(store_->PutMetadata("salvaged/" + key, bytes, true));
    return store_->DeleteMetadata(key);
  }

  Status LoadRuns() {
    auto scanned = store_->ScanMetadata("run/");
    if (!scanned.ok()) {
      return Status(scanned.status().code(), scanned.status().message() +
                                                 (options_.salvage ? "" : " (start with --salvage to keep what is intact)"));
    }
    auto& records = *scanned;
    for (auto& [key, bytes] : records) {
      auto rec = schema::DecodedRecord<RunRecord>::Decode(bytes);
      if (!rec.ok()) {
        STRATA_RETURN_IF_ERROR(UnreadableRunRecord(key, bytes, rec.status().message()));
        continue;
      }
      auto r = rec->root();
      RunEntry run;
      run.id = r.getRunId().cStr();
      run.name = r.getName().cStr();
      run.spec_toml = r.getSpecToml().cStr();
      auto spec = ParseStoredRunSpec(run.spec_toml);  // names from before the name rule still load
      if (!spec.ok()) {
        STRATA_RETURN_IF_ERROR(UnreadableRunRecord(key, bytes, "its stored spec does not parse: " + spec.status().message()));
        continue;
      }
      run.spec = *spec;
      run.state = r.getState();
      run.created_ms = r.getCreatedUnixMs();
      run.updated_ms = r.getUpdatedUnixMs();
      run.step = r.getStep();
      run.resume_run = r.getResumeRun().cStr();
      run.resume_step = r.getResumeStep();
      run.grow_back_to_dp = r.getGrowBackToDp();
      run.task_token = r.getTaskToken();
      for (auto m : r.getMemory()) {
        run.memory.push_back({m.getWorker().cStr(), m.getEstimateBytes(), m.getWorkspaceBytes(), m.getMeasuredPeakBytes()});
      }
      if (run.resume_run == run.id && r.getState() == RunState::PENDING) {
        run.recover_until_ms = net::SteadyMs() + options_.replace_grace_ms;  // it was recovering
      }
      auto steps = store_->ScanMetadata("loss/" + EncodeKeyString(run.id));
      if (steps.ok()) {
        for (auto& [key, value] : *steps) {
          auto report = schema::DecodedRecord<StepReport>::Decode(value);
          if (!report.ok() || report->root().getStep() < 1) continue;
          const int64_t step = report->root().getStep();
          if (static_cast<int64_t>(run.losses.size()) < step) run.losses.resize(step, 0.0);
          run.losses[step - 1] = report->root().getLoss();
          run.step = std::max(run.step, step);
          run.tokens_per_second = report->root().getTokensPerSecond();
        }
      }
      for (auto w : r.getWorkers()) run.workers.push_back(w.cStr());
      run.message = r.getMessage().cStr();
      if (run.spec.is_extract()) {
        Status st = LoadExtract(run);
        if (!st.ok()) STRATA_LOG(kError) << "run " << run.id << ": cannot restore its capture state: " << st.message();
      }
      auto events = store_->ScanMetadata("evt/" + EncodeKeyString(run.id));
      run.next_event_seq = events.ok() ? events->size() : 0;
      // The journal is the record of what was handled (the run record may be a step behind it).
      if (events.ok()) {
        for (auto& [key, value] : *events) {
          auto event = schema::DecodedRecord<Event>::Decode(value);
          if (event.ok() && IsHandledFailure(event->root().getKind().cStr())) ++run.handled[event->root().getKind().cStr()];
        }
      }
      RunEntry& stored = runs_[run.id] = std::move(run);
      if (stored.state == RunState::RUNNING) {
        // Expect its workers back: placeholders that the heartbeat timeout turns lost (failing
        // the run) unless they re-register in time.
        for (auto& id : stored.workers) {
          WorkerEntry& w = workers_[id];
          w.id = id;
          w.identity = id;
          w.state = WorkerState::BUSY;
          w.current_run = stored.id;
          w.last_heartbeat_ms = net::SteadyMs();
        }
        AddEvent(stored, "coordinator-restarted", "coordinator restarted; waiting for the run's workers to re-attach");
      }
    }
    return Status::Ok();
  }

  CoordinatorOptions options_;
  std::unique_ptr<storage::ShardStore> store_;
  zmq::context_t context_{1};
  std::unique_ptr<curve::ZapHandler> zap_;  // declared before router_: outlives it
  zmq::socket_t router_;
  std::atomic<bool> stop_requested_{false};
  std::map<std::string, WorkerEntry> workers_;
  std::map<std::string, RunEntry> runs_;
  std::map<std::string, int64_t> metrics_step_;  // run -> last step in its metrics file
  std::string own_host_ = [] {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    return std::string(name);
  }();
  int64_t last_check_ms_ = 0;
  int64_t last_snapshot_ms_ = 0;
  uint64_t workers_lost_ = 0;                             // since this process started
  std::map<std::string, RunEventCache> event_cache_;  // by run id: the dashboard's view of events
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorOptions& options) {
  if (options.state_dir.empty()) return InvalidArgument("coordinator: --state-dir is required");
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir, ec);
  if (ec) return IoError("cannot create state dir " + options.state_dir + ": " + ec.message());
  storage::StoreOptions store_options;
  store_options.salvage = options.salvage;
  STRATA_ASSIGN_OR_RETURN(auto store, storage::ShardStore::Open(options.state_dir + "/metadata", store_options));
  auto coordinator = std::make_unique<CoordinatorImpl>(options, std::move(store));
  STRATA_RETURN_IF_ERROR(coordinator->Init());
  return std::unique_ptr<Coordinator>(std::move(coordinator));
}

}  // namespace strata::coordinator
