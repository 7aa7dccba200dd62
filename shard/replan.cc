// Re-planning after a worker is lost or runs out of memory.
//
// Every candidate of the ordinary search on the new cluster view is ranked by how much of the
// running job it disturbs, cheapest first:
//   0  micro-batch / accumulation (and, after a loss, dp) only: same global batch, no state moves
//   1  + activation recompute on more or fewer stages
//   2  + another ZeRO stage or offload: optimizer / gradient shards are re-cut
//   3  + a deeper pipeline: layers move between workers
//   4  anything else (tensor parallelism, a shallower pipeline)
// then by the size of the change (halvings of the micro-batch, stages whose recompute flips,
// ZeRO steps), then by predicted step time, which favours using more of the workers.
//
// Out-of-memory calibration: the failure shows the true peak on worker W reached its free
// memory F while we estimated E_W. Assuming the estimator's error is proportional, every
// estimate is scaled by max(1, F / E_W) before the fit test, so on W a new plan must estimate at
// most E_W * (1 - safety_margin): a change that saves too little is not offered.
//
// State that must move: each worker's persistent state (weights and optimizer state; gradients
// are rebuilt by the next step) is a set of fractions of pipeline units (embedding, each layer,
// head): its tp slice [r/t, (r+1)/t) of the unit, cut further by dp_rank for ZeRO shards. What a
// worker holds in the new plan minus what it held in the old, summed over workers, in bytes.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "shard/internal.h"

