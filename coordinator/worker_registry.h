// The workers the coordinator knows: registration, heartbeats, and the one path that marks a
// worker lost and tells the listeners (runs lose their rank, copies in flight are abandoned).
// Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/memory_snapshot.h"
#include "coordinator/clock.h"
#include "coordinator/dashboard.h"
#include "schema/envelope.h"

namespace strata::coordinator {

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
  // For the dashboard's memory chart: a heartbeat's memory every MemoryHistory::kEveryMs, the
  // last 10 minutes (null until the first).
  std::shared_ptr<const MemoryHistory> memory_history;
};

class WorkerRegistry {
 public:
  // A worker's task is gone (`run` is the run it was on): it was lost, it restarted without its
  // task, or it was declared lost while its run handles the loss itself (then run is empty).
  using TaskLostListener = std::function<void(WorkerEntry& worker, const std::string& run, const std::string& why)>;
  // A worker is lost (after its state became LOST, before TaskLost listeners run).
  using WorkerLostListener = std::function<void(const std::string& worker)>;

  WorkerRegistry(const Clock& clock, int heartbeat_timeout_ms)
      : clock_(clock), heartbeat_timeout_ms_(heartbeat_timeout_ms) {}
  WorkerRegistry(const WorkerRegistry&) = delete;  // by_id_ points into workers_
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  void AddWorkerLostListener(WorkerLostListener listener) { worker_lost_.push_back(std::move(listener)); }
  void AddTaskLostListener(TaskLostListener listener) { task_lost_.push_back(std::move(listener)); }

  // Registers (or re-registers) `req`'s worker; a worker believed busy that comes back without its
  // task has restarted: its task-lost listeners run. InvalidArgument for an empty name.
  Result<WorkerEntry*> Register(const std::string& identity, RegisterWorker::Reader req);
  // False when the worker must register again (unknown, lost, or a placeholder).
  bool Heartbeat(const std::string& identity, Heartbeat::Reader hb);
  // Marks every worker silent for longer than the heartbeat timeout lost.
  void CheckHeartbeats();
  // The one path to LOST: counts it, tells the listeners. With `run_handles_it` the worker's run
  // is not told (the caller is that run, handling several ranks at once).
  void MarkLost(WorkerEntry& worker, const std::string& why, bool run_handles_it = false);
  // A placeholder for a running run's worker after a coordinator restart: busy, no address yet;
  // the heartbeat timeout turns it lost unless it registers in time.
  void ExpectBack(const std::string& id, const std::string& run);

  WorkerEntry* Find(const std::string& id);
  const WorkerEntry* WithStore(const std::string& store_path) const;
  std::map<std::string, WorkerEntry>& all() { return workers_; }
  const std::map<std::string, WorkerEntry>& all() const { return workers_; }
  // Idle workers, by name.
  std::vector<WorkerEntry*> Idle();
  size_t Live() const;
  bool AnyBusy() const;
  uint64_t lost_total() const { return lost_total_; }

 private:
  const Clock& clock_;
  const int heartbeat_timeout_ms_;
  // Creates (or finds) `id`'s entry: the one way into workers_, which keeps by_id_ whole.
  WorkerEntry& Entry(const std::string& id);

  std::map<std::string, WorkerEntry> workers_;  // by name; never erased (a lost worker stays, LOST)
  // The same entries hashed: a heartbeat's lookup, 20,000 a second at 10,000 workers, was a tenth
  // of the loop in the map's string compares.
  std::unordered_map<std::string, WorkerEntry*> by_id_;
  std::vector<WorkerLostListener> worker_lost_;
  std::vector<TaskLostListener> task_lost_;
  uint64_t lost_total_ = 0;  // since this process started
};

}  // namespace strata::coordinator
