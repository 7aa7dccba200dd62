// Worker control loop. See worker.h for who owns what.
#include "worker/worker.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "client/store_client.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/net.h"
#include "common/task_log.h"
#include "common/thread_annotations.h"
#include "model/hf_checkpoint.h"  // init_from's weights, checked before a task starts
#include "model/peft_adapter.h"   // adapter_from's tensors, likewise
#include "schema/envelope.h"
#include "spec/run_spec_capnp.h"
#include "worker/outbox.h"
#include "worker/running_task.h"
#include "worker/shard_replicator.h"
#include "worker/store_server.h"

namespace strata::worker {
namespace {

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(WorkerOptions options, std::unique_ptr<TaskExecutor> executor, std::unique_ptr<storage::ShardStore> store)
      : options_(std::move(options)),
        executor_(std::move(executor)),
        store_(std::move(store)),
        socket_(context_, zmq::socket_type::dealer) {}

  Status Init() {
    socket_.set(zmq::sockopt::linger, 1000);
    socket_.set(zmq::sockopt::routing_id, options_.name);  // stable: the coordinator routes by name
    socket_.set(zmq::sockopt::reconnect_ivl, 100);
    STRATA_RETURN_IF_ERROR(SetUpCurve());
    try {
      socket_.connect(options_.coordinator);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("--coordinator " + options_.coordinator + " is not a valid endpoint: " + e.what());
    }
    host_ = options_.host;
    if (host_.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      host_ = host;
    }
    if (!options_.serve_address.empty()) {
      STRATA_ASSIGN_OR_RETURN(store_server_, StoreServer::Start(options_.serve_address, store_.get(), curve_));
      STRATA_LOG(kInfo) << "store server on " << options_.serve_address;
    }
    return Status::Ok();
  }

  // Network addresses need keys: the coordinator only admits authorized clients, and our data
  // plane must not accept gradients from strangers. The data address then carries our public key
  // so peers can authenticate us as their server.
  Status SetUpCurve() {
    if (options_.keys_dir.empty()) {
      if (!curve::RequiresCurve(options_.coordinator) && !curve::RequiresCurve(options_.data_address)) {
        return Status::Ok();
      }
      return InvalidArgument(
          "tcp:// coordinator or data addresses need CURVE keys: pass --keys DIR (made by "
          "`strata keygen DIR` on the coordinator's host, copied here without coordinator.key)");
    }
    const std::string pair = std::filesystem::exists(options_.keys_dir + "/worker.key") ? "worker" : "client";
    STRATA_ASSIGN_OR_RETURN(auto keys, curve::LoadClientKeys(options_.keys_dir, pair, /*with_authorized=*/true));
    curve::ConfigureClient(socket_, keys.own, keys.coordinator_public_key);
    if (curve::RequiresCurve(options_.data_address)) {
      options_.data_address = curve::AddressWithKey(options_.data_address, keys.own.public_key);
    }
    STRATA_LOG(kInfo) << "CURVE on with public key " << keys.own.public_key
                      << (curve::RequiresCurve(options_.data_address) ? " (coordinator and data plane)"
                                                                      : " (coordinator)");
    curve_ = std::move(keys);
    return Status::Ok();
  }

  void RequestStop() override { stop_requested_.store(true); }

  Status Run() override {
    STRATA_LOG(kInfo) << "worker " << options_.name << " connecting to " << options_.coordinator;
    std::vector<zmq::message_t> frames;
    while (!stop_requested_.load()) {
      const int64_t now = net::SteadyMs();
      if (!registered_ && now - last_register_ms_ >= options_.register_retry_ms) SendRegister();
      if (registered_ && now - last_heartbeat_ms_ >= heartbeat_interval_ms_) SendHeartbeat();
      if (net::RecvMultipart(socket_, &frames, 20) && !frames.empty()) HandleMessage(frames.back());
      ReapTask();
      RestartIfStuck(now);
      StartDeferredAssignment();
      for (auto& bytes : outbox_.Take()) Send(bytes);
      if (options_.on_tick) options_.on_tick();
      if (options_.on_status && now - last_status_ms_ >= 1000) {
        last_status_ms_ = now;
        options_.on_status(StatusLine());
      }
    }
    CancelTask("worker stopping");
    ReapTask(/*wait=*/true);
    for (auto& bytes : outbox_.Take()) Send(bytes);
    STRATA_LOG(kInfo) << "worker " << options_.name << " stopped";
    return Status::Ok();
  }