namespace strata::shard {
namespace {

struct Interval {
  double lo = 0, hi = 0;
  double length() const { return hi - lo; }
};

double Overlap(Interval a, Interval b) { return std::max(0.0, std::min(a.hi, b.hi) - std::max(a.lo, b.lo)); }

struct Holding {
  bool held = false;
  Interval weights, optimizer;
};

// What `w` holds of pipeline unit `unit` (0 = embedding, 1..layers, layers + 1 = head).
Holding HoldingOf(const Plan& plan, const WorkerAssignment& w, int64_t unit, int64_t layers) {
  const LayerRange& range = plan.stages[static_cast<size_t>(w.stage)];
  Holding h;
  h.held = (unit == 0 && w.stage == 0) || (unit == layers + 1 && w.stage == plan.pp - 1) ||
           (unit >= 1 && unit <= layers && unit - 1 >= range.begin && unit - 1 < range.end);
  if (!h.held) return h;
  const double slice = 1.0 / plan.tp, lo = w.tp_rank * slice;
  const Interval tp_slice{lo, lo + slice};
  const Interval zero_shard{lo + w.dp_rank * slice / plan.dp, lo + (w.dp_rank + 1) * slice / plan.dp};
  h.weights = plan.zero >= 3 ? zero_shard : tp_slice;
  h.optimizer = plan.zero >= 1 ? zero_shard : tp_slice;
  return h;
}

int64_t BytesToMove(const internal::Problem& problem, const Plan& from, const Plan& to) {
  const int64_t layers = problem.model.layers;
  const internal::UnitParams u = internal::CountUnits(problem.model, to.pp, to.tp);
  const internal::StateBytesPerParam per_param =
      internal::BytesPerParam(problem.layout, problem.job.optimizer == Optimizer::kAdamW8bit);
  // LoRA: the frozen base in the compute dtype, without optimizer state; the adapters (on the
  // layers) as any unit's state (shard/lora_memory.cc).
  const bool lora = problem.job.lora.enabled;
  const double frozen_bytes = problem.layout == StateLayout::kBf16Autocast && problem.cuda ? 2.0 : 4.0;
  double moved = 0;
  for (const WorkerAssignment& w : to.workers) {
    auto old = std::find_if(from.workers.begin(), from.workers.end(),
                            [&](const WorkerAssignment& o) { return o.worker == w.worker; });
    for (int64_t unit = 0; unit <= layers + 1; ++unit) {
      const Holding need = HoldingOf(to, w, unit, layers);
      if (!need.held) continue;
      const Holding had = old == from.workers.end() ? Holding{} : HoldingOf(from, *old, unit, layers);
      const double params = static_cast<double>(unit == 0       ? u.embedding_sharded + u.embedding_replicated
                                                : unit > layers ? u.head_sharded + u.head_replicated
                                                                : u.layer_sharded + u.layer_replicated);
      const double missing_weights = need.weights.length() - (had.held ? Overlap(need.weights, had.weights) : 0.0);
      const double missing_optimizer =
          need.optimizer.length() - (had.held ? Overlap(need.optimizer, had.optimizer) : 0.0);
      if (!lora) {
        moved += params * (missing_weights * per_param.weights + missing_optimizer * per_param.optimizer);
        continue;
      }
      const double adapters = unit >= 1 && unit <= layers ? static_cast<double>(problem.lora.layer) : 0.0;
      moved += missing_weights * (params * frozen_bytes + adapters * per_param.weights) +
               missing_optimizer * adapters * per_param.optimizer;
    }
  }
  return std::llround(moved);
}

int ChangeRank(const Plan& current, const Plan& next) {
  if (next.tp != current.tp || next.pp < current.pp) return 4;
  if (next.pp > current.pp) return 3;
  if (next.zero != current.zero || next.offload != current.offload) return 2;
  if (next.recompute != current.recompute) return 1;
  return 0;
}

int64_t ChangeSize(const Plan& current, int64_t baseline_micro_batch, const Plan& next) {
  int64_t size = std::llabs(std::llround(std::log2(static_cast<double>(next.micro_batch) / baseline_micro_batch)));
  const auto on = [](const Plan& p) { return std::count(p.recompute.begin(), p.recompute.end(), true); };
  size += std::abs(on(next) - on(current)) + std::llabs(next.zero - current.zero) +
          std::abs(static_cast<int>(next.offload) - static_cast<int>(current.offload));
  return size + std::llabs(next.pp - current.pp) + std::llabs(next.tp - current.tp);
}

std::string Changes(const Plan& a, const Plan& b) {
  std::string out;
  auto field = [&](const char* name, int64_t x, int64_t y) {
    if (x != y)
      out += std::string(out.empty() ? "" : ", ") + name + " " + std::to_string(x) + " -> " + std::to_string(y);
  };
  field("workers", static_cast<int64_t>(a.workers.size()), static_cast<int64_t>(b.workers.size()));
  field("dp", a.dp, b.dp);
  field("pp", a.pp, b.pp);
  field("tp", a.tp, b.tp);
  field("zero", a.zero, b.zero);
  field("micro_batch", a.micro_batch, b.micro_batch);
  field("gradient_accumulation", a.gradient_accumulation, b.gradient_accumulation);
  const auto on = [](const Plan& p) {
    return static_cast<int64_t>(std::count(p.recompute.begin(), p.recompute.end(), true));
  };
  field("recompute stages", on(a), on(b));
  field("keep_gathered", a.keep_gathered, b.keep_gathered);
  if (a.offload != b.offload)
    out += std::string(out.empty() ? "" : ", ") + "offload " + std::string(Name(a.offload)) + " -> " +
           std::string(Name(b.offload));
  return out.empty() ? "no change" : out;
}

}  // namespace

Result<PlanChange> Replan(const Plan& current, const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                          const ReplanReason& reason, const PlannerOptions& options) {
  JobSpec open = job;  // the fixed fields are what failed; the ladder may change any of them
  open.dp = open.pp = open.tp = open.zero = open.micro_batch = std::nullopt;
  open.recompute = std::nullopt;
  // Layers kept gathered are what an out-of-memory gives up first (their room was what the
  // estimate left, and the estimate proved low); after a loss, the new mesh's room decides,
  // unless the spec keeps none (0 never narrows the search, so a user's 0 stays).
  const bool keeps_none = reason.kind == ReplanReason::Kind::kOutOfMemory || job.keep_gathered == 0;
  open.keep_gathered = keeps_none ? std::optional<int64_t>(0) : std::nullopt;
  open.offload = job.offload_supported ? std::nullopt : std::optional<Offload>(Offload::kNone);
  STRATA_ASSIGN_OR_RETURN(internal::Problem problem, internal::Validate(model, open, cluster, options));
  if (current.workers.empty() || current.stages.size() != static_cast<size_t>(current.pp) || current.micro_batch < 1) {
    return InvalidArgument("replan: the current plan is empty or inconsistent; pass the Plan that ChoosePlan returned");
  }
  const auto in_view = std::find_if(problem.workers.begin(), problem.workers.end(),
                                    [&](const WorkerView& w) { return w.name == reason.worker; });
  const auto in_plan = std::find_if(current.workers.begin(), current.workers.end(),
                                    [&](const WorkerAssignment& w) { return w.worker == reason.worker; });
  if (in_plan == current.workers.end()) {
    return InvalidArgument("replan: worker \"" + reason.worker +
                           "\" is not part of the current plan; name a worker the plan uses");
  }

  const bool oom = reason.kind == ReplanReason::Kind::kOutOfMemory;
  const int64_t baseline_micro_batch = oom && reason.micro_batch > 0 ? reason.micro_batch : current.micro_batch;
  double scale = 1.0;
  std::string cause;
  if (oom) {
    if (in_view == problem.workers.end()) {
      return InvalidArgument(
          "replan: worker \"" + reason.worker +
          "\" ran out of memory but is missing from the cluster view; include it, or report it lost");
    }
    scale = std::max(1.0, static_cast<double>(in_view->free_bytes) /
                              static_cast<double>(std::max<int64_t>(in_plan->memory.total(), 1)));
    cause = "out of memory at micro_batch " + std::to_string(baseline_micro_batch) + " on \"" + reason.worker + "\"";
  } else {
    if (in_view != problem.workers.end()) {
      return InvalidArgument("replan: worker \"" + reason.worker +
                             "\" is reported lost but is still in the cluster view; drop it from the view");
    }
    cause = "worker \"" + reason.worker + "\" lost";
  }

  std::optional<Plan> best;
  std::tuple<int, int64_t, double, double> best_key;
  // After an OOM the mesh keeps its size (dropping workers cannot lower anyone's peak); after a
  // loss every size is weighed, since the remaining count may factor badly (63 = 3 * 3 * 7).
  const int64_t available = static_cast<int64_t>(problem.workers.size());
  const int64_t largest = oom ? std::min<int64_t>(available, static_cast<int64_t>(current.workers.size())) : available;
  const int64_t smallest = oom ? largest : 1;
  for (int64_t n = largest; n >= smallest; --n) {
    if (!internal::HasCandidate(problem, n)) continue;  // no mesh of n workers: skip picking them
    const std::vector<WorkerView> workers = internal::PickWorkers(problem.workers, n);
    const std::vector<WorkerView> whole_nodes = internal::PickWorkers(problem.workers, n, /*whole_nodes=*/true);
    internal::StageCache stages(problem, workers), tp_stages(problem, whole_nodes);
    internal::ForEachCandidate(problem, n, [&](const internal::Candidate& c) {
      if (oom && c.micro_batch > baseline_micro_batch) return;  // a larger micro-batch cannot cure an OOM
      internal::Fill fill;
      Plan plan = internal::Evaluate(problem, c, c.tp > 1 ? tp_stages : stages, /*with_workers=*/true, &fill);
      if (internal::WorstFill(plan, scale, nullptr) > 1.0) return;
      if (fill.host_limited && fill.worst > 1.0) return;  // offloaded state beyond a node's host memory
      auto key = std::make_tuple(ChangeRank(current, plan), ChangeSize(current, baseline_micro_batch, plan),
                                 plan.step_time.total_s(), plan.step_time.communication_s);
      if (!best || key < best_key) best = std::move(plan), best_key = key;
    });
  }
  if (!best) {
    return Status(StatusCode::kResourceExhausted,
                  "replan after " + cause +
                      ": no plan fits the remaining workers' free memory, even with ZeRO-3, recompute and offload; add "
                      "workers or free memory, then resubmit from the last checkpoint");
  }

  PlanChange change;
  change.bytes_to_move = BytesToMove(problem, current, *best);
  change.description = cause + ": " + Changes(current, *best) + "; " +
                       (change.bytes_to_move == 0
                            ? std::string("no state moves")
                            : internal::FormatBytes(static_cast<double>(change.bytes_to_move)) + " of state moves");
  best->why = "re-planned after " + cause + ". " + internal::Describe(*best);
  change.plan = std::move(*best);
  return change;
}

}  // namespace strata::shard
