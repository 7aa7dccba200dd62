// Changes to a running train run's [parallel] settings that keep its global batch, so its losses
// continue as those of the uninterrupted run (checkpoints are mesh-free). The coordinator applies
// what these return; it never searches meshes itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "shard/planner.h"
#include "spec/run_spec.h"

namespace strata::shard {

struct ParallelChange {
  ParallelSpec parallel;    // the run's [parallel] fields after the change
  std::string description;  // one line for the run's event log (without the global-batch note)
};

// The plan's mesh as [parallel] fields, stage boundaries included (so ranks run what the planner
// estimated); nothing stays "auto".
ParallelSpec ParallelFromPlan(ParallelSpec parallel, const Plan& plan);

// `parallel` with data-parallel size `dp` (a divisor of the global batch); a fixed micro-batch
// that no longer divides a rank's share becomes the largest that does.
ParallelSpec WithDataParallel(ParallelSpec parallel, int64_t global_batch, int64_t dp);

// After lost workers: the largest dp (pp and tp kept) that fits `available` workers and divides
// the global batch. nullopt when not even dp = 1 fits.
std::optional<ParallelChange> ShrinkForLostWorkers(const RunSpec& spec, size_t available);

// A run shrunk from `grow_back_to_dp`: the largest dp above its current one, up to that, that
// divides the global batch and whose extra ranks fit `idle` workers. nullopt when none.
std::optional<int64_t> GrowBackDataParallel(const RunSpec& spec, int64_t grow_back_to_dp, int64_t idle);

// After rank `worker` ran out of memory at `micro_batch` on `ranks` workers: the planner's
// cheapest change that fits (Replan: a smaller micro-batch with more accumulation, recompute, a
// higher ZeRO stage, more stages) on `after` (the failed worker's memory as it reported it); if
// it finds none (its estimate is what just proved wrong), the micro-batch alone is halved while it
// can be. `unbounded` is the same workers with unbounded memory (the failed plan is evaluated on
// it). ResourceExhausted when nothing is left to try (micro-batch 1), naming why.
Result<ParallelChange> ChangeForOutOfMemory(const RunSpec& spec, const ClusterView& unbounded, const ClusterView& after,
                                            const std::string& worker, int64_t micro_batch, size_t ranks);

}  // namespace strata::shard
