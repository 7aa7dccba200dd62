// The train-run state machine. A run moves between the phases of run_entry.h's Phase; every move
// goes through Cluster::Transition (journaled with the events that explain it), and the phases that
// wait (kRecovering, kAwaitingSnapshot, kStallWindow) arm a timer that fires only while the run is
// still in that phase.
//
//   from                    on                                  to
//   kQueued / kRecovering*  enough idle workers (Admission)     kRunning (Start)
//   kRecovering             replace_grace_ms passes             kRecoveringAnyMesh (Replan onto who is there)
//   kRunning                every rank finished                 kFinished
//   kRunning                a rank failed                       kFailed
//   kRunning                a rank is lost / stalled (named)    kRecovering, from the latest complete checkpoint
//   kRunning                a collective timed out, unnamed     kStallWindow
//   kStallWindow            all ranks reported / window closes  kRecovering (silent ranks lost; none: same workers)
//   kRunning                out of memory, snapshot possible    kAwaitingSnapshot (after shard/ shrinks the plan)
//   kRunning                out of memory, no snapshot          kQueued, from the latest complete checkpoint
//   kAwaitingSnapshot       snapshot committed / timeout        kQueued, from the snapshot / latest checkpoint
//   kRunning                resume checkpoint unreadable        kQueued from an older one, or kFailed
//   kRunning                a checkpoint when workers idle      kQueued on a larger dp (grow back)
//
// Train runs survive a lost worker: the surviving ranks are told to stop and the run resumes from
// its latest complete checkpoint (or from the start, or from the checkpoint it was itself resumed
// from). It waits replace_grace_ms for enough workers for its mesh; after that shard/ re-plans it
// onto the workers present: pp and tp stay, dp shrinks to the largest value that fits and divides
// the global batch, so the losses stay those of the uninterrupted run (checkpoints are mesh-free).
// Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/checkpoint_committer.h"
#include "coordinator/cluster.h"
#include "coordinator/run_files.h"
#include "shard/planner.h"

namespace strata::coordinator {

class TrainRun {
 public:
  TrainRun(Cluster& c, CheckpointCommitter& committer, RunFiles& files) : c_(c), committer_(committer), files_(files) {}

  // Starts the run's ranks on `workers` (rank order), from its resume checkpoint if it has one.
  void Start(RunEntry& run, const std::vector<WorkerEntry*>& workers);
  // A report of one of the run's ranks (the run is not terminal).
  void HandleTaskEvent(RunEntry& run, TaskEvent::Reader ev);
  // The run lost its rank on `lost`: the others stop, the run recovers.
  void WorkerLost(RunEntry& run, const std::string& lost, const std::string& why);
  // kRecoveringAnyMesh: re-plans the run onto `available` idle workers (shard::ShrinkForLostWorkers).
  bool Replan(RunEntry& run, size_t available);
  // At a committed checkpoint: takes workers back if the run was made smaller and it pays.
  void MaybeGrowBack(RunEntry& run, int64_t step);
  // Enters kRecovering (journaled) and arms its grace-period timer.
  void EnterRecovering(RunEntry& run);
  // After a restart, a run loaded in kRecovering: its grace period starts again.
  void ArmRecoveryDeadline(RunEntry& run);

  // The run's [parallel] fields become `parallel` (decided by shard/), its spec text with them.
  static void SetParallel(RunEntry& run, const ParallelSpec& parallel);
  // The workers' latest heartbeats as the planner sees them.
  static shard::ClusterView ClusterOf(const std::vector<WorkerEntry*>& workers, bool assume_all_free);

 private:
  void Recover(RunEntry& run, const std::string& why, const std::string& lost = "");
  void RanksStalled(RunEntry& run, const std::vector<uint32_t>& missing, const std::string& how);
  void StallWindowClosed(RunEntry& run);
  void CheckpointUnreadable(RunEntry& run, uint32_t rank, ::CheckpointUnreadable::Reader u);
  void ResumeFromLatest(RunEntry& run);
  void OutOfMemory(RunEntry& run, uint32_t rank, ::OutOfMemory::Reader oom);
  void SnapshotDone(RunEntry& run, bool complete);
  bool ShrinkForMemory(RunEntry& run, const std::string& worker, int64_t micro_batch, uint64_t free_bytes,
                       uint64_t total_bytes, const std::vector<WorkerEntry*>& ranks);
  void EstimateMemory(RunEntry& run, const std::vector<WorkerEntry*>& workers);

  Cluster& c_;
  CheckpointCommitter& committer_;
  RunFiles& files_;
};

}  // namespace strata::coordinator
