#include "shard/parallel_change.h"

#include <algorithm>
#include <numeric>

namespace strata::shard {

ParallelSpec ParallelFromPlan(ParallelSpec p, const Plan& plan) {
  p.dp = plan.dp, p.pp = plan.pp, p.tp = plan.tp, p.zero = plan.zero, p.micro_batch = plan.micro_batch;
  p.recompute = !plan.recompute.empty() && plan.recompute.front();
  p.offload = plan.offload;
  p.keep_gathered = plan.keep_gathered;
  p.stages.clear();
  if (plan.pp > 1) {
    for (const LayerRange& stage : plan.stages) p.stages.push_back(stage.size());
  }
  p.automatic.clear();
  return p;
}

ParallelSpec WithDataParallel(ParallelSpec p, int64_t global_batch, int64_t dp) {
  const int64_t local = global_batch / dp;
  if (p.micro_batch > 0 && local % p.micro_batch != 0) p.micro_batch = std::gcd(local, p.micro_batch);
  p.dp = dp;
  return p;
}

std::optional<ParallelChange> ShrinkForLostWorkers(const RunSpec& spec, size_t available) {
  const ParallelSpec& p = spec.parallel;
  const int64_t unit = p.pp * p.tp;
  for (int64_t dp = std::min<int64_t>(p.dp, static_cast<int64_t>(available) / unit); dp >= 1; --dp) {
    if (spec.train.global_batch % dp != 0) continue;
    ParallelChange change{WithDataParallel(p, spec.train.global_batch, dp), ""};
    const ParallelSpec& q = change.parallel;
    change.description = "dp " + std::to_string(p.dp) + " -> " + std::to_string(dp) + " (pp=" + std::to_string(q.pp) +
                         " tp=" + std::to_string(q.tp) + ", " + std::to_string(q.workers()) + " workers of the " +
                         std::to_string(available) + " idle)";
    return change;
  }
  return std::nullopt;
}

std::optional<int64_t> GrowBackDataParallel(const RunSpec& spec, int64_t grow_back_to_dp, int64_t idle) {
  const ParallelSpec& p = spec.parallel;
  const int64_t unit = p.pp * p.tp;
  for (int64_t dp = grow_back_to_dp; dp > p.dp; --dp) {
    if (spec.train.global_batch % dp == 0 && (dp - p.dp) * unit <= idle) return dp;
  }
  return std::nullopt;
}

Result<ParallelChange> ChangeForOutOfMemory(const RunSpec& spec, const ClusterView& unbounded, const ClusterView& after,
                                            const std::string& worker, int64_t micro_batch, size_t ranks) {
  auto plan = ChoosePlan(spec.model, JobForRun(spec), unbounded);
  if (plan.ok()) {
    auto replanned = Replan(*plan, spec.model, JobForRun(spec), after, ReplanReason::OutOfMemory(worker, micro_batch));
    if (replanned.ok() && replanned->plan.workers.size() == ranks) {
      return ParallelChange{ParallelFromPlan(spec.parallel, replanned->plan), replanned->description};
    }
  }
  if (spec.parallel.keep_gathered > 0) {  // the layers kept gathered for the backward go first
    ParallelChange change{spec.parallel, ""};
    change.description = "keep_gathered " + std::to_string(spec.parallel.keep_gathered) +
                         " -> 0 (every layer gathered again for its backward)";
    change.parallel.keep_gathered = 0;
    return change;
  }
  const int64_t local = spec.local_batch();
  const int64_t current = spec.micro_batch_rows();
  if (current <= 1) {
    return Status(StatusCode::kResourceExhausted,
                  plan.ok() ? std::string("the estimate was too low") : plan.status().message());
  }
  ParallelChange change{spec.parallel, ""};
  ParallelSpec& p = change.parallel;
  p.micro_batch = current / 2;
  while (local % p.micro_batch != 0) --p.micro_batch;
  change.description = "micro_batch " + std::to_string(current) + " -> " + std::to_string(p.micro_batch) +
                       " (gradient accumulation " + std::to_string(local / current) + " -> " +
                       std::to_string(local / p.micro_batch) + ")";
  return change;
}

}  // namespace strata::shard
