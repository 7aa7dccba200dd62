#include "coordinator/cluster.h"

namespace strata::coordinator {

RunEntry* Cluster::FindRun(const std::string& id) {
  auto it = runs.find(id);
  return it == runs.end() ? nullptr : &it->second;
}

void Cluster::Transition(RunEntry& run, Phase to) {
  run.phase = to;
  ++run.phase_serial;
  Persist(run);
}

void Cluster::AtPhaseDeadline(RunEntry& run, int64_t delay_ms, std::function<void(RunEntry&)> fire) {
  timers.After(delay_ms, [this, id = run.id, serial = run.phase_serial, fire = std::move(fire)] {
    RunEntry* r = FindRun(id);
    if (r && r->phase_serial == serial) fire(*r);
  });
}

void Cluster::FailRun(RunEntry& run, const std::string& why) {
  run.message = why;
  AddEvent(run, EventKind::kFailed, why);
  CancelRanks(run, why);
  ReleaseWorkers(run);
  Transition(run, Phase::kFailed);
  Schedule();
}

void Cluster::SendCancel(const WorkerEntry& w, const std::string& run_id, const std::string& why,
                         int64_t snapshot_step) {
  schema::EnvelopeBuilder msg;
  auto c = msg.root().initCancelTask();
  c.setRunId(run_id);
  c.setReason(why);
  c.setSnapshotStep(snapshot_step);
  outbox.Send(w.identity, msg.Serialize());
}

void Cluster::CancelRanks(const RunEntry& run, const std::string& why, const std::string& except) {
  for (const auto& id : run.workers) {
    const WorkerEntry* w = workers.Find(id);
    if (id != except && w && w->state != WorkerState::LOST) SendCancel(*w, run.id, why);
  }
}

void Cluster::ReleaseWorkers(RunEntry& run) {
  for (auto& id : run.workers) {
    WorkerEntry* w = workers.Find(id);
    if (!w || w->current_run != run.id) continue;
    w->current_run.clear();
    // A placeholder made at a restart (WorkerRegistry::ExpectBack: pid 0, no address) stays out
    // of Idle() until its worker registers again (registering makes it IDLE) or the heartbeat
    // timeout turns it lost. Freed here, a re-plan would give it a rank and every other rank an
    // empty address for it.
    if (w->state == WorkerState::BUSY && w->pid != 0) w->state = WorkerState::IDLE;
  }
}

}  // namespace strata::coordinator