 private:
  // The executor's memory and the store's disk: submit refuses a run whose checkpoint this disk
  // cannot take (client/estimate.cc).
  MemorySnapshot MemoryWithStoreDisk() {
    MemorySnapshot m = executor_->ReadMemory();
    if (auto disk = storage::StoreDiskOf(options_.store_path); disk.ok()) {
      m.store_total_bytes = disk->total;
      m.store_free_bytes = disk->writable();
      m.store_fs_id = disk->fs_id;
    }
    return m;
  }

  void Send(const std::string& bytes) {
    // Dropped if the coordinator is unreachable right now: heartbeats and re-registration
    // recover the state; dontwait keeps the loop (and its heartbeats) from ever blocking.
    (void)socket_.send(net::Buffer(bytes), zmq::send_flags::dontwait);
  }

  // One line for `systemctl status`, e.g. "worker-0: running r-abc step 120 (coordinator tcp://...)".
  std::string StatusLine() const {
    std::string what = "idle";
    if (!registered_) {
      what = "registering";
    } else if (task_) {
      what = "running " + task_->run_id_ + " step " + std::to_string(task_->current_step_.load());
    }
    return options_.name + ": " + what + " (coordinator " + options_.coordinator + ")";
  }

  void SendRegister() {
    last_register_ms_ = net::SteadyMs();
    schema::EnvelopeBuilder msg;
    auto r = msg.root().initRegisterWorker();
    r.setName(options_.name);
    r.setHost(host_);
    r.setPid(static_cast<uint32_t>(getpid()));
    schema::WriteMemoryStats(MemoryWithStoreDisk(), r.initMemory());
    r.setStorePath(options_.store_path);
    r.setDataAddress(options_.data_address);
    if (store_server_) r.setServeAddress(store_server_->advertised_address());
    if (task_) {
      r.setCurrentRun(task_->run_id_);
      r.setCurrentStep(task_->current_step_.load());
    }
    auto stored = store_->ListAllCheckpoints();
    if (stored.ok()) {
      auto list = r.initStoredCheckpoints(static_cast<unsigned>(stored->size()));
      for (size_t i = 0; i < stored->size(); ++i) {
        list[static_cast<unsigned>(i)].setKeyRun((*stored)[i].run);
        list[static_cast<unsigned>(i)].setStep((*stored)[i].step);
      }
      r.setStoredCheckpointsKnown(true);
    } else {
      STRATA_LOG(kWarn) << "cannot list the checkpoints of the store at " << options_.store_path << ": "
                        << stored.status().message();
    }
    Send(msg.Serialize());
  }

  void SendHeartbeat() {
    last_heartbeat_ms_ = net::SteadyMs();
    schema::EnvelopeBuilder msg;
    auto hb = msg.root().initHeartbeat();
    hb.setWorkerId(options_.name);
    schema::WriteMemoryStats(MemoryWithStoreDisk(), hb.initMemory());
    if (task_) {
      hb.setCurrentRun(task_->run_id_);
      hb.setCurrentStep(task_->current_step_.load());
    }
    Send(msg.Serialize());
  }

