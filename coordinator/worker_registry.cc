#include "coordinator/worker_registry.h"

#include <algorithm>

#include "common/log.h"

namespace strata::coordinator {

Result<WorkerEntry*> WorkerRegistry::Register(const std::string& identity, RegisterWorker::Reader req) {
  const std::string name = req.getName().cStr();
  if (name.empty()) return InvalidArgument("registerWorker.name is empty");
  WorkerEntry& w = Entry(name);
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
  w.last_heartbeat_ms = clock_.SteadyMs();
  w.current_run = req.getCurrentRun().cStr();
  w.state = WorkerState::IDLE;
  if (!previous_run.empty() && previous_run != w.current_run) {
    const std::string why = "worker " + name + " restarted (pid " + std::to_string(previous_pid) + " -> " +
                            std::to_string(w.pid) + ") and lost its task";
    for (auto& listener : task_lost_) listener(w, previous_run, why);
  }
  STRATA_LOG(kInfo) << (known ? "worker re-registered: " : "worker registered: ") << name << " pid " << w.pid
                    << " store " << w.store_path;
  return &w;
}

bool WorkerRegistry::Heartbeat(const std::string& identity, Heartbeat::Reader hb) {
  WorkerEntry* found = Find(hb.getWorkerId().cStr());
  // Unknown (coordinator restarted), a placeholder this coordinator made at restart for a running
  // run's worker (it knows no address yet), or declared lost: it must register again.
  if (!found || found->state == WorkerState::LOST || found->pid == 0) return false;
  WorkerEntry& w = *found;
  w.identity = identity;
  w.last_heartbeat_ms = clock_.SteadyMs();
  w.memory = schema::ReadMemoryStats(hb.getMemory());
  const int64_t now_ms = clock_.UnixMs();
  if (!w.memory_history || now_ms - w.memory_history->newest().unix_ms >= MemoryHistory::kEveryMs) {
    const uint64_t used = w.memory.total_bytes >= w.memory.free_bytes ? w.memory.total_bytes - w.memory.free_bytes : 0;
    // Copy on write: a published snapshot may still hold the current one.
    auto next =
        w.memory_history ? std::make_shared<MemoryHistory>(*w.memory_history) : std::make_shared<MemoryHistory>();
    next->Append({now_ms, used, w.memory.allocated_bytes});
    w.memory_history = std::move(next);
  }
  return true;
}

void WorkerRegistry::CheckHeartbeats() {
  const int64_t now = clock_.SteadyMs();
  for (auto& [id, w] : workers_) {
    if (w.state == WorkerState::LOST || now - w.last_heartbeat_ms <= heartbeat_timeout_ms_) continue;
    STRATA_LOG(kWarn) << "worker " << id << " (pid " << w.pid << ") lost: no heartbeat for "
                      << (now - w.last_heartbeat_ms) << " ms";
    MarkLost(w, "worker " + id + " (pid " + std::to_string(w.pid) + ") stopped sending heartbeats");
  }
}

void WorkerRegistry::MarkLost(WorkerEntry& w, const std::string& why, bool run_handles_it) {
  if (w.state == WorkerState::LOST) return;
  w.state = WorkerState::LOST;
  ++lost_total_;
  const std::string run = run_handles_it ? "" : w.current_run;
  w.current_run.clear();
  for (auto& listener : worker_lost_) listener(w.id);
  if (!run.empty()) {
    for (auto& listener : task_lost_) listener(w, run, why);
  }
}

void WorkerRegistry::ExpectBack(const std::string& id, const std::string& run) {
  WorkerEntry& w = Entry(id);
  w.id = id;
  w.identity = id;
  w.state = WorkerState::BUSY;
  w.current_run = run;
  w.last_heartbeat_ms = clock_.SteadyMs();
}

WorkerEntry* WorkerRegistry::Find(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

WorkerEntry& WorkerRegistry::Entry(const std::string& id) {
  auto [it, added] = workers_.try_emplace(id);
  if (added) by_id_.emplace(id, &it->second);  // map nodes never move
  return it->second;
}

const WorkerEntry* WorkerRegistry::WithStore(const std::string& store_path) const {
  for (const auto& [id, w] : workers_) {
    if (w.store_path == store_path) return &w;
  }
  return nullptr;
}

std::vector<WorkerEntry*> WorkerRegistry::Idle() {
  std::vector<WorkerEntry*> idle;
  for (auto& [id, w] : workers_) {
    if (w.state == WorkerState::IDLE) idle.push_back(&w);
  }
  return idle;
}

size_t WorkerRegistry::Live() const {
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w.second.state != WorkerState::LOST; });
}

bool WorkerRegistry::AnyBusy() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const auto& w) { return w.second.state == WorkerState::BUSY; });
}

}  // namespace strata::coordinator
