#include "coordinator/train_run.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "common/log.h"
#include "shard/parallel_change.h"
#include "spec/run_spec_capnp.h"

namespace strata::coordinator {
namespace {

std::string FormatBytes(uint64_t bytes) {
  char text[32];
  const bool gib = bytes >= (uint64_t{1} << 30);
  std::snprintf(text, sizeof(text), gib ? "%.2f GiB" : "%.1f MiB",
                static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << (gib ? 30 : 20)));
  return text;
}

}  // namespace

void TrainRun::EnterRecovering(RunEntry& run) {
  c_.Transition(run, Phase::kRecovering);
  ArmRecoveryDeadline(run);
}

void TrainRun::ArmRecoveryDeadline(RunEntry& run) {
  c_.AtPhaseDeadline(run, c_.options.replace_grace_ms, [this](RunEntry& r) {
    c_.Transition(r, Phase::kRecoveringAnyMesh);
    c_.Schedule();
  });
}

// The ranks in `missing` of a running train run did not arrive at a collective (the hang
// watchdog): each is lost to the run, even if it still heartbeats (a live one registers again
// and is told to drop the task), and the run re-plans without them.
void TrainRun::RanksStalled(RunEntry& run, const std::vector<uint32_t>& missing, const std::string& how) {
  std::string names;
  for (uint32_t r : missing)
    names += (names.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " on " + run.workers[r];
  c_.AddEvent(run, EventKind::kStalled, names + " did not arrive: " + how + "; treated as lost");
  for (uint32_t r : missing) {
    if (WorkerEntry* w = c_.workers.Find(run.workers[r]))
      c_.workers.MarkLost(*w, "stalled in a collective", /*run_handles_it=*/true);
  }
  WorkerLost(run, run.workers[missing.front()], names + " stalled");
  c_.Schedule();
}

// Every rank of the stalled attempt reported, or the window closed: blame the silent ones. If
// every rank timed out, no one can be blamed (the fabric, or a hang inside the collective
// itself): the run starts again from its latest checkpoint on the same workers.
void TrainRun::StallWindowClosed(RunEntry& run) {
  if (run.phase != Phase::kStallWindow) return;  // already recovering
  RunEntry::Stall stall = std::move(run.stall);
  run.stall = {};
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < run.workers.size(); ++r) {
    if (!stall.ranks.count(r)) missing.push_back(r);
  }
  const std::string how = std::to_string(stall.ranks.size()) + " of " + std::to_string(run.workers.size()) +
                          " ranks timed out in a collective (" + stall.detail + ")";
  if (!missing.empty()) return RanksStalled(run, missing, how);
  c_.AddEvent(run, EventKind::kStalled,
              "every rank timed out in a collective and none can be blamed: " + how +
                  "; the run starts again from its latest checkpoint");
  Recover(run, "a collective timed out on every rank: the run starts again");
  c_.Schedule();
}

// A train run lost rank `lost`: stop the others, go back to pending, resume from the latest
// complete checkpoint on whoever is there (see train_run.h).
void TrainRun::WorkerLost(RunEntry& run, const std::string& lost, const std::string& why) {
  c_.AddEvent(run, EventKind::kWorkerLost, why + " at step " + std::to_string(run.step));
  Recover(run, "rank on " + lost + " was lost: the run re-plans", lost);
}

// Stops the run's ranks still reachable but `lost` (told `why`), then recovers as WorkerLost
// says.
void TrainRun::Recover(RunEntry& run, const std::string& why, const std::string& lost) {
  c_.CancelRanks(run, why, lost);
  c_.ReleaseWorkers(run);
  run.workers.clear();
  ResumeFromLatest(run);
  const int64_t from = run.step;
  c_.AddEvent(run, EventKind::kRecovering,
              (from > 0 ? "resuming from the checkpoint " +
                              (run.resume_run == run.id ? std::string() : "of " + run.resume_run + " ") + "at step " +
                              std::to_string(from)
                        : std::string("restarting from step 0 (no complete checkpoint)")) +
                  "; waiting up to " + std::to_string(c_.options.replace_grace_ms / 1000) + " s for " +
                  std::to_string(run.spec.parallel.workers()) + " workers, then re-planning onto the workers present");
  EnterRecovering(run);
}

