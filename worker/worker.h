// The worker process: one per GPU (or CPU slot). Its control thread owns the coordinator socket
// and all worker state: it registers, heartbeats every interval with memory stats, starts one
// task at a time on a task thread, forwards the task's reports, and cancels it on request.
//
// Threads, and what each owns (everything else is the control thread's):
//
//   thread               started by / lives              owns                         shares, and how
//   control              main, the process               coordinator socket, tasks,   Outbox (locked), cancel flag
//                                                        worker state                 (atomic), memory sample (locked)
//   task                 control, one per task           the task's communicators,    Outbox, cancel flag; its
//                                                        Trainer / Extractor          reporter writes the Outbox
//   store server         control, while serving          its ROUTER socket            the shard store (thread-safe)
//   shard replicator     control, on the first copy      its request queue (locked),  the shard store, Outbox
//                        request; until exit             its client sockets
//   memory sampler       executor (detached, 200 ms)     its sample (locked)          never waits on the device
//   checkpoint writer    task, per checkpoint (async)    the host copy it writes      the shard store; one at a time
//   checkpoint pool      checkpoint writer, 4 threads    pieces by an atomic index    the shard store
//   cancel watcher       task, GPU tasks with NCCL       nothing                      waits on the CancelFlag (task.h)
//   abort                cancel watcher (detached)       the communicator's abort     a done flag (atomic)
//   NCCL watchdog        NCCL communicator               collective deadlines         reports stalls via the reporter
//   extract writer       Extractor, per extract task     the chunk queue (locked)     the shard store
//
// Shared state is annotated for clang's -Wthread-safety (common/thread_annotations.h: Mutex,
// GUARDED_BY), checked as errors in the clang build (scripts/fuzz.sh); threads wait on condition
// variables, never poll (the NCCL watchdog alone polls: CUDA events cannot be waited on with a
// deadline).
// Tests inject faults at exact instants (a memory spike in one step, a rank that hangs) through
// WorkerOptions::faults / TaskContext::faults (fault_injector.h); nothing reads the environment.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/task.h"

namespace strata::worker {

struct WorkerOptions {
  std::string name;          // stable id, e.g. "worker-0"
  std::string coordinator;   // endpoint of the coordinator
  std::string store_path;    // this worker's shard store
  std::string data_address;  // data-plane endpoint peers connect to (bound while a task runs)
  // Store server endpoint (ipc:// or tcp:// with keys): answers reads of captured activations
  // from its own thread. Empty: no server (activations of this worker are then unreadable remotely).
  std::string serve_address;
  // The host this worker reports (default: gethostname). Workers of one host read each other's
  // stores by path; a cluster whose workers span hosts keeps a copy of every checkpoint shard on
  // another host. `strata up --hosts N` sets it to emulate N hosts on one machine.
  std::string host;
  int register_retry_ms = 1000;
  int peer_timeout_ms = 120000;
  // A cancelled task that has not stopped after this long is stuck in a device call that will not
  // return (e.g. a collective on a dead peer): the worker restarts its process (re-executes
  // itself with restart_argv, same pid) rather than hold a device it can no longer use. A device
  // call known to be stuck (TaskContext::device_stuck) restarts it at once.
  int stuck_task_restart_ms = 30000;
  // This process's argv without --inject-fault (a restarted worker suffers no test fault again);
  // empty: exit(3) for a supervisor instead.
  std::vector<std::string> restart_argv;
  std::shared_ptr<FaultInjector> faults;  // tests only (fault_injector.h); null: none
  // CURVE key directory (`strata keygen`; worker.key/.pub if present, else client.key/.pub, plus
  // coordinator.pub and authorized_keys). Required when the coordinator or data address is tcp://.
  std::string keys_dir;
  // Open a damaged store anyway, keeping what is intact (storage::StoreOptions::salvage); the
  // coordinator then marks the checkpoints it no longer holds unreadable. Off: a damaged store
  // stops the worker with a message naming it.
  bool salvage_store = false;
  // Optional hooks for a service manager (main.cc wires them to systemd's sd_notify); all run on
  // the control thread, so a stuck control loop stops calling them.
  std::function<void(const std::string& status)> on_ready;   // once: first registered with the coordinator
  std::function<void()> on_tick;                             // every control-loop turn (<= 20 ms apart)
  std::function<void(const std::string& status)> on_status;  // about once a second: registration, task, step
};

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> Create(const WorkerOptions& options, std::unique_ptr<TaskExecutor> executor);
  virtual ~Worker() = default;
  // Serves until the coordinator says shutdown or RequestStop() is called.
  virtual Status Run() = 0;
  virtual void RequestStop() = 0;  // thread- and signal-safe
};

}  // namespace strata::worker
