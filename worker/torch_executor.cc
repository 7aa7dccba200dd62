#include "worker/torch_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/net.h"
#include "common/thread_annotations.h"
#include "worker/extract/extractor.h"
#include "worker/train/device_memory.h"
#include "worker/train/trainer.h"

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include "worker/comm/nccl_communicator.h"
#endif

namespace strata::worker {
namespace {

// A test's hang before `step` (fault_injector.h): heartbeats go on while the peers wait in the
// step's first collective, which the hang watchdog must notice.
void InjectedHangBeforeStep(const TaskContext& context, int64_t step) {
  const auto hang = context.faults->HangBeforeStep(step, context.rank);
  if (hang == FaultInjector::Hang::kNone) return;
  const bool forever = hang == FaultInjector::Hang::kForever;
  STRATA_LOG(kWarn) << "injected fault: rank " << context.rank << " hangs before step " << step
                    << (forever ? " for good" : " until cancelled");
  if (forever) {
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  context.cancelled->Wait();
}

// Aborts `comm` from a thread of its own and waits up to kAbortDeadlineMs for it. An abort that
// does not return means the device is stuck: NCCL cannot free a communicator whose in-node peer
// died mid-collective (its abort waits for that peer forever; NVIDIA/nccl#863, #1777), so
// nothing on this device will run again in this process, and the worker restarts it
// (TaskContext::device_stuck).
[[maybe_unused]] void AbortOrDeclareStuck(const TaskContext& context, std::shared_ptr<Communicator> comm) {
  constexpr int kAbortDeadlineMs = 1000;  // a working abort takes milliseconds
  STRATA_LOG(kInfo) << "run " << context.run_id << ": cancelled, aborting its communicators";
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> aborted = done->get_future();
  const int64_t start = net::SteadyMs();
  std::thread([comm, done] {  // holds the communicator alive for as long as its abort takes
    comm->Abort();
    done->set_value();
  })
      .detach();
  if (aborted.wait_for(std::chrono::milliseconds(kAbortDeadlineMs)) == std::future_status::ready) {
    STRATA_LOG(kInfo) << "run " << context.run_id << ": communicators aborted in " << net::SteadyMs() - start << " ms";
    return;
  }
  STRATA_LOG(kError) << "run " << context.run_id << ": the communicator abort has not returned after "
                     << kAbortDeadlineMs << " ms; this device is stuck";
  if (context.device_stuck) context.device_stuck->store(true);
}

// Checkpoints are written in the background: the task thread pauses only for the host copy
// (Trainer::CopyCheckpointShard), and one writer thread stages and commits it in the store, then
// reports it. At most one checkpoint is in host memory: the next copy waits for the last write.
class CheckpointWriter {
 public:
  // How often a checkpoint that met a full disk is tried again.
  static constexpr int64_t kDiskRetryMs = 5000;

  explicit CheckpointWriter(TaskContext& context) : context_(context) {}
  ~CheckpointWriter() { (void)Wait(); }

  // Writes `copy` in the background. A full disk does not lose it: the rank keeps the copy in host
  // memory, says so once ("save-paused": the store, what is free, what the write needs), tries
  // again every kDiskRetryMs until the disk has room ("save-resumed") or the task is cancelled,
  // and training goes on meanwhile.
  void Start(HostCheckpoint copy, double copy_seconds) {
    waiting_for_disk_.store(false);
    writing_ = std::async(std::launch::async, [this, copy = std::move(copy), copy_seconds]() mutable -> Status {
      const auto start = std::chrono::steady_clock::now();
      const int64_t step = copy.step, bytes = copy.bytes();
      const std::string what = "the checkpoint of step " + std::to_string(step);
      for (;;) {
        auto saved = Trainer::WriteCheckpointShard(*context_.store, &copy);
        if (saved.ok()) {
          const auto ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
          if (waiting_for_disk_.exchange(false)) {
            context_.reporter->ReportNotice("save-resumed", what + " is written, " + std::to_string(ms / 1000) +
                                                                " s after the disk first had no room for it");
          }
          STRATA_LOG(kInfo) << what << ": " << bytes / (1 << 20) << " MiB copied to the host in "
                            << static_cast<int64_t>(copy_seconds * 1000) << " ms (training paused), written in " << ms
                            << " ms (in the background)";
          context_.reporter->ReportCheckpoint(step, saved->key_run, saved->tensors);
          return Status::Ok();
        }
        // An I/O failure of the store, never mistaken for running out of device memory, which the
        // task reports as ResourceExhausted; only a full disk (the store says so) is waited out.
        if (saved.status().code() != StatusCode::kResourceExhausted) {
          return IoError(what + " was not written: " + saved.status().message());
        }
        if (!waiting_for_disk_.exchange(true)) {
          STRATA_LOG(kWarn) << what << " waits for disk space: " << saved.status().message();
          context_.reporter->ReportNotice("save-paused",
                                          what + " waits for disk space (held in host memory, tried again every " +
                                              std::to_string(kDiskRetryMs / 1000) +
                                              " s; training goes on): " + saved.status().message());
        }
        if (context_.cancelled && context_.cancelled->WaitFor(kDiskRetryMs)) {
          return Aborted("cancelled while " + what + " waited for disk space");
        }
        if (!context_.cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(kDiskRetryMs));
      }
    });
  }

  // True while the write in progress waits for disk space.
  bool waiting_for_disk() const { return waiting_for_disk_.load(); }

  // The last write's status (OK when none is pending).
  Status Wait() {
    if (!writing_.valid()) return Status::Ok();
    try {
      return writing_.get();
    } catch (const std::exception& e) {
      return Internal(std::string("checkpoint write failed: ") + e.what());
    }
  }

 private:
  TaskContext& context_;
  std::future<Status> writing_;
  std::atomic<bool> waiting_for_disk_{false};
};

// A GPU's memory, sampled on a thread of its own: the control thread's heartbeats read the last
// sample and never wait on the device. A long device call (page-locking gigabytes for a
// checkpoint's host copy) holds the driver's lock for seconds, and a worker whose heartbeats stop
// that long is declared lost.
class MemorySampler {
 public:
  static constexpr int kEveryMs = 200;

  explicit MemorySampler(std::function<MemorySnapshot()> read) : state_(std::make_shared<State>()) {
    state_->sample = read();
    // Detached, holding its own state: a thread stuck in a device call must not hold up the
    // worker's exit (the destructor waits for it only briefly).
    std::thread([state = state_, read = std::move(read)] {
      State& s = *state;
      MutexLock lock(s.mutex);
      while (!s.wake.WaitFor(lock, std::chrono::milliseconds(kEveryMs),
                             [&]() STRATA_REQUIRES(s.mutex) { return s.stop; })) {
        lock.Unlock();
        MemorySnapshot fresh = read();
        lock.Lock();
        s.sample = std::move(fresh);
      }
      s.done = true;
      s.wake.NotifyAll();
    }).detach();
  }

  ~MemorySampler() {
    State& s = *state_;
    MutexLock lock(s.mutex);
    s.stop = true;
    s.wake.NotifyAll();
    s.wake.WaitFor(lock, std::chrono::milliseconds(1000), [&]() STRATA_REQUIRES(s.mutex) { return s.done; });
  }

  MemorySnapshot Latest() const {
    MutexLock lock(state_->mutex);
    return state_->sample;
  }

 private:
  struct State {
    Mutex mutex;
    CondVar wake;
    MemorySnapshot sample STRATA_GUARDED_BY(mutex);
    bool stop STRATA_GUARDED_BY(mutex) = false;
    bool done STRATA_GUARDED_BY(mutex) = false;
  };
  std::shared_ptr<State> state_;
};

class TorchExecutor final : public TaskExecutor {
 public:
  TorchExecutor(torch::Device device, uint64_t memory_limit_bytes)
      : device_(device), memory_limit_bytes_(memory_limit_bytes) {
    if (device_.is_cuda()) {
      sampler_ = std::make_unique<MemorySampler>(
          [device, memory_limit_bytes] { return ReadDeviceMemory(device, memory_limit_bytes); });
    }
  }

  // The caching allocator keeps freed blocks; between tasks they are handed back, so heartbeats
  // report the memory really free (to the planner, and to other processes on the GPU). LibTorch
  // also keeps a cuBLAS and a cuBLASLt workspace (32 MiB and more on Hopper) for every stream a
  // matmul ever ran on, allocated from the caching allocator and never freed: a task's CUDA graph
  // captures on a pool stream, so each task left its own pair behind (the one-GPU calibration
  // grid of 2026-11-28 grew about 48 MiB a run). They go too; the next task makes its own.
  void ReleaseCachedMemory() {
#ifdef STRATA_WITH_CUDA
    if (device_.is_cuda()) {
      at::cuda::clearCublasWorkspaces();
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
#endif
  }

  Status RunTrain(TaskContext& context) override {
    bool oom_reported = false;
    Status status = Guarded("training", [&] { return Train(context, &oom_reported); });
    ReleaseCachedMemory();
    if (status.code() == StatusCode::kResourceExhausted && !oom_reported && !context.cancelled->load()) {
      // Out of memory outside a step (building or loading the model): nothing to snapshot.
      ReportOutOfMemory(context, 0, context.spec.micro_batch_rows(), -1, status.message());
    }
    return status;
  }
  Status RunExtract(TaskContext& context) override {
    return Guarded("capture", [&] { return Extract(context); });
  }

  // The control thread's view (heartbeats, registration): a GPU's last sample, at most
  // MemorySampler::kEveryMs old; a CPU's memory read now (/proc, never blocks).
  MemorySnapshot ReadMemory() override { return sampler_ ? sampler_->Latest() : ReadCpuMemory(); }

 private:
  // The device's memory now, for the task thread (it may wait while another thread holds the
  // driver's lock).
  MemorySnapshot ReadDeviceMemory() const { return ReadDeviceMemory(device_, memory_limit_bytes_); }
  static MemorySnapshot ReadDeviceMemory(const torch::Device& device, uint64_t memory_limit_bytes) {
#ifdef STRATA_WITH_CUDA
    if (device.is_cuda()) {
      c10::cuda::set_device(device.index());  // the sampler (or task) thread asks; keep it on our device
      MemorySnapshot m;
      m.device = "cuda:" + std::to_string(device.index());
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        m.free_bytes = free;
        m.total_bytes = total;
      }
      auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      m.allocated_bytes = stats.allocated_bytes[agg].current;
      m.reserved_bytes = stats.reserved_bytes[agg].current;
      m.peak_bytes = stats.allocated_bytes[agg].peak;
      if (memory_limit_bytes > 0) {  // --memory-limit: report the card we emulate
        m.total_bytes = std::min<uint64_t>(m.total_bytes, memory_limit_bytes);
        const uint64_t used = m.reserved_bytes;
        m.free_bytes = std::min<uint64_t>(m.free_bytes, m.total_bytes > used ? m.total_bytes - used : 0);
      }
      const MemorySnapshot host = ReadCpuMemory();  // where an offloaded optimizer's state goes
      m.host_total_bytes = host.total_bytes;
      m.host_free_bytes = host.free_bytes;
      return m;
    }
#endif
    return ReadCpuMemory();
  }

  // LibTorch throws; nothing escapes a task but a Status.
  template <typename Fn>
  static Status Guarded(const char* what, Fn fn) {
    try {
      return fn();
    } catch (const c10::OutOfMemoryError& e) {
      return Status(StatusCode::kResourceExhausted,
                    std::string(what) + " ran out of device memory: " + e.what_without_backtrace());
    } catch (const c10::Error& e) {
      return Internal(std::string("LibTorch error: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return Internal(std::string(what) + " failed: " + e.what());
    }
  }

  Status SetUpThread(const RunSpec& spec) {
    int64_t threads = spec.worker.threads;
#ifdef STRATA_WITH_CUDA
    if (device_.is_cuda()) {
      c10::cuda::set_device(device_.index());
      // A GPU worker's host work (building the model, restoring a checkpoint) gets at least its
      // share of the host's cores: one thread built a ~1B model in 18-25 s on an H100 node.
      const int64_t gpus = std::max<int64_t>(1, static_cast<int64_t>(torch::cuda::device_count()));
      threads = std::max<int64_t>(threads, static_cast<int64_t>(std::thread::hardware_concurrency()) / gpus);
    }
#endif
    const int64_t cores = static_cast<int64_t>(std::thread::hardware_concurrency());
    if (const int64_t clamped = ClampWorkerThreads(threads, cores); clamped != threads) {
      STRATA_LOG(kWarn) << "worker.threads = " << threads << " is more than this machine's " << cores
                        << " cores; using " << clamped;
      threads = clamped;
    }
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
    return Status::Ok();
  }

  Status Extract(TaskContext& context) {
    const auto& spec = context.spec;
    STRATA_RETURN_IF_ERROR(SetUpThread(spec));
    if (spec.extract.precision == Precision::kBf16 && !device_.is_cuda()) {
      return InvalidArgument("extract.precision = \"bf16\" needs a CUDA worker and this one runs on " + device_.str() +
                             "; use precision = \"fp32\" on CPU workers");
    }
    STRATA_ASSIGN_OR_RETURN(
        auto data, TokenData::Load(spec.data, spec.model.vocab, spec.model.sequence, TokenData::Access::kSequential));
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Extractor> extractor,
                            Extractor::Create(context, std::move(data), device_, ReadDeviceMemory()));
    return extractor->Run();
  }

  void ReportOutOfMemory(TaskContext& context, int64_t step, int64_t micro_batch, int64_t intact_step,
                         const std::string& detail) {
    OutOfMemoryReport report;
    report.step = step;
    report.micro_batch = micro_batch;
    report.intact_step = intact_step;
    report.detail = detail;
    ReleaseCachedMemory();
    // What the re-plan may count on: free now, plus what this task still holds (its model and
    // optimizer state), which it gives back when it ends.
    const MemorySnapshot memory = ReadDeviceMemory();
    report.total_bytes = memory.total_bytes;
    report.free_bytes =
        std::min(memory.total_bytes, memory.free_bytes + (device_.is_cuda() ? memory.allocated_bytes : 0));
    context.reporter->ReportOutOfMemory(report);
  }

  // Saves the shard of `step` when that is the state this rank holds whole: the start of a replay
  // under a new plan (SaveCheckpointShard re-reports it if this rank's store holds it already).
  static Status SaveSnapshot(TaskContext& context, Trainer& trainer, int64_t step) {
    if (step <= 0 || step != trainer.step() || !trainer.state_intact()) return Status::Ok();
    STRATA_ASSIGN_OR_RETURN(SavedShard saved, trainer.SaveCheckpointShard());
    context.reporter->ReportCheckpoint(step, saved.key_run, saved.tensors);
    return Status::Ok();
  }

  // A cancelled task stops; asked for a snapshot, it leaves its state behind first.
  static Status Stop(TaskContext& context, Trainer& trainer, CheckpointWriter& writer) {
    if (Status last = writer.Wait(); !last.ok())
      STRATA_LOG(kWarn) << "the last checkpoint write failed: " << last.ToString();
    const int64_t step = context.snapshot_step ? context.snapshot_step->load() : 0;
    Status saved = SaveSnapshot(context, trainer, step);
    if (!saved.ok())
      STRATA_LOG(kWarn) << "could not save the state of step " << step << " before stopping: " << saved.ToString();
    return Aborted("cancelled");
  }

  Status Train(TaskContext& context, bool* oom_reported) {
    const auto& spec = context.spec;
    STRATA_RETURN_IF_ERROR(SetUpThread(spec));
    STRATA_ASSIGN_OR_RETURN(auto data, TokenData::Load(spec.data, spec.model.vocab, spec.model.sequence));
    if (data.size() < static_cast<size_t>(spec.model.sequence + 1)) {
      return InvalidArgument("data.path holds fewer than model.sequence + 1 tokens");
    }
    if (spec.train.precision == Precision::kBf16 && !device_.is_cuda()) {
      return InvalidArgument("train.precision = \"bf16\" needs a CUDA worker and this one runs on " + device_.str() +
                             "; use precision = \"fp32\" on CPU workers");
    }
    // GPU ranks talk over NCCL (bootstrapped over the task's ZeroMQ world), CPU ranks over ZeroMQ.
    std::shared_ptr<Communicator> nccl;
    std::thread cancel_watcher;
#ifdef STRATA_WITH_CUDA
    if (device_.is_cuda() && context.world_size > 1) {
      // A collective past its deadline is reported at once, from the watchdog's thread: this one
      // may stay blocked on it.
      auto on_timeout = [reporter = context.reporter](const std::string& why) { reporter->ReportStalled(-1, why); };
      STRATA_ASSIGN_OR_RETURN(nccl, CreateNcclCommunicator(*context.communicator, device_.index(),
                                                           context.collective_timeout_ms, on_timeout));
      context.communicator = nccl.get();
      // A cancel (e.g. a peer was lost) must also reach NCCL: kernels waiting for a dead peer
      // never return on their own, and this thread may be blocked on one.
      cancel_watcher = std::thread([&] {
        if (context.cancelled->Wait()) AbortOrDeclareStuck(context, nccl);
      });
    }
#endif
    struct JoinOnExit {
      CancelFlag& cancelled;
      std::thread& thread;
      ~JoinOnExit() {
        cancelled.Release();  // the watcher wakes and ends without aborting anything
        if (thread.joinable()) thread.join();
      }
    } join_watcher{*context.cancelled, cancel_watcher};
    const int64_t build_start = net::SteadyMs();
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> made, Trainer::Create(context, std::move(data), device_));
    Trainer& trainer = *made;
    STRATA_LOG(kInfo) << "run " << context.run_id << ": model built in " << net::SteadyMs() - build_start << " ms";
    if (!context.resume.run_id.empty()) {
      STRATA_RETURN_IF_ERROR(trainer.Resume(context.resume));
      if (context.rank == 0)
        context.reporter->ReportNotice("resumed", "the " + std::to_string(context.world_size) +
                                                      " rank(s) loaded the checkpoint of " + context.resume.run_id +
                                                      " at step " + std::to_string(context.resume.step));
    }
    const int64_t tokens_per_step = spec.train.global_batch * spec.model.sequence;
    StepProfiler profiler(context.run_id, static_cast<int>(context.rank));
    CheckpointWriter writer(context);  // after the trainer: destroyed (and waited for) first
    while (trainer.step() < spec.train.steps) {
      if (context.cancelled->load()) return Stop(context, trainer, writer);
      const auto start = std::chrono::steady_clock::now();
      InjectedHangBeforeStep(context, trainer.step() + 1);
      profiler.BeforeStep(trainer.step() + 1);
      auto stepped = trainer.Step();
      if (!stepped.ok() && context.cancelled->load()) return Stop(context, trainer, writer);
      if (stepped.status().code() == StatusCode::kResourceExhausted) {
        STRATA_RETURN_IF_ERROR(writer.Wait());
        // No rank applied this step (trainer.h): leave the state it started from, then report;
        // the coordinator stops the other ranks, re-plans and replays the step.
        const int64_t failed = trainer.step() + 1;
        int64_t intact = trainer.state_intact() ? trainer.step() : -1;
        if (Status saved = SaveSnapshot(context, trainer, intact); !saved.ok()) {
          STRATA_LOG(kWarn) << "could not save the state of step " << intact
                            << " after running out of memory: " << saved.ToString();
          intact = -1;
        }
        ReportOutOfMemory(context, failed, trainer.micro_batch(), intact, stepped.status().message());
        *oom_reported = true;
        return stepped.status();
      }
      // A step cut short by the communicator's watchdog reports the timeout, not its echo; a step
      // that synced with a collective the watchdog later aborted is not whole either. (A cancel's
      // abort is Stop's business above.)
      if (Status comm = context.communicator->Check(); comm.code() == StatusCode::kDeadlineExceeded) return comm;
      if (!stepped.ok()) return stepped.status();
      const double loss = *stepped;
      profiler.AfterStep(trainer.step());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      context.reporter->ReportStep(trainer.step(), loss, trainer.last_grad_norm(),
                                   tokens_per_step / std::max(seconds, 1e-9), trainer.last_step_memory());
      const bool last = trainer.step() == spec.train.steps;
      const int64_t every = spec.train.CheckpointInterval();
      if (!last && every > 0 && trainer.step() % every == 0 && writer.waiting_for_disk()) {
        // Waiting here for the earlier one would hold every other rank in its next collective past
        // the peer timeout: this checkpoint is skipped (the last one is always taken).
        STRATA_LOG(kWarn) << "no checkpoint of step " << trainer.step()
                          << " on this rank: the one before still waits for disk space";
      } else if (last || (every > 0 && trainer.step() % every == 0)) {
        STRATA_RETURN_IF_ERROR(writer.Wait());  // one checkpoint in host memory at a time
        const auto copy_start = std::chrono::steady_clock::now();
        auto copy = trainer.CopyCheckpointShard();
        STRATA_RETURN_IF_ERROR(copy.status());
        if (Status comm = context.communicator->Check(); comm.code() == StatusCode::kDeadlineExceeded) return comm;
        writer.Start(std::move(copy).value(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count());
      }
    }
    return writer.Wait();  // the final checkpoint is durable and reported before the task ends
  }

  torch::Device device_;
  uint64_t memory_limit_bytes_ = 0;
  std::unique_ptr<MemorySampler> sampler_;  // GPU workers only
};

}  // namespace

Result<std::unique_ptr<TaskExecutor>> CreateTorchExecutor(const TorchExecutorOptions& options) {
  try {
    torch::Device device(options.device);
    if (device.is_cuda()) {
#ifdef STRATA_WITH_CUDA
      if (!torch::cuda::is_available() || device.index() >= static_cast<int>(torch::cuda::device_count())) {
        return InvalidArgument("--device " + options.device + ": no such CUDA device on this machine");
      }
      if (device.index() < 0) device = torch::Device(torch::kCUDA, 0);
      // Bring up the context and the caching allocator now: its stats (read by every heartbeat)
      // are not defined before its first allocation.
      c10::cuda::set_device(device.index());
      (void)torch::empty({1}, torch::TensorOptions().device(device));
      if (options.memory_limit_bytes > 0) {
        // Emulates a smaller card: the caching allocator refuses to grow past the fraction.
        size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess || total == 0) return Internal("cudaMemGetInfo failed");
        const double fraction =
            std::min(1.0, static_cast<double>(options.memory_limit_bytes) / static_cast<double>(total));
        c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
      }
#else
      return InvalidArgument("--device " + options.device +
                             ": this build has no CUDA (built against a CPU LibTorch); use --device cpu");
#endif
    } else if (options.memory_limit_bytes > 0) {
      // The intra-op threads start now, before the limit (worker/main.cc) counts what exists.
      (void)torch::ones({1 << 16}).sum().item<float>();
    }
    return std::unique_ptr<TaskExecutor>(std::make_unique<TorchExecutor>(device, options.memory_limit_bytes));
  } catch (const c10::Error& e) {
    return InvalidArgument("--device " + options.device +
                           " is not a device (use cpu or cuda:N): " + e.what_without_backtrace());
  }
}

std::string TorchBuildInfo() {
  std::string info = std::string("LibTorch ") + TORCH_VERSION;
#ifdef STRATA_WITH_CUDA
  info += ", CUDA build, " + std::to_string(torch::cuda::device_count()) + " GPU(s) visible";
#else
  info += ", CPU build";
#endif
  return info;
}

}  // namespace strata::worker
