#include "coordinator/admission.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "shard/parallel_change.h"

namespace strata::coordinator {

// Starts pending runs, oldest first, on idle workers (sorted by name for reproducibility).
void Admission::Schedule() {
  // Running extract runs first: their unassigned chunks are older work than any pending run.
  for (auto& [id, run] : c_.runs) {
    if (run.running() && run.spec.is_extract()) extract_.ScheduleChunks(run);
  }
  std::vector<RunEntry*> pending;
  for (auto& [id, run] : c_.runs) {
    if (run.pending()) pending.push_back(&run);
  }
  std::sort(pending.begin(), pending.end(), [](auto* a, auto* b) { return a->created_ms < b->created_ms; });
  for (RunEntry* run : pending) {
    if (run->phase == Phase::kAwaitingSnapshot) return;  // FIFO: its replay waits for the ranks' snapshot
    std::vector<WorkerEntry*> idle = c_.workers.Idle();
    if (!run->spec.is_extract() && !run->spec.parallel.planned()) {
      if (!PlanRun(*run, &idle)) return;  // FIFO: it waits for workers (or it failed)
    }
    // A train run takes a worker per rank of its mesh; a capture, parallel.dp workers.
    auto wanted = static_cast<size_t>(run->spec.is_extract() ? run->spec.parallel.dp : run->spec.parallel.workers());
    if (run->spec.is_extract() && FailUnplaceableExtract(*run)) continue;
    if (idle.size() < wanted && run->phase == Phase::kRecoveringAnyMesh && train_.Replan(*run, idle.size())) {
      wanted = static_cast<size_t>(run->spec.parallel.workers());
    }
    if (idle.size() < wanted) return;  // FIFO: a big run waits rather than being overtaken
    idle.resize(wanted);
    if (run->spec.is_extract()) {
      extract_.Start(*run, idle);
    } else {
      train_.Start(*run, idle);
    }
  }
}

// A capture wanting more workers (parallel.dp) than the cluster has fails at once with the
// reason, as a train run whose mesh no plan can place does (PlanRun), rather than waiting
// without a word. Counts every live worker, busy ones too; with none registered yet it waits.
bool Admission::FailUnplaceableExtract(RunEntry& run) {
  const auto live = static_cast<int64_t>(c_.workers.Live());
  if (live == 0 || run.spec.parallel.dp <= live) return false;
  run.message = "cannot place the run: parallel.dp = " + std::to_string(run.spec.parallel.dp) +
                " capture workers but the cluster has " + std::to_string(live) +
                " live worker(s); set parallel.dp <= " + std::to_string(live) +
                " or add workers (`strata up --workers N`)";
  c_.AddEvent(run, EventKind::kFailed, run.message);
  c_.Transition(run, Phase::kFailed);
  return true;
}

// Fills the [parallel] fields a train run left to the planner ("auto") with the fastest plan
// that fits the idle workers' free memory, and orders `idle` as its ranks. False when the run
// must wait (workers busy or not yet reporting) or has failed (nothing could ever fit).
bool Admission::PlanRun(RunEntry& run, std::vector<WorkerEntry*>* idle) {
  shard::ClusterView cluster = TrainRun::ClusterOf(*idle, false);
  if (cluster.workers.empty()) return false;
  // A fixed dp x pp x tp waits for that many idle workers (busy ones may free up, more may
  // register; `strata submit` refuses one larger than the live cluster unless --queue).
  const ParallelSpec& mesh = run.spec.parallel;
  if (mesh.mesh_fixed() && mesh.workers() > static_cast<int64_t>(cluster.workers.size())) {
    return false;
  }
  auto plan = shard::ChoosePlan(run.spec.model, shard::JobForRun(run.spec), cluster);
  const bool others_busy = c_.workers.AnyBusy();
  const bool only_memory_left = std::all_of(mesh.automatic.begin(), mesh.automatic.end(), [](const std::string& field) {
    return field == "keep_gathered" || field == "offload";
  });
  if (!plan.ok() && only_memory_left) {
    // Every other field fixed: the run starts as a fixed mesh does, unplanned (its estimate is
    // the user's call; an out-of-memory re-plans), keeping no layer gathered and offloading nothing.
    ParallelSpec fixed = mesh;
    if (fixed.automatic.count("keep_gathered")) fixed.keep_gathered = 0;
    if (fixed.automatic.count("offload")) fixed.offload = Offload::kNone;
    fixed.automatic.clear();
    TrainRun::SetParallel(run, fixed);
    c_.Persist(run);
    return true;
  }
  if (!plan.ok()) {
    if (plan.status().code() == StatusCode::kResourceExhausted && others_busy) return false;  // more may free up
    run.message = "cannot plan the run: " + plan.status().message();
    c_.AddEvent(run, EventKind::kFailed, run.message);
    c_.Transition(run, Phase::kFailed);
    return false;
  }
  if (run.spec.train.checkpoint_every == TrainSpec::kAutoCheckpoints) {
    // "auto": a tenth of the run, or the steps the plan predicts for 30 minutes if fewer.
    constexpr double kAutoCheckpointSeconds = 30 * 60;
    const double predicted = plan->step_time.total_s();
    const double step_s = std::isfinite(predicted) && predicted > 1e-9 ? predicted : 1e-9;
    const int64_t in_half_an_hour =
        static_cast<int64_t>(std::clamp(std::floor(kAutoCheckpointSeconds / step_s), 1.0, 1e12));
    run.spec.train.checkpoint_every =
        std::max<int64_t>(1, std::min(run.spec.train.CheckpointInterval(), in_half_an_hour));
  }
  TrainRun::SetParallel(run, shard::ParallelFromPlan(run.spec.parallel, *plan));
  std::vector<WorkerEntry*> ranks;
  for (const auto& w : plan->workers) ranks.push_back(&c_.workers.all().at(w.worker));
  *idle = std::move(ranks);
  c_.AddEvent(run, EventKind::kPlanned, plan->why);
  c_.Persist(run);
  return true;
}

}  // namespace strata::coordinator
