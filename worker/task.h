// What the worker's control loop hands to an executor, and how the executor reports back.
// No LibTorch here: the control loop and its tests build without it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/curve.h"
#include "common/memory_snapshot.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "spec/run_spec.h"
#include "storage/shard_store.h"
#include "worker/comm/communicator.h"
#include "worker/fault_injector.h"

namespace strata::worker {

// CPU: resident set (allocated), peak RSS, cgroup limit or MemTotal (total), MemAvailable (free).
MemorySnapshot ReadCpuMemory();
// --memory-limit for a CPU worker, enforced by the OS: the process may map `bytes` more address
// space than it has now (RLIMIT_AS), so a larger allocation really fails (LibTorch throws, and a
// train step reports out of memory). Call once, after startup has mapped code and threads.
Status LimitCpuMemory(uint64_t bytes);
// The process's peak resident set (VmHWM) alone: what a step's peak needs, without the rest.
uint64_t ReadCpuPeakBytes();

// A rank's measured peak memory in one training step (worker/train/device_memory.h says what is
// counted on each device): the forward/backward schedule, and the optimizer update after it.
struct StepMemory {
  int64_t schedule_peak_bytes = 0;
  int64_t update_peak_bytes = 0;
};

// A train step that ran out of memory (schema OutOfMemory says what each field means).
struct OutOfMemoryReport {
  int64_t step = 0;
  int64_t micro_batch = 0;
  int64_t intact_step = -1;
  std::string detail;
  uint64_t free_bytes = 0, total_bytes = 0;
};

// Thread-safe sink for task progress (implemented by the control loop).
class TaskReporter {
 public:
  virtual ~TaskReporter() = default;
  // `grad_norm`: the global L2 norm of the step's gradient, before clipping.
  virtual void ReportStep(int64_t step, double loss, double grad_norm, double tokens_per_second,
                          const StepMemory& memory) = 0;
  // Called after the shard of `step` is committed (durable) in this worker's store, under
  // (key_run, step): the run's id, or a key of its own for a shard cut unlike one already there.
  virtual void ReportCheckpoint(int64_t step, const std::string& key_run,
                                const std::vector<storage::CheckpointTensorInfo>& tensors) = 0;
  // Extract runs: `chunk` is durable in this worker's store (computed now, or found there).
  virtual void ReportChunk(const storage::ActivationChunkInfo& chunk, bool computed) = 0;
  // A line for the run's journal (`strata events`), e.g. kind "oom".
  virtual void ReportNotice(const std::string& kind, const std::string& message) = 0;
  // Train runs: the task is about to end because a step ran out of memory (this is its end
  // report; the coordinator re-plans the run and replays the step).
  virtual void ReportOutOfMemory(const OutOfMemoryReport& report) = 0;
  // Train runs: a wait on the peers passed its deadline (the hang watchdog); `missing_rank` is the
  // world rank that did not arrive, or -1 when the communicator cannot say (NCCL). This is the
  // task's end report, and may come from the watchdog's thread while the task is still blocked.
  virtual void ReportStalled(int64_t missing_rank, const std::string& detail) = 0;
};

// A checkpoint to start a train task from (written under any mesh): where its pieces are.
struct ResumePoint {
  std::string run_id;  // empty: start fresh
  int64_t step = 0;
  // One place that holds a whole shard: its pieces under (key_run, step) in the store at
  // store_path, on `host`; serve_address reaches that store from other hosts while its worker
  // lives (empty otherwise).
  struct Location {
    std::string store_path;
    std::string key_run;  // empty: run_id
    std::string host;
    std::string serve_address;
  };
  struct Shard {
    std::string store_path;  // where the rank that wrote it stored it (= copies.front())
    std::vector<std::string> tensors;
    std::vector<Location> copies;  // the written shard first, then its copies on other hosts
  };
  std::vector<Shard> shards;
};

// Reads the pieces of one checkpoint shard from whichever of its copies this worker reaches.
class ShardReader {
 public:
  virtual ~ShardReader() = default;
  // The piece `name` (of dtype `dtype`) into `out`, which must be exactly its size. Safe to call
  // from several threads at once.
  virtual Status ReadInto(const std::string& name, storage::DType dtype, std::span<uint8_t> out) = 0;
  virtual const std::string& where() const = 0;  // for messages: the store or server read
  virtual bool remote() const = 0;               // read through another host's store server
};

// Beside its own store, what a worker can reach: stores of its host by path (opened read-only
// beside their running owners), and other hosts' stores through their store servers.
struct ShardAccess {
  std::string host;  // this worker's
  std::optional<curve::ClientKeys> keys;
  int timeout_ms = 30000;
};

// The first copy of `shard` this worker reaches, in order: its own store (`own_store` at
// `own_store_path`; may be null), a store on this host, a store server of another host.
// Unavailable, naming every copy, when none is.
Result<std::unique_ptr<ShardReader>> OpenShardReader(const ResumePoint& resume, const ResumePoint::Shard& shard,
                                                     storage::ShardStore* own_store, const std::string& own_store_path,
                                                     const ShardAccess& access);

// A task's cancel: set once by the control thread, read between steps by the task thread, and
// waited on by threads that must act on it at once (the NCCL cancel watcher), which sleep on a
// condition variable instead of polling.
class CancelFlag {
 public:
  bool load() const { return set_.load(); }
  void Set() {
    {
      MutexLock lock(mutex_);
      set_.store(true);
    }
    changed_.NotifyAll();
  }
  // Wakes the waiters without cancelling: what they watch is over.
  void Release() {
    {
      MutexLock lock(mutex_);
      released_ = true;
    }
    changed_.NotifyAll();
  }
  // Blocks until Set (true) or Release (false).
  bool Wait() {
    MutexLock lock(mutex_);
    changed_.Wait(lock, [&]() STRATA_REQUIRES(mutex_) { return set_.load() || released_; });
    return set_.load();
  }
  // Sleeps up to `ms` unless Set first; true when cancelled.
  bool WaitFor(int64_t ms) {
    MutexLock lock(mutex_);
    return changed_.WaitFor(lock, std::chrono::milliseconds(ms), [&] { return set_.load(); });
  }

