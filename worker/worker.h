// The worker process: one per GPU (or CPU slot). Its control thread owns the coordinator socket
// and all worker state: it registers, heartbeats every interval with memory stats, starts one
// task at a time on a task thread, forwards the task's reports, and cancels it on request. The
// task thread owns the task's communicator; the two threads share only the Outbox (locked) and
// the cancel flag (atomic).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "worker/task.h"

namespace strata::worker {

struct WorkerOptions {
  std::string name;             // stable id, e.g. "worker-0"
  std::string coordinator;      // endpoint of the coordinator
  std::string store_path;       // this worker's shard store
  std::string data_address;     // data-plane endpoint peers connect to (bound while a task runs)
  int register_retry_ms = 1000;
  int peer_timeout_ms = 120000;
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