  void HandleMessage(const zmq::message_t& frame) {
    auto decoded = schema::DecodeEnvelope(net::Bytes(frame));
    if (!decoded.ok()) {
      STRATA_LOG(kWarn) << "dropped an undecodable message from the coordinator: " << decoded.status().message();
      return;
    }
    auto root = (*decoded)->root();
    try {
      switch (root.which()) {
        case Envelope::REGISTERED:
          if (!registered_) STRATA_LOG(kInfo) << "registered with the coordinator";
          if (!registered_ && ready_ && task_) {
            // Registered again (the coordinator restarted or lost us): resend this task's reports.
            for (auto& bytes : task_->History()) Send(bytes);
          }
          registered_ = true;
          if (!ready_ && options_.on_ready) options_.on_ready(StatusLine());
          ready_ = true;
          heartbeat_interval_ms_ = std::max<int>(50, root.getRegistered().getHeartbeatIntervalMs());
          break;
        case Envelope::ERROR:
          // The coordinator forgot us (it restarted, or declared us lost): register again now.
          STRATA_LOG(kInfo) << "coordinator says: " << root.getError().getMessage().cStr() << "; re-registering";
          registered_ = false;
          last_register_ms_ = 0;
          break;
        case Envelope::ASSIGN_TASK:
          HandleAssign(root.getAssignTask());
          break;
        case Envelope::CANCEL_TASK:
          if (deferred_assign_) {  // cancelled before it could start: it never will
            capnp::FlatArrayMessageReader deferred(*deferred_assign_);
            if (root.getCancelTask().getRunId() == deferred.getRoot<AssignTask>().getRunId()) deferred_assign_.reset();
          }
          if (task_ && task_->run_id_ == root.getCancelTask().getRunId().cStr()) {
            task_->snapshot_step.store(root.getCancelTask().getSnapshotStep());
            CancelTask(root.getCancelTask().getReason().cStr());
          }
          break;
        case Envelope::REPLICATE_SHARD: {
          auto r = root.getReplicateShard();
          ShardReplicator::Request request{r.getRunId().cStr(),
                                           r.getSource().cStr(),
                                           r.getSourceKeyRun().cStr(),
                                           r.getKeyRun().cStr(),
                                           r.getStep(),
                                           r.getRank(),
                                           {}};
          for (auto t : r.getTensors()) request.names.push_back(t.getName().cStr());
          if (!replicator_)
            replicator_ = std::make_unique<ShardReplicator>(store_.get(), options_.store_path, curve_, &outbox_);
          replicator_->Add(std::move(request));
          break;
        }
        case Envelope::DELETE_CHECKPOINT: {
          // Retention: the coordinator already forgot this checkpoint, so nothing resumes from it.
          auto d = root.getDeleteCheckpoint();
          Status deleted = store_->DeleteCheckpoint(d.getKeyRun().cStr(), d.getStep());
          if (deleted.ok()) {
            STRATA_LOG(kInfo) << "deleted the checkpoint shard " << d.getKeyRun().cStr() << " at step " << d.getStep()
                              << " (the run keeps only its newest checkpoints)";
          } else if (deleted.code() != StatusCode::kNotFound) {
            STRATA_LOG(kWarn) << "could not delete the checkpoint shard " << d.getKeyRun().cStr() << " at step "
                              << d.getStep() << ": " << deleted.ToString() << " (asked again at the next registration)";
          }
          break;
        }
        case Envelope::SHUTDOWN:
          STRATA_LOG(kInfo) << "coordinator asked this worker to shut down";
          stop_requested_.store(true);
          break;
        default:
          break;
      }
    } catch (const std::exception& e) {
      STRATA_LOG(kError) << "bad message from the coordinator: " << e.what();
    }
  }

  // A task whose device call will not return, or that outlived its cancel by
  // --stuck-task-restart-ms, holds a device this process can no longer use.
  void RestartIfStuck(int64_t now) {
    if (!task_ || task_->done.load()) return;
    if (task_->device_stuck.load()) {
      RestartProcess("run " + task_->run_id_ + ": a device call will not return (an NCCL abort after a peer died)");
    }
    if (task_->cancelled.load() && now - cancelled_at_ms_ > options_.stuck_task_restart_ms) {
      RestartProcess("run " + task_->run_id_ + " did not stop within " +
                     std::to_string(options_.stuck_task_restart_ms / 1000) +
                     " s of its cancel (stuck in a device call)");
    }
  }