// A rank could not read the checkpoint the run resumed from. The checkpoint is kept (no data is
// deleted) but marked unreadable, and the run starts again from the next older complete one
// (the same run's checkpoints, or the source run's for `submit --resume`).
void TrainRun::CheckpointUnreadable(RunEntry& run, uint32_t rank, ::CheckpointUnreadable::Reader u) {
  const std::string source = u.getSourceRun().cStr();
  const int64_t step = u.getStep();
  if (source != run.resume_run || step != run.resume_step) return;  // about an earlier attempt
  const std::string why = u.getWhy().cStr();
  static_cast<void>(c_.journal.MarkUnreadable(source, step, why));
  const std::string worker = rank < run.workers.size() ? run.workers[rank] : "?";
  c_.CancelRanks(run, "the checkpoint to resume from is unreadable");
  c_.ReleaseWorkers(run);
  run.workers.clear();
  const int64_t older = c_.journal.LastCheckpointStep(source, step);
  std::string what = "rank " + std::to_string(rank) + " on " + worker + " cannot read the checkpoint of " + source +
                     " at step " + std::to_string(step) + " (" + why + "); it is kept and marked unreadable";
  if (older == 0 && source != run.id) {
    c_.AddEvent(run, EventKind::kCheckpointUnreadable, what);
    return c_.FailRun(run, "the checkpoint of " + source + " at step " + std::to_string(step) + " is unreadable and " +
                               source + " has no older complete one; resume from another run or start fresh");
  }
  if (run.resume_step_asked && source != run.id) {  // the user named this one: no other
    c_.AddEvent(run, EventKind::kCheckpointUnreadable, what);
    return c_.FailRun(run, "the checkpoint of " + source + " at step " + std::to_string(step) +
                               " that --resume named is unreadable (" + why + "); " +
                               (older > 0 ? "resume from " + source + "@" + std::to_string(older) +
                                                ", the newest readable one before it"
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
  c_.AddEvent(run, EventKind::kCheckpointUnreadable, what);
  run.losses.resize(std::min<size_t>(run.losses.size(), static_cast<size_t>(older)));
  run.step = older;
  c_.Transition(run, Phase::kQueued);
  c_.Schedule();
}

// The newest complete checkpoint the run can resume from: its own, else the one it started from
// (another run's, via --resume), else none (step 0).
void TrainRun::ResumeFromLatest(RunEntry& run) {
  if (auto step = c_.journal.LastCheckpointStep(run.id); step > 0) {
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
void TrainRun::OutOfMemory(RunEntry& run, uint32_t rank, ::OutOfMemory::Reader oom) {
  if (!run.running()) return;
  const std::string worker = rank < run.workers.size() ? run.workers[rank] : "?";
  const int64_t failed_micro_batch = oom.getMicroBatch();
  c_.AddEvent(run, EventKind::kOom,
              "rank " + std::to_string(rank) + " on " + worker + " (" + FormatBytes(oom.getFreeBytes()) + " of " +
                  FormatBytes(oom.getTotalBytes()) + " free after it): " + oom.getDetail().cStr());
  const int64_t latest = c_.journal.LastCheckpointStep(run.id);
  const int64_t snapshot =
      oom.getIntactStep() > std::max<int64_t>(latest, run.resume_run == run.id ? 0 : run.resume_step)
          ? oom.getIntactStep()
          : 0;
  if (snapshot > 0) {
    run.snapshot.step = snapshot;
    run.snapshot.token = run.task_token;
    run.snapshot.ranks = run.workers.size();
    // Shards of this step already here (the failed rank saves before it reports) are this
    // attempt's: pending_shards is cleared at every assignment.
    if (auto it = run.pending_shards.find(snapshot);
        it != run.pending_shards.end() && it->second.size() == run.snapshot.ranks) {
      committer_.Commit(run, snapshot);
      run.snapshot = {};
    }
  }
  const bool awaiting_snapshot = run.snapshot.token != 0;
  const std::string stop = "rank " + std::to_string(rank) + " ran out of memory: the run re-plans and replays step " +
                           std::to_string(oom.getStep());
  std::vector<WorkerEntry*> ranks;
  for (auto& id : run.workers) {
    auto it = c_.workers.all().find(id);
    if (it == c_.workers.all().end() || it->second.state == WorkerState::LOST) continue;
    ranks.push_back(&it->second);
    c_.SendCancel(it->second, run.id, stop, snapshot);
  }
  if (!ShrinkForMemory(run, worker, failed_micro_batch, oom.getFreeBytes(), oom.getTotalBytes(), ranks))
    return;  // failed: nothing fits
  c_.ReleaseWorkers(run);
  run.workers.clear();
  if (awaiting_snapshot) {  // the resume point is set once the snapshot is in (SnapshotDone)
    c_.AddEvent(run, EventKind::kSnapshot,
                "waiting up to " + std::to_string(c_.options.snapshot_timeout_ms / 1000) + " s for the " +
                    std::to_string(run.snapshot.ranks) + " ranks to save their state of step " +
                    std::to_string(snapshot));
    c_.Transition(run, Phase::kAwaitingSnapshot);
    c_.AtPhaseDeadline(run, c_.options.snapshot_timeout_ms, [this](RunEntry& r) { SnapshotDone(r, false); });
  } else {
    ResumeFromLatest(run);
    c_.Transition(run, Phase::kQueued);
  }
  c_.Schedule();
}

// The snapshot of an out-of-memory stop is committed (`complete`), or did not come in time:
// the run replays from its latest complete checkpoint.
void TrainRun::SnapshotDone(RunEntry& run, bool complete) {
  if (!complete) {
    run.pending_shards.erase(run.snapshot.step);
    c_.AddEvent(run, EventKind::kSnapshot,
                "the state of step " + std::to_string(run.snapshot.step) +
                    " was not saved by every rank in time; replaying from the latest complete checkpoint");
  }
  run.snapshot = {};
  if (run.phase == Phase::kAwaitingSnapshot) {
    ResumeFromLatest(run);
    c_.Transition(run, Phase::kQueued);
    c_.Schedule();
  }
}

// Changes the run's plan after an out-of-memory at `micro_batch` on `worker`: the planner's
// cheapest change that fits (shard::Replan: a smaller micro-batch with more accumulation, then
// recompute, a higher ZeRO stage, more stages); if the planner finds none (its estimate is what
// just proved wrong), the micro-batch alone is halved while it can be. False when nothing is
// left to try: the run has failed, saying what was needed against what is free.
bool TrainRun::ShrinkForMemory(RunEntry& run, const std::string& worker, int64_t micro_batch, uint64_t free_bytes,
                               uint64_t total_bytes, const std::vector<WorkerEntry*>& ranks) {
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
  auto change = shard::ChangeForOutOfMemory(run.spec, unbounded, after, worker, micro_batch, ranks.size());
  if (!change.ok()) {
    c_.FailRun(
        run,
        "out of memory at micro-batch 1 on " + worker + " and no plan for the run's " + std::to_string(ranks.size()) +
            " workers fits their free memory: " + change.status().message() +
            "; add workers, set parallel.recompute = true or parallel.zero = 3, or use workers with more memory, then "
            "resume with `strata submit SPEC --resume " +
            run.id + "`");
    return false;
  }
  SetParallel(run, change->parallel);
  c_.AddEvent(run, EventKind::kReplanned,
              change->description + "; global batch " + std::to_string(run.spec.train.global_batch) +
                  " unchanged, so the losses continue as before");
  return true;
}

// After the grace period: the largest dp (pp and tp kept) that fits `available` workers and
// divides the global batch; micro_batch shrinks to a divisor of the new per-rank batch.
bool TrainRun::Replan(RunEntry& run, size_t available) {
  const int64_t before = run.spec.parallel.dp;
  auto change = shard::ShrinkForLostWorkers(run.spec, available);
  if (!change) return false;
  SetParallel(run, change->parallel);
  if (run.spec.parallel.dp < before) run.grow_back_to_dp = std::max(run.grow_back_to_dp, before);
  c_.AddEvent(run, EventKind::kReplanned,
              change->description + "; global batch " + std::to_string(run.spec.train.global_batch) +
                  " unchanged, so the losses continue as before");
  c_.Persist(run);
  return true;
}

// A run that a lost worker made smaller (Replan) takes workers back at a complete checkpoint:
// when enough are idle again for a larger dp (up to what it ran with) and the time that saves
// over the remaining steps - each rank's share of the same global batch shrinks by dp/new_dp -
// is at least --grow-back-min-saving-s, its ranks stop and it resumes from this checkpoint on
// the larger mesh. Same global batch, so the losses continue as before.
void TrainRun::MaybeGrowBack(RunEntry& run, int64_t step) {
  const ParallelSpec& p = run.spec.parallel;
  // A snapshot being saved (an out-of-memory stop) is not a point to grow from.
  if (c_.options.grow_back_min_saving_s < 0 || !run.running() || run.spec.is_extract() || run.snapshot.token != 0 ||
      run.grow_back_to_dp <= p.dp || run.tokens_per_second <= 0 || run.step < step) {
    return;
  }
  const auto grow =
      shard::GrowBackDataParallel(run.spec, run.grow_back_to_dp, static_cast<int64_t>(c_.workers.Idle().size()));
  if (!grow) return;
  const int64_t grow_to = *grow;
  const double step_seconds =
      static_cast<double>(run.spec.train.global_batch * run.spec.model.sequence) / run.tokens_per_second;
  const double saving = static_cast<double>(run.spec.train.steps - step) * step_seconds *
                        (1.0 - static_cast<double>(p.dp) / static_cast<double>(grow_to));
  if (saving < c_.options.grow_back_min_saving_s) return;
  char estimate[96];
  std::snprintf(estimate, sizeof(estimate), "about %.0f s saved over the %lld steps left", saving,
                static_cast<long long>(run.spec.train.steps - step));
  const int64_t before = p.dp;
  c_.CancelRanks(run, "the run grows back to more workers");
  c_.ReleaseWorkers(run);
  run.workers.clear();
  SetParallel(run, shard::WithDataParallel(run.spec.parallel, run.spec.train.global_batch, grow_to));
  if (grow_to >= run.grow_back_to_dp) run.grow_back_to_dp = 0;
  ResumeFromLatest(run);
  c_.AddEvent(run, EventKind::kGrew,
              "dp " + std::to_string(before) + " -> " + std::to_string(grow_to) +
                  " (workers are idle again): " + "resuming from the checkpoint at step " + std::to_string(run.step) +
                  ", " + estimate + "; global batch " + std::to_string(run.spec.train.global_batch) +
                  " unchanged, so the losses continue as before");
  c_.Transition(run, Phase::kQueued);
  c_.Schedule();
}

void TrainRun::Start(RunEntry& run, const std::vector<WorkerEntry*>& workers) {
  // Every rank gets the manifest of the checkpoint to start from and reads what its place in
  // the mesh needs from the stores it names.
  std::optional<schema::DecodedRecord<CheckpointManifest>> resume;
  if (!run.resume_run.empty()) {
    auto bytes = c_.journal.store().GetMetadata(keys::Checkpoint(run.resume_run, run.resume_step));
    if (bytes.ok() && *bytes) {
      auto decoded = schema::DecodedRecord<CheckpointManifest>::Decode(**bytes);
      if (decoded.ok()) resume.emplace(std::move(decoded).value());
    }
    if (!resume) {  // nothing was assigned: fail without touching the workers
      run.message = "the checkpoint of " + run.resume_run + " at step " + std::to_string(run.resume_step) +
                    " to resume from is gone from the coordinator's store";
      c_.AddEvent(run, EventKind::kFailed, run.message);
      c_.Transition(run, Phase::kFailed);
      return;
    }
  }
  run.workers.clear();
  run.finished_ranks.clear();
  run.pending_shards.clear();  // shards of an earlier attempt never complete a checkpoint of this one
  run.pending_copies.clear();
  run.task_token = c_.rng();
  for (auto* w : workers) run.workers.push_back(w->id);
  EstimateMemory(run, workers);
  for (uint32_t rank = 0; rank < workers.size(); ++rank) {
    WorkerEntry& w = *workers[rank];
    w.state = WorkerState::BUSY;
    w.current_run = run.id;
    schema::EnvelopeBuilder msg;
    auto a = msg.root().initAssignTask();
    a.setRunId(run.id);
    WriteRunSpec(run.spec, a.initSpec());  // planned: `parallel` is the plan
    a.setRank(rank);
    a.setWorldSize(workers.size());
    a.setTaskToken(run.task_token);
    auto peers = a.initPeerDataAddresses(workers.size());
    for (uint32_t i = 0; i < workers.size(); ++i) peers.set(i, workers[i]->data_address);
    if (resume) {
      a.setResumeFrom(resume->root());
      committer_.AddServeAddresses(a.getResumeFrom());
    }
    c_.outbox.Send(w.identity, msg.Serialize());
  }
  std::string names;
  for (auto& n : run.workers) names += (names.empty() ? "" : ", ") + n;
  c_.AddEvent(run, EventKind::kAssigned, "running on " + names);
  c_.Transition(run, Phase::kRunning);
}

// The planner's per-rank estimate for the run's mesh on these workers (0 where it has none).
void TrainRun::EstimateMemory(RunEntry& run, const std::vector<WorkerEntry*>& workers) {
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

void TrainRun::HandleTaskEvent(RunEntry& run, TaskEvent::Reader ev) {
  // Reports of an earlier attempt of this run (a rank still stopping after the run re-planned)
  // change nothing, except the shards of the snapshot that attempt was asked to leave.
  const uint64_t token = ev.getTaskToken();
  const bool snapshot_shard = ev.which() == TaskEvent::CHECKPOINT_SAVED && run.snapshot.token != 0 &&
                              token == run.snapshot.token && ev.getCheckpointSaved().getStep() == run.snapshot.step;
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
      run.updated_ms = c_.clock.UnixMs();
      // Not synced: after a crash the run resumes from a checkpoint and re-reports later steps.
      const std::string bytes = schema::StructToBytes(s);
      Status st = c_.journal.store().PutMetadata(keys::Loss(run.id, step), AsBytes(bytes), false);
      if (!st.ok())
        STRATA_LOG(kError) << "could not persist step " << step << " of " << run.id << ": " << st.ToString();
      files_.AppendMetrics(run, step, s);
      break;
    }
    case TaskEvent::CHECKPOINT_SAVED: {
      const size_t expected = snapshot_shard ? run.snapshot.ranks : run.workers.size();
      if (committer_.ShardSaved(run, rank, ev.getCheckpointSaved(), expected, snapshot_shard) && snapshot_shard)
        SnapshotDone(run, true);
      break;
    }
    case TaskEvent::OUT_OF_MEMORY:
      OutOfMemory(run, rank, ev.getOutOfMemory());
      break;
    case TaskEvent::STALLED: {
      // The hang watchdog: the rank that did not arrive is lost to this run, heartbeats or not.
      if (!run.running()) break;
      auto stalled = ev.getStalled();
      if (!stalled.getRankKnown()) {  // decided once the window closes (StallWindowClosed)
        if (run.phase != Phase::kStallWindow) {
          run.stall = {{}, stalled.getDetail().cStr()};
          c_.Transition(run, Phase::kStallWindow);
          c_.AtPhaseDeadline(run, c_.options.stall_window_ms, [this](RunEntry& r) { StallWindowClosed(r); });
        }
        run.stall.ranks.insert(rank);
        if (run.stall.ranks.size() == run.workers.size()) StallWindowClosed(run);
        break;
      }
      const uint32_t missing = stalled.getMissingRank();
      if (missing >= run.workers.size()) break;
      const std::string waiter = rank < run.workers.size() ? run.workers[rank] : "?";
      RanksStalled(run, {missing},
                   "rank " + std::to_string(rank) + " on " + waiter + " gave up (" + stalled.getDetail().cStr() + ")");
      break;
    }
    case TaskEvent::FINISHED:
      run.finished_ranks.insert(rank);
      if (run.finished_ranks.size() == run.workers.size()) {
        c_.AddEvent(run, EventKind::kFinished,
                    "finished " + std::to_string(run.step) + " steps, final loss " +
                        (run.losses.empty() ? "n/a" : std::to_string(run.losses.back())));
        c_.ReleaseWorkers(run);
        c_.Transition(run, Phase::kFinished);
        c_.Schedule();
      }
      break;
    case TaskEvent::CHECKPOINT_UNREADABLE:
      CheckpointUnreadable(run, rank, ev.getCheckpointUnreadable());
      break;
    case TaskEvent::FAILED:
      c_.AddEvent(run, EventKind::kRankFailed, "rank " + std::to_string(rank) + ": " + ev.getFailed().cStr());
      c_.FailRun(run, std::string("rank ") + std::to_string(rank) + " failed: " + ev.getFailed().cStr());
      break;
    default:
      break;
  }
}

// The run's [parallel] fields become `parallel` (what shard/ decided), and the spec text the
// ranks are sent with them.
void TrainRun::SetParallel(RunEntry& run, const ParallelSpec& parallel) {
  run.spec.parallel = parallel;
  run.spec_toml = RunSpecToToml(run.spec);
}

// The workers' latest heartbeats as the planner sees them.
shard::ClusterView TrainRun::ClusterOf(const std::vector<WorkerEntry*>& workers, bool assume_all_free) {
  shard::ClusterView view;
  for (const WorkerEntry* w : workers) {
    if (w->memory.total_bytes == 0) continue;  // its first memory report has not arrived
    view.workers.push_back(shard::WorkerFromMemory(w->id, w->host, w->memory));
    if (assume_all_free) view.workers.back().free_bytes = view.workers.back().total_bytes;
  }
  return view;
}

}  // namespace strata::coordinator
