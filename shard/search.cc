// Input validation and the plan search.
//
// The search covers a small space: for the largest worker count that admits any plan that fits
// (all workers first), every factorisation n = dp * pp * tp with tp | heads and tp | kv_heads,
// pp <= layers, dp | global_batch; every ZeRO stage (only 0 when dp = 1, where sharding changes
// nothing); every micro-batch dividing global_batch / dp; recompute on the first k stages for
// k = 0..pp (stage 0 holds the most micro-batches in flight, so it is the first to need it);
// offload in tiers (none; the optimizer's state; the parameters too), the next only where
// nothing fits in the one before. Meshes that cannot fit even on the roomiest worker are skipped
// unsearched (Search says how that is bounded). A plan fits when every worker's estimate is
// within free_bytes * (1 - safety_margin). The fastest predicted step wins; ties go to less
// communication, then to the simpler plan (less recompute, no offload, lower ZeRO, larger
// micro-batch, shallower pipeline, narrower tensor parallelism). A LoRA job (JobSpec::lora) is
// searched on tp = 1, ZeRO 0-2 and no streamed parameters only (shard/lora_memory.cc).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "shard/internal.h"

namespace strata::shard {
namespace internal {
namespace {

// Ascending. Trial division up to sqrt(n) (pairs d, n / d): 4096 steps for the largest global
// batch a spec allows (2^24), where counting to n spun the planner for minutes at 2^40.
std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// Orders plans: faster first; near-equal times (1e-9 relative) go to less communication, then
// to the simpler plan.
bool Better(const Plan& a, const Plan& b) {
  const double ta = a.step_time.total_s(), tb = b.step_time.total_s();
  if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
  if (a.step_time.communication_s != b.step_time.communication_s)
    return a.step_time.communication_s < b.step_time.communication_s;
  auto simplicity = [](const Plan& p) {
    return std::make_tuple(std::count(p.recompute.begin(), p.recompute.end(), true), p.offload, p.zero, -p.micro_batch,
                           p.pp, p.tp);
  };
  return simplicity(a) < simplicity(b);
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", s);
  return text;
}

std::string StepSummary(const Plan& p) {
  return Seconds(p.step_time.total_s()) + "/step (compute " + Seconds(p.step_time.compute_s) + ", communication " +
         Seconds(p.step_time.communication_s) + ", bubble " + Seconds(p.step_time.bubble_s) + ")";
}

// What `loser` lost on against `winner`: the step-time component it spends most extra on.
std::string LostOn(const Plan& winner, const Plan& loser) {
  const std::pair<double, const char*> parts[] = {
      {loser.step_time.compute_s - winner.step_time.compute_s, "compute"},
      {loser.step_time.communication_s - winner.step_time.communication_s, "communication"},
      {loser.step_time.bubble_s - winner.step_time.bubble_s, "pipeline bubble"}};
  const auto* worst = std::max_element(std::begin(parts), std::end(parts));
  if (worst->first <= 1e-12) return "the tie-break (equal time; the chosen plan is simpler)";
  return std::string(worst->second) + " (+" + Seconds(worst->first) + ")";
}

}  // namespace

std::vector<Mesh> MeshesOf(const Problem& problem, int64_t n) {
  const JobSpec& job = problem.job;
  std::vector<Mesh> meshes;
  for (int64_t tp : Divisors(n)) {
    if ((job.tp && tp != *job.tp) || problem.model.heads % tp || problem.model.kv_heads % tp || problem.model.ffn % tp)
      continue;
    if (job.lora.enabled && tp > 1) break;  // LoRA runs on tp = 1 only (spec/run_spec_lora.cc CheckLoraMesh)
    for (int64_t pp : Divisors(n / tp)) {
      const int64_t dp = n / tp / pp;
      if ((job.pp && pp != *job.pp) || pp > problem.model.layers || (job.dp && dp != *job.dp)) continue;
      if (job.global_batch % dp != 0) continue;
      if (job.micro_batch && (job.global_batch / dp) % *job.micro_batch != 0) continue;
      meshes.push_back({dp, pp, tp});
    }
  }
  return meshes;
}

std::vector<Offload> OffloadTiers(const Problem& problem) {
  if (problem.job.offload) return {*problem.job.offload};
  // LoRA: no streamed parameters (ZeRO-3's); ValidateLora refuses them fixed.
  if (problem.job.lora.enabled) return {Offload::kNone, Offload::kOptimizer};
  return {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams};
}

void ForEachBranch(const Problem& problem, const Mesh& mesh, Offload offload,
                   const std::function<void(const Branch&)>& visit) {
  const JobSpec& job = problem.job;
  const int64_t dp = mesh.dp, pp = mesh.pp, tp = mesh.tp;
  const int64_t local_batch = job.global_batch / dp;
  const std::vector<int64_t> micro_batches =
      job.micro_batch ? std::vector<int64_t>{*job.micro_batch} : Divisors(local_batch);
  // Layers kept gathered (a fixed keep_gathered > 0) are ZeRO-3's without recompute, which LoRA
  // never runs (kept layers mean nothing there, as on any mesh without ZeRO-3).
  const bool lora = job.lora.enabled;
  const bool keeps = !lora && job.keep_gathered.value_or(0) > 0;
  // Parameters in host memory stream as ZeRO-3 gathers them, without recompute (worker/train/stage_model.h).
  const bool streamed = offload == Offload::kOptimizerAndParams;
  const int64_t min_k = job.recompute ? (*job.recompute ? pp : 0) : 0;
  const int64_t max_k = streamed ? 0 : job.recompute || keeps ? min_k : pp;
  std::vector<int64_t> counts;
  for (int64_t k = min_k; k <= max_k; ++k) {
    if (!job.uniform_recompute || k == 0 || k == pp) counts.push_back(k);
  }
  if (counts.empty()) return;  // streamed with recompute fixed on
  std::vector<int64_t> zeros = job.zero  ? std::vector<int64_t>{*job.zero}
                               : dp == 1 ? std::vector<int64_t>{0}
                                         : std::vector<int64_t>{0, 1, 2, 3};
  if (streamed || keeps) zeros = !job.zero || *job.zero == 3 ? std::vector<int64_t>{3} : std::vector<int64_t>{};
  if (lora) std::erase(zeros, 3);  // LoRA: ZeRO 0-2 (the frozen base is what ZeRO-3 would shard)
  for (int64_t zero : zeros) {
    for (int64_t mb : micro_batches) {
      visit(
          Branch{Candidate{dp, pp, tp, zero, mb, std::vector<bool>(static_cast<size_t>(pp), false), offload}, counts});
    }
  }
}

Candidate WithRecompute(Candidate c, int64_t stages) {
  std::fill(c.recompute.begin(), c.recompute.end(), false);
  std::fill_n(c.recompute.begin(), stages, true);
  return c;
}

void ForEachCandidateOf(const Problem& problem, const Mesh& mesh, Offload offload,
                        const std::function<void(const Candidate&)>& visit) {
  ForEachBranch(problem, mesh, offload, [&](const Branch& branch) {
    for (int64_t k : branch.recompute_counts) visit(WithRecompute(branch.base, k));
  });
}

void ForEachCandidate(const Problem& problem, int64_t n, const std::function<void(const Candidate&)>& visit) {
  for (const Mesh& mesh : MeshesOf(problem, n)) {
    for (Offload offload : OffloadTiers(problem)) ForEachCandidateOf(problem, mesh, offload, visit);
  }
}

bool HasCandidate(const Problem& problem, int64_t n) {
  bool any = false;
  for (const Mesh& mesh : MeshesOf(problem, n)) {
    for (Offload offload : OffloadTiers(problem))
      ForEachBranch(problem, mesh, offload, [&](const Branch&) { any = true; });
    if (any) return true;
  }
  return false;
}

std::vector<WorkerView> PickWorkers(const std::vector<WorkerView>& workers, int64_t count, bool whole_nodes) {
  std::vector<WorkerView> picked = workers;
  std::stable_sort(picked.begin(), picked.end(),
                   [](const WorkerView& a, const WorkerView& b) { return a.free_bytes > b.free_bytes; });
  if (whole_nodes && count < static_cast<int64_t>(picked.size())) {
    // Per node: its worker count and where its roomiest worker stands (a tie-break that keeps the
    // memory order between nodes of equal size). Workers of one node compare equal, so the stable
    // sort keeps them roomiest first.
    std::map<std::string, std::pair<int64_t, size_t>> nodes;
    for (size_t i = 0; i < picked.size(); ++i) {
      auto& node = nodes[picked[i].node];
      if (node.first++ == 0) node.second = i;
    }
    std::stable_sort(picked.begin(), picked.end(), [&](const WorkerView& a, const WorkerView& b) {
      const auto& na = nodes.at(a.node);
      const auto& nb = nodes.at(b.node);
      return std::make_pair(-na.first, na.second) < std::make_pair(-nb.first, nb.second);
    });
  }
  picked.resize(static_cast<size_t>(count));
  std::sort(picked.begin(), picked.end(), [](const WorkerView& a, const WorkerView& b) {
    return std::tie(a.node, a.name) < std::tie(b.node, b.name);
  });
  return picked;
}

}  // namespace internal

JobSpec JobForRun(const RunSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  auto fixed = [&](const char* field, int64_t value) -> std::optional<int64_t> {
    if (p.automatic.count(field)) return std::nullopt;
    return value;
  };
  JobSpec job;
  job.global_batch = spec.train.global_batch;
  job.sequence = spec.model.sequence;
  job.precision = spec.train.precision;
  job.optimizer = spec.train.optimizer;
  job.dp = fixed("dp", p.dp);
  job.pp = fixed("pp", p.pp);
  job.tp = fixed("tp", p.tp);
  job.zero = fixed("zero", p.zero);
  if (!p.automatic.count("micro_batch")) {
    // 0 = the whole per-rank batch, which needs dp: fixed here only when dp is.
    if (p.micro_batch > 0)
      job.micro_batch = p.micro_batch;
    else if (job.dp)
      job.micro_batch = spec.train.global_batch / *job.dp;
  }
  if (!p.automatic.count("recompute")) job.recompute = p.recompute;
  if (!p.automatic.count("keep_gathered")) job.keep_gathered = p.keep_gathered;
  // Offload changes no loss (the host's AdamW is the device's arithmetic): searched when the spec
  // leaves it "auto" (tried only where nothing fits without it), else fixed as the spec says; a
  // re-plan after an out-of-memory may still turn it on.
  if (p.automatic.count("offload"))
    job.offload.reset();
  else
    job.offload = p.offload;
  job.offload_supported = true;
  job.sequence_parallel = p.sequence_parallel;
  job.uniform_recompute = true;
  job.stages = p.stages;
  job.lora = spec.lora;
  return job;
}

WorkerView WorkerFromMemory(std::string name, std::string node, const MemorySnapshot& memory) {
  WorkerView v;
  v.name = std::move(name);
  v.node = std::move(node);
  v.total_bytes = static_cast<int64_t>(memory.total_bytes);
  v.free_bytes = static_cast<int64_t>(memory.free_bytes);
  const bool gpu = memory.device.rfind("cuda", 0) == 0;
  v.link = gpu ? "nvlink" : "tcp";
  v.peak_flops = gpu ? 989e12 : 1e11;
  v.gpu = gpu;
  v.host_free_bytes = static_cast<int64_t>(memory.host_free_bytes);
  return v;
}

Result<std::vector<int64_t>> BalancedStages(const ModelSpec& model, int64_t pp) {
  internal::Problem problem{model, JobSpec{}, StateLayout::kFp32, {}, PlannerOptions{}};
  STRATA_RETURN_IF_ERROR(internal::ValidateModel(problem.model));
  if (pp < 1 || pp > problem.model.layers) {
    return InvalidArgument("parallel.pp = " + std::to_string(pp) +
                           " for model.layers = " + std::to_string(problem.model.layers) +
                           "; every pipeline stage needs a layer, use 1 <= pp <= layers");
  }
  std::vector<int64_t> stages;
  for (const LayerRange& r : internal::BalanceStages(problem, pp)) stages.push_back(r.size());
  return stages;
}

namespace {

// One search: the plan, or why none fits and the least free memory a worker would need.
struct Outcome {
  Result<Plan> plan = Status::Ok();
  double leanest_need = 0;    // 0 when no candidate exists at all
  bool host_refused = false;  // an offloaded plan fit the GPUs but not its node's host memory
};

// `full` false: the plan without its per-worker list, runner-up or reasons, and a short refusal
// (LargestTrainable's many searches need only whether a plan fits, and which).
Outcome Search(const internal::Problem& problem, bool full = true) {
  const PlannerOptions& options = problem.options;
  const int64_t all = static_cast<int64_t>(problem.workers.size());
  // The search keeps plans without their per-worker lists (O(stages) each, whatever the cluster
  // size) and expands the few it reports at the end; `n` says which worker set each was on.
  struct Kept {
    Plan plan;
    int64_t n = 0;
  };
  std::optional<Kept> best, second, fastest_rejected, leanest;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Kept> best_per_mesh;
  double leanest_need = 0;
  std::string offload_reason;  // why the chosen plan offloads, when it does
  int64_t evaluated = 0, fitting = 0, used = all;
  bool host_refused = false;  // an offload plan that fit the GPUs but not its node's host memory
  // A mesh none of whose candidates can fit even on the roomiest worker is skipped without
  // picking its workers or searching it. Its bound: every rank on that worker, the smallest
  // micro-batch (every one when keep_gathered is fixed above 0: kept layers cost more the more
  // micro-batches are in flight), each ZeRO stage, and per pipeline stage the leaner of its
  // memory with and without recompute (a stage's memory depends only on its own flag, and the
  // two ends of a branch's recompute counts give both where the count can change it). A mesh
  // passes when every stage's leaner estimate fits: the search is then that of every candidate
  // on the meshes left, which a test holds equal to evaluating them all.
  const std::vector<WorkerView> roomiest = {
      *std::max_element(problem.workers.begin(), problem.workers.end(),
                        [](const WorkerView& a, const WorkerView& b) { return a.free_bytes < b.free_bytes; })};
  const double roomiest_budget = static_cast<double>(roomiest.front().free_bytes) * (1.0 - options.safety_margin);
  internal::StageCache lean_stages(problem, roomiest, /*every_rank_is_first=*/true);
  // Per offload tier: the least memory its hungriest worker needs, over the whole search (the
  // refusal's options) and on the worker count being tried (why a plan offloads).
  std::map<Offload, double> tier_need, tier_need_here;
  auto note_lean = [&](Offload tier, const Kept& kept, double need) {
    if (!leanest || need < leanest_need) leanest = kept, leanest_need = need;
    for (auto* needs : {&tier_need, &tier_need_here}) {
      auto it = needs->find(tier);
      if (it == needs->end() || need < it->second) (*needs)[tier] = need;
    }
  };
  // The bound needs no more memory with more data-parallel ranks (ZeRO shards over more of them;
  // fewer micro-batches are in flight), so once a pp x tp split cannot fit at some dp it cannot
  // at a smaller one either: the search, going down in workers, skips it.
  std::set<std::tuple<Offload, int64_t, int64_t>> cannot_fit;
  const bool keeps = problem.job.keep_gathered.value_or(0) > 0;
  auto can_fit = [&](const internal::Mesh& mesh, Offload tier, int64_t n) {
    if (cannot_fit.count({tier, mesh.pp, mesh.tp})) return false;
    bool any = false;
    std::optional<int64_t> smallest_micro_batch;
    internal::ForEachBranch(problem, mesh, tier, [&](const internal::Branch& branch) {
      if (!smallest_micro_batch) smallest_micro_batch = branch.base.micro_batch;
      if (any || (!keeps && branch.base.micro_batch != *smallest_micro_batch)) return;
      std::vector<double> leaner;  // per stage, over the branch's ends
      for (int64_t count : {branch.recompute_counts.front(), branch.recompute_counts.back()}) {
        internal::Fill fill;
        Kept kept{internal::Evaluate(problem, internal::WithRecompute(branch.base, count), lean_stages,
                                     /*with_workers=*/false, &fill),
                  n};
        ++evaluated;
        note_lean(tier, kept, fill.largest_total / (1.0 - options.safety_margin));
        if (leaner.empty()) leaner = fill.stage_total;
        for (size_t k = 0; k < leaner.size() && k < fill.stage_total.size(); ++k)
          leaner[k] = std::min(leaner[k], fill.stage_total[k]);
        if (branch.recompute_counts.size() == 1) break;
      }
      any = std::all_of(leaner.begin(), leaner.end(), [&](double total) { return total <= roomiest_budget; });
    });
    if (!any) cannot_fit.insert({tier, mesh.pp, mesh.tp});
    return any;
  };
  for (int64_t n = all; n >= 1 && !best; --n) {
    used = n;
    const std::vector<internal::Mesh> meshes = internal::MeshesOf(problem, n);
    if (meshes.empty()) continue;  // at 10k workers, skipping is the whole cost
    tier_need_here.clear();
    // Offload only when nothing fits without it (then the optimizer's state before the parameters).
    for (Offload tier : internal::OffloadTiers(problem)) {
      std::vector<internal::Mesh> open;
      for (const internal::Mesh& mesh : meshes) {
        if (can_fit(mesh, tier, n)) open.push_back(mesh);
      }
      if (open.empty()) continue;
      const std::vector<WorkerView> workers = internal::PickWorkers(problem.workers, n);
      const std::vector<WorkerView> whole_nodes = internal::PickWorkers(problem.workers, n, /*whole_nodes=*/true);
      internal::StageCache stages(problem, workers), tp_stages(problem, whole_nodes);
      for (const internal::Mesh& mesh : open) {
        internal::ForEachCandidateOf(problem, mesh, tier, [&](const internal::Candidate& c) {
          internal::Fill fill;
          Kept kept{internal::Evaluate(problem, c, c.tp > 1 ? tp_stages : stages, /*with_workers=*/false, &fill), n};
          const Plan& plan = kept.plan;
          ++evaluated;
          note_lean(tier, kept,
                    fill.largest_total / (1.0 - options.safety_margin));  // free memory its hungriest worker asks
          if (fill.worst > 1.0) {
            host_refused |= fill.host_limited;
            if (!fastest_rejected || internal::Better(plan, fastest_rejected->plan)) fastest_rejected = kept;
            return;
          }
          ++fitting;
          auto key = std::make_tuple(plan.dp, plan.pp, plan.tp);
          auto it = best_per_mesh.find(key);
          if (it == best_per_mesh.end())
            best_per_mesh.emplace(key, kept);
          else if (internal::Better(plan, it->second.plan))
            it->second = kept;
          if (!best || internal::Better(plan, best->plan)) {
            second = std::move(best);
            best = std::move(kept);
          } else if (!second || internal::Better(plan, second->plan)) {
            second = std::move(kept);
          }
        });
      }
      if (best) {
        if (tier != internal::OffloadTiers(problem).front() && tier_need_here.count(Offload::kNone)) {
          offload_reason =
              std::string(" Offloads ") +
              (tier == Offload::kOptimizer ? "the optimizer's state" : "the optimizer's state and the parameters") +
              " to host memory: without it the leanest plan on " + std::to_string(n) +
              (n == 1 ? " worker" : " workers") + " needs " + internal::FormatBytes(tier_need_here.at(Offload::kNone)) +
              " free per GPU" +
              (tier == Offload::kOptimizerAndParams && tier_need_here.count(Offload::kOptimizer)
                   ? ", and " + internal::FormatBytes(tier_need_here.at(Offload::kOptimizer)) +
                         " with the optimizer's state alone offloaded"
                   : "") +
              ".";
        }
        break;
      }
    }
  }
  // The reported plans with their workers.
  auto expand = [&](const std::optional<Kept>& kept) -> std::optional<Plan> {
    if (!kept) return std::nullopt;
    const std::vector<WorkerView> workers =
        internal::PickWorkers(problem.workers, kept->n, /*whole_nodes=*/kept->plan.tp > 1);
    internal::StageCache stages(problem, workers);
    return internal::Evaluate(problem, internal::CandidateOf(kept->plan), stages);
  };
  if (!leanest) {
    return Outcome{
        InvalidArgument(
            "no dp * pp * tp split of 1.." + std::to_string(all) +
            " workers satisfies the rules (tp divides model.heads and kv_heads, pp <= model.layers, dp divides "
            "train.global_batch = " +
            std::to_string(problem.job.global_batch) +
            ", micro_batch divides global_batch / dp); relax the fixed [parallel] fields or change global_batch"),
        0};
  }
  if (!full) {
    if (!best)
      return Outcome{Status(StatusCode::kResourceExhausted, "no plan fits: the leanest needs " +
                                                                internal::FormatBytes(leanest_need) + " free a worker"),
                     leanest_need};
    best->plan.why = internal::Describe(best->plan);
    best->plan.candidates_evaluated = evaluated;
    return Outcome{std::move(best->plan), leanest_need};
  }
  if (!best) {
    const std::optional<Plan> leanest_plan = expand(leanest);
    size_t worst = 0;
    internal::WorstFill(*leanest_plan, 1.0, &worst);
    const WorkerAssignment& w = leanest_plan->workers[worst];
    const double free = w.budget_bytes / (1.0 - options.safety_margin);
    const bool gpus =
        std::any_of(problem.workers.begin(), problem.workers.end(), [](const WorkerView& v) { return v.gpu; });
    return Outcome{
        Status(StatusCode::kResourceExhausted,
               std::string("no plan fits in the cluster's free memory, even with ") +
                   (problem.job.lora.enabled ? "recompute and offload (LoRA plans tp = 1 and ZeRO 0-2)"
                                             : "ZeRO-3, recompute and offload") +
                   " where the [parallel] fields allow: the leanest (" + internal::Describe(*leanest_plan) +
                   ") needs " + internal::FormatBytes(leanest_need) + " free per " + (gpus ? "GPU" : "worker") +
                   " (with the " + std::to_string(static_cast<int>(options.safety_margin * 100)) +
                   "% safety margin), but worker \"" + w.worker + "\" has " + internal::FormatBytes(free) +
                   " free; add workers, free " + (gpus ? "GPU " : "") +
                   "memory, or shorten the sequence / shrink the model" +
                   (host_refused ? " (plans with the optimizer offloaded fit the GPUs but need more host memory than "
                                   "the nodes have free)"
                                 : "")),
        leanest_need, host_refused};
  }

  // The runner-up is the best plan on another mesh (more telling than a ZeRO-stage variant of the
  // winner); with only one mesh, the second-best plan overall.
  const Kept* runner_up_kept = second ? &*second : nullptr;
  const Kept* other_mesh = nullptr;
  for (const auto& [key, kept] : best_per_mesh) {
    if (key != std::make_tuple(best->plan.dp, best->plan.pp, best->plan.tp) &&
        (!other_mesh || internal::Better(kept.plan, other_mesh->plan)))
      other_mesh = &kept;
  }
  if (other_mesh) runner_up_kept = other_mesh;
  const Plan* runner_up = runner_up_kept ? &runner_up_kept->plan : nullptr;
  std::optional<Plan> chosen = expand(best);

  size_t peak_index = 0;
  internal::WorstFill(*chosen, 1.0, &peak_index);
  const WorkerAssignment& peak = chosen->workers[peak_index];
  std::string why = internal::Describe(*chosen) + ": " + internal::StepSummary(*chosen) + "; peak " +
                    internal::FormatBytes(peak.memory.total()) + " on \"" + peak.worker + "\" of a " +
                    internal::FormatBytes(peak.budget_bytes) + " budget.";
  if (problem.job.lora.enabled) why += " " + internal::LoraNote(problem);
  const bool mesh_fixed = problem.job.dp && problem.job.pp && problem.job.tp;
  if (used < all) {
    why += " Uses " + std::to_string(used) + " of " + std::to_string(all) +
           " workers: " + (mesh_fixed ? "the [parallel] mesh is fixed at that size." : "no plan fit on more.");
  }
  if (runner_up) {
    why += " Runner-up: " + internal::Describe(*runner_up) + ", " + internal::StepSummary(*runner_up) + ", lost on " +
           internal::LostOn(*chosen, *runner_up) + ".";
  }
  if (fastest_rejected && internal::Better(fastest_rejected->plan, *chosen)) {
    const std::optional<Plan> rejected = expand(fastest_rejected);
    size_t i = 0;
    internal::WorstFill(*rejected, 1.0, &i);
    const WorkerAssignment& w = rejected->workers[i];
    why += " Faster but too big: " + internal::Describe(*rejected) + " needs " +
           internal::FormatBytes(w.memory.total()) + " on \"" + w.worker + "\" (budget " +
           internal::FormatBytes(w.budget_bytes) + ").";
  }
  why += offload_reason;
  why += " " + std::to_string(fitting) + " of " + std::to_string(evaluated) + " candidates fit.";
  chosen->why = std::move(why);
  chosen->candidates_evaluated = evaluated;
  return Outcome{std::move(*chosen), leanest_need};
}

std::string Peak(const Plan& plan) {
  size_t i = 0;
  internal::WorstFill(plan, 1.0, &i);
  const WorkerAssignment& w = plan.workers[i];
  return internal::FormatBytes(static_cast<double>(w.memory.total())) + " on \"" + w.worker + "\" of a " +
         internal::FormatBytes(static_cast<double>(w.budget_bytes)) + " budget";
}

}  // namespace

namespace internal {
Result<Plan> PlanWithoutWorkers(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                                std::shared_ptr<StageSplits> splits) {
  STRATA_ASSIGN_OR_RETURN(Problem problem, Validate(model, job, cluster, PlannerOptions{}));
  if (splits) problem.splits = std::move(splits);
  return std::move(Search(problem, /*full=*/false).plan);
}

Result<Plan> PlanWithoutOptions(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster) {
  STRATA_ASSIGN_OR_RETURN(Problem problem, Validate(model, job, cluster, PlannerOptions{}));
  return std::move(Search(problem).plan);
}
}  // namespace internal

Result<Plan> ChoosePlan(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                        const PlannerOptions& options) {
  STRATA_ASSIGN_OR_RETURN(internal::Problem problem, internal::Validate(model, job, cluster, options));
  Outcome outcome = Search(problem);
  if (outcome.plan.ok() || outcome.plan.status().code() != StatusCode::kResourceExhausted)
    return std::move(outcome.plan);
  // Nothing fits: what each memory option Strata has would need, each as the one edit to the
  // spec that `strata plan` then shows with the same numbers.
  struct Option {
    std::string edit;
    JobSpec job;
    bool lora = false;  // a LoRA job: its problem is validated again (its adapters counted)
  };
  std::vector<Option> alternatives;
  const std::vector<Offload> offloads = {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams};
  for (Offload offload : offloads) {
    if (!problem.cuda) break;  // CPU workers: offloading frees nothing
    if (!problem.job.offload_supported && offload != Offload::kNone) continue;
    if (problem.job.offload == offload) continue;                                       // what was just searched
    if (problem.job.lora.enabled && offload == Offload::kOptimizerAndParams) continue;  // not for LoRA
    JobSpec j = problem.job;
    j.offload = offload;
    alternatives.push_back({"parallel.offload = \"" + std::string(Name(offload)) + "\"", j});
  }
  if (problem.job.optimizer != Optimizer::kAdamW8bit) {
    JobSpec j = problem.job;
    j.optimizer = Optimizer::kAdamW8bit;
    alternatives.push_back(
        {std::string("train.optimizer = \"adamw8bit\"") + (j.offload ? "" : " (offload planned as now)"), j});
  }
  // Fine-tuning instead of training every weight: LoRA over a frozen base (docs/lora.md), where
  // the spec leaves the mesh room for it (tp = 1, ZeRO 0-2, no streamed parameters).
  if (!problem.job.lora.enabled && problem.job.tp.value_or(1) == 1 && problem.job.zero.value_or(0) < 3 &&
      problem.job.offload != Offload::kOptimizerAndParams && problem.job.keep_gathered.value_or(0) == 0) {
    JobSpec j = problem.job;
    j.lora = internal::OfferedLora(model.family);
    alternatives.push_back(
        {"[lora] rank = 16, alpha = 32, target_modules = \"all-linear\" (fine-tuning, the base frozen)", j, true});
    j.lora.base = LoraBase::kNf4;
    alternatives.push_back({"[lora] as above with base = \"nf4\" (QLoRA: the blocks' linears in 4 bits)", j, true});
  } else if (problem.job.lora.enabled && problem.job.lora.base == LoraBase::kDense) {
    JobSpec j = problem.job;
    j.lora.base = LoraBase::kNf4;
    alternatives.push_back({"lora.base = \"nf4\" (QLoRA: the blocks' linears in 4 bits)", j, true});
  }
  const bool gpus =
      std::any_of(problem.workers.begin(), problem.workers.end(), [](const WorkerView& v) { return v.gpu; });
  std::string listed;
  for (const Option& option : alternatives) {
    internal::Problem other = problem;
    other.job = option.job;
    if (option.lora) {
      auto validated = internal::Validate(model, option.job, cluster, options);
      if (!validated.ok()) continue;  // the spec's own fields leave no LoRA plan
      other = std::move(validated).value();
    }
    Outcome o = Search(other);
    listed += "\n  " + option.edit + ": ";
    if (o.plan.ok()) {
      listed += "fits - peak " + Peak(*o.plan) + " (" + internal::Describe(*o.plan) + ")";
    } else if (o.plan.status().code() == StatusCode::kResourceExhausted) {
      listed += "does not fit - its leanest plan needs " + internal::FormatBytes(o.leanest_need) + " free per " +
                (gpus ? "GPU" : "worker");
      if (o.host_refused)
        listed +=
            ", and plans that fit the GPUs need more host memory for the offloaded state than the nodes have free";
    } else {
      listed += "no plan: " + o.plan.status().message();
    }
  }
  if (listed.empty()) return std::move(outcome.plan);
  return Status(StatusCode::kResourceExhausted,
                outcome.plan.status().message() +
                    ". Memory options (one edit each to the spec; `strata plan` shows the same numbers):" + listed);
}

}  // namespace strata::shard