  // A task the coordinator cancelled (e.g. a peer was lost and the run re-plans) may still be
  // unwinding when the next assignment comes: the assignment waits here, and the control loop
  // (heartbeats included) goes on, until the old task has ended.
  void StartDeferredAssignment() {
    if (!deferred_assign_ || task_) return;
    auto words = std::move(*deferred_assign_);
    deferred_assign_.reset();
    capnp::FlatArrayMessageReader reader(words);
    HandleAssign(reader.getRoot<AssignTask>());
  }

  // The device is unusable from this process: start this worker again from scratch under the same
  // pid, which `strata up`, systemd and Docker all know, so no supervisor is needed. exec drops
  // the GPU context, its stuck kernels and NCCL's threads as exit would. Every descriptor is made
  // close-on-exec first (the driver's, so the device memory is freed; the store's lock; sockets).
  // The journal learns why from the events flushed here and the re-registration that follows.
  [[noreturn]] void RestartProcess(const std::string& why) {
    STRATA_LOG(kError) << why << "; restarting this worker process (same pid)";
    for (auto& bytes : outbox_.Take()) Send(bytes);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // ZeroMQ's I/O thread sends them
    if (!options_.restart_argv.empty()) {
      MarkDescriptorsCloseOnExec();
      std::vector<char*> argv;
      for (auto& arg : options_.restart_argv) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      STRATA_LOG(kError) << "cannot re-execute /proc/self/exe (" << std::strerror(errno)
                         << "); exiting for the supervisor";
    }
    std::_Exit(3);  // no destructors: they would join the stuck thread
  }

  static void MarkDescriptorsCloseOnExec() {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return;
    const int own = dirfd(dir);
    while (dirent* entry = readdir(dir)) {
      const int fd = std::atoi(entry->d_name);
      if (fd > 2 && fd != own) fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
    }
    closedir(dir);
  }

  void HandleAssign(AssignTask::Reader a) {
    const std::string run_id = a.getRunId().cStr();
    if (task_ && task_->cancelled.load() && !task_->done.load()) {
      capnp::MallocMessageBuilder copy;
      copy.setRoot(a);
      deferred_assign_ = capnp::messageToFlatArray(copy);
      STRATA_LOG(kInfo) << "run " << run_id << " waits for the cancelled task of " << task_->run_id_ << " to stop";
      return;
    }
    if (task_ && task_->cancelled.load()) ReapTask(/*wait=*/true);  // done: joins at once
    if (task_) {
      STRATA_LOG(kWarn) << "ignoring assignment of run " << run_id << ": still running " << task_->run_id_;
      return;
    }
    // The coordinator checked every field; the files are checked here, where they are opened.
    auto spec = ReadRunSpec(a.getSpec(), "the assignment's run spec");
    if (spec.ok()) {
      if (Status files = CheckRunSpecFiles(*spec); !files.ok()) spec = files;
    }
    if (spec.ok() && !spec->model.init_from.empty()) {
      if (Status weights = model::CheckHfCheckpoint(spec->model.init_from, spec->model); !weights.ok()) spec = weights;
    }
    if (spec.ok()) {
      if (Status adapter = model::CheckAdapterFrom(spec->model, spec->lora); !adapter.ok()) spec = adapter;
    }
    auto task = std::make_unique<RunningTask>(run_id, a.getRank(), a.getTaskToken(), &outbox_);
    task->store_path_ = options_.store_path;
    if (!spec.ok()) {
      task->ReportEnd(spec.status(), {});
      return;
    }
    ZmqCommunicatorOptions comm_options;
    comm_options.rank = a.getRank();
    for (auto p : a.getPeerDataAddresses()) comm_options.peer_addresses.push_back(p.cStr());
    comm_options.task_token = a.getTaskToken();
    comm_options.peer_timeout_ms = options_.peer_timeout_ms;
    comm_options.curve = curve_;
    std::vector<uint64_t> chunks;
    for (uint64_t c : a.getChunks()) chunks.push_back(c);
    ResumePoint resume;
    if (a.hasResumeFrom()) {
      auto manifest = a.getResumeFrom();
      resume.run_id = manifest.getRunId().cStr();
      resume.step = manifest.getStep();
      for (auto shard : manifest.getShards()) {
        ResumePoint::Shard s;
        s.store_path = shard.getStorePath().cStr();
        for (auto t : shard.getTensors()) s.tensors.push_back(t.getName().cStr());
        const std::string key_run =
            shard.hasKeyRun() && shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : resume.run_id;
        s.copies.push_back({s.store_path, key_run, shard.getHost().cStr(), shard.getServeAddress().cStr()});
        for (auto c : shard.getCopies()) {
          s.copies.push_back(
              {c.getStorePath().cStr(), c.getKeyRun().cStr(), c.getHost().cStr(), c.getServeAddress().cStr()});
        }
        resume.shards.push_back(std::move(s));
      }
    }
    task->train_ = spec->train;
    if (auto opened = log::TaskLog::Open(log::TaskLogPath(options_.store_path, run_id, a.getRank())); opened.ok()) {
      task->task_log_ = *opened;
    } else {
      STRATA_LOG(kWarn) << "run " << run_id << ": no per-run log: " << opened.status().message();
    }
    if (spec->is_extract()) {
      STRATA_LOG(kInfo) << "starting capture of run " << run_id << ": " << chunks.size() << " chunks";
    } else {
      STRATA_LOG(kInfo) << "starting run " << run_id << " as rank " << a.getRank() << " of " << a.getWorldSize();
    }
    RunningTask* t = task.get();
    task->thread = std::thread([this, t, spec = *spec, comm_options, chunks = std::move(chunks),
                                resume = std::move(resume)] { RunTaskThread(t, spec, comm_options, chunks, resume); });
    task_ = std::move(task);
  }