 private:
  Mutex mutex_;
  CondVar changed_;
  std::atomic<bool> set_{false};  // written under mutex_ (so a waiter cannot miss it), read without
  bool released_ STRATA_GUARDED_BY(mutex_) = false;
};

struct TaskContext {
  std::string run_id;
  RunSpec spec;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  Communicator* communicator = nullptr;
  storage::ShardStore* store = nullptr;
  std::string store_path;    // where `store` lives (a resume shard there is read through `store`)
  ShardAccess shard_access;  // how a resume reaches the shards of other workers' stores
  ResumePoint resume;        // train runs
  TaskReporter* reporter = nullptr;
  CancelFlag* cancelled = nullptr;  // checked between steps
  // Set with a cancel (> 0): save the state of this step before stopping, if it is the state held
  // (schema CancelTask.snapshotStep).
  const std::atomic<int64_t>* snapshot_step = nullptr;
  std::vector<uint64_t> chunks;  // extract runs: the chunks to capture
  // A collective not finished this long after it was issued is aborted (the hang watchdog of
  // communicators that cannot time out a single wait, i.e. NCCL).
  int collective_timeout_ms = 120000;
  // Set (from any thread) when a device call will not return, e.g. an NCCL abort whose in-node
  // peer died mid-collective (NCCL cannot free such a communicator). The device is unusable from
  // this process: the worker restarts its process.
  std::atomic<bool>* device_stuck = nullptr;
  FaultInjector* faults = &NoFaults();  // tests only (fault_injector.h)
};

// Runs tasks on this worker's device (LibTorch lives behind this interface).
class TaskExecutor {
 public:
  virtual ~TaskExecutor() = default;
  // Blocks until the task ends. OK = finished every step; Aborted = cancelled.
  virtual Status RunTrain(TaskContext& context) = 0;
  // Extract runs: captures context.chunks into context.store (skipping chunks already there).
  virtual Status RunExtract(TaskContext& context) = 0;
  // Memory of the device this worker drives (called from the control thread).
  virtual MemorySnapshot ReadMemory() = 0;
};

}  // namespace strata::worker