  // Task thread body: owns the communicator; reports the end; never throws.
  void RunTaskThread(RunningTask* t, RunSpec spec, ZmqCommunicatorOptions comm_options, std::vector<uint64_t> chunks,
                     ResumePoint resume) {
    // This thread's log lines also go to the run's own log (`strata logs RUN --rank R`).
    log::ScopedThreadTaskLog scoped_log(t->task_log_);
    STRATA_LOG(kInfo) << "worker " << options_.name << " (host " << host_ << ") runs run " << t->run_id_ << " as rank "
                      << comm_options.rank;
    Status status;
    ResumePoint resumed_from;
    resumed_from.run_id = resume.run_id;
    resumed_from.step = resume.step;
    const bool spec_is_extract = spec.is_extract();
    try {
      if (spec_is_extract) {
        // Capture needs no peers: each worker's chunks are independent.
        status = RunExtractTask(t, std::move(spec), std::move(chunks));
      } else {
        status = RunTrainTask(t, std::move(spec), comm_options, std::move(resume));
      }
    } catch (const std::exception& e) {
      status = Internal(std::string("task crashed: ") + e.what());
    }
    if (t->cancelled.load() && !status.ok()) {
      STRATA_LOG(kInfo) << "run " << t->run_id_ << " stopped: cancelled";
    } else {
      if (status.code() == StatusCode::kResourceExhausted && !spec_is_extract) {
        STRATA_LOG(kWarn) << "run " << t->run_id_ << ": " << status.message()
                          << "; the coordinator re-plans and replays the step";
      } else if (!status.ok()) {
        STRATA_LOG(kError) << "run " << t->run_id_ << " failed: " << status.ToString();
      }
      t->ReportEnd(status, resumed_from);
    }
    t->done.store(true);
  }

  TaskContext MakeContext(RunningTask* t, RunSpec spec) {
    TaskContext context;
    context.run_id = t->run_id_;
    context.spec = std::move(spec);
    context.store = store_.get();
    context.store_path = options_.store_path;
    context.shard_access = {host_, curve_, 30000};
    context.reporter = t;
    context.cancelled = &t->cancelled;
    context.snapshot_step = &t->snapshot_step;
    context.device_stuck = &t->device_stuck;
    context.collective_timeout_ms = options_.peer_timeout_ms;
    if (options_.faults) context.faults = options_.faults.get();
    return context;
  }

  Status RunExtractTask(RunningTask* t, RunSpec spec, std::vector<uint64_t> chunks) {
    TaskContext context = MakeContext(t, std::move(spec));
    context.chunks = std::move(chunks);
    return executor_->RunExtract(context);
  }

  Status RunTrainTask(RunningTask* t, RunSpec spec, const ZmqCommunicatorOptions& comm_options, ResumePoint resume) {
    STRATA_ASSIGN_OR_RETURN(auto comm, CreateZmqCommunicator(context_, comm_options));
    {
      MutexLock lock(t->communicator_mutex);
      t->communicator = comm.get();
    }
    TaskContext context = MakeContext(t, std::move(spec));
    context.rank = comm_options.rank;
    context.world_size = static_cast<uint32_t>(comm_options.peer_addresses.size());
    context.communicator = comm.get();
    context.resume = std::move(resume);
    Status status = executor_->RunTrain(context);
    // The watchdog: a peer that never arrived is named, and the coordinator treats it as lost. A
    // collective past its deadline (NCCL) names no one: the coordinator finds out who.
    if (!status.ok() && !t->cancelled.load() &&
        (comm->missing_peer() >= 0 || status.code() == StatusCode::kDeadlineExceeded)) {
      t->ReportStalled(comm->missing_peer(), status.message());
    }
    MutexLock lock(t->communicator_mutex);
    t->communicator = nullptr;
    return status;
  }

  void CancelTask(const std::string& why) {
    if (!task_) return;
    STRATA_LOG(kInfo) << "cancelling run " << task_->run_id_ << ": " << why;
    if (!task_->cancelled.load()) cancelled_at_ms_ = net::SteadyMs();
    task_->cancelled.Set();
    MutexLock lock(task_->communicator_mutex);
    if (Communicator* c = task_->communicator) c->Abort();
  }

  void ReapTask(bool wait = false) {
    if (!task_ || (!wait && !task_->done.load())) return;
    task_->thread.join();
    task_.reset();
  }

  WorkerOptions options_;
  std::unique_ptr<TaskExecutor> executor_;
  std::unique_ptr<storage::ShardStore> store_;
  std::unique_ptr<StoreServer> store_server_;  // after store_: stops before the store closes
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  Outbox outbox_;
  std::unique_ptr<ShardReplicator> replicator_;  // after store_ and outbox_: stops before them
  std::unique_ptr<RunningTask> task_;
  std::optional<kj::Array<capnp::word>> deferred_assign_;  // see StartDeferredAssignment
  int64_t cancelled_at_ms_ = 0;                            // steady clock of task_'s cancel
  std::optional<curve::ClientKeys> curve_;                 // with --keys
  std::string host_;                                       // --host, or gethostname
  std::atomic<bool> stop_requested_{false};
  bool registered_ = false;
  bool ready_ = false;          // told on_ready (once per process: re-registering is not a restart)
  int64_t last_status_ms_ = 0;  // steady clock of the last on_status
  int heartbeat_interval_ms_ = 500;
  int64_t last_register_ms_ = -1000000;
  int64_t last_heartbeat_ms_ = 0;
};

}  // namespace

Result<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options, std::unique_ptr<TaskExecutor> executor) {
  if (options.name.empty()) return InvalidArgument("worker: --name is required");
  if (options.data_address.empty()) return InvalidArgument("worker: --data-address is required");
  storage::StoreOptions store_options;
  store_options.salvage = options.salvage_store;
  STRATA_ASSIGN_OR_RETURN(auto store, storage::ShardStore::Open(options.store_path, store_options));
  auto worker = std::make_unique<WorkerImpl>(options, std::move(executor), std::move(store));
  STRATA_RETURN_IF_ERROR(worker->Init());
  return std::unique_ptr<Worker>(std::move(worker));
}

}  // namespace strata::worker
