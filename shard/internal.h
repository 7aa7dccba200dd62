// Private to shard/: what estimator.cc, search.cc and replan.cc share. Other components use
// shard/planner.h only.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "shard/planner.h"

namespace strata::shard::internal {

struct Problem;

// Layers per stage for each pipeline depth (the job's fixed stages, else balanced), computed
// once for a problem and shared by every worker set its search tries.
class StageSplits {
 public:
  const std::vector<LayerRange>& For(const Problem& problem, int64_t pp);

 private:
  std::map<int64_t, std::vector<LayerRange>> by_pp_;
};

// LoRA (JobSpec::lora): one layer's adapters (model::BlockLoraParameters), the same on every layer;
// all zero without LoRA. shard/lora_memory.cc.
struct LoraCounts {
  int64_t layer = 0;     // adapter parameters of one layer (its A and B matrices)
  int64_t matrices = 0;  // the layer's adapted matrices (GPT-2's c_proj: two)
  int64_t inputs = 0;    // their input widths summed (what dropout > 0 copies per token)
  // QLoRA (lora.base = "nf4"): one layer's linear weights, stored as NF4 at kNf4BytesPerWeight,
  // and the largest of them, dequantized inside its matmul (its compute-dtype copy, transient).
  int64_t nf4_matrix_params = 0;
  int64_t nf4_largest = 0;
};
LoraCounts CountLora(const ModelSpec& model, const LoraSpec& lora);
// QLoRA: `m` (a stage of `layers` layers) with its block linears as NF4 and their dequantization.
void Nf4Base(const LoraCounts& counts, int64_t layers, int64_t compute_bytes, MemoryEstimate* m);

// Validated inputs with the defaults filled in (kv_heads, ffn, sequence, link bandwidths).
struct Problem {
  ModelSpec model;
  JobSpec job;
  StateLayout layout = StateLayout::kFp32;
  std::vector<WorkerView> workers;  // as given
  PlannerOptions options;
  // GPU workers: a bf16 run keeps bf16 working copies of its weights and computes its loss in
  // bf16 (worker/train/stage_model.cc); CPU workers compute in fp32 from the fp32 weights.
  bool cuda = true;
  bool host_checked = false;  // some worker reported its host's free memory (offload is checked against it)
  // Depends on the model and the job's stages only: a copy with other stages needs its own.
  std::shared_ptr<StageSplits> splits = std::make_shared<StageSplits>();
  LoraCounts lora{};  // job.lora's adapters per layer
};

Result<Problem> Validate(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                         const PlannerOptions& options);
// The model's fields within the run spec's bounds (kv_heads and ffn as given), its family known.
Status ValidateModel(ModelSpec& m);
// job.lora's rank and modules for the model, and no fixed [parallel] field a LoRA run does not
// take (tp > 1, ZeRO-3, offload "optimizer+params": spec/run_spec_lora.cc CheckLoraMesh).
Status ValidateLora(const ModelSpec& model, const JobSpec& job);
// The bytes one layer's adapters add to LayerActivationBytes for one micro-batch (0 without LoRA).
double LoraLayerActivationBytes(const Problem& problem, int64_t sequence, int64_t micro_batch, bool fp32_activations);
// "LoRA r=16 on q_proj, v_proj: 6.8M trainable of 8.04B (0.08%), ..." for a plan's why; "" without LoRA.
std::string LoraNote(const Problem& problem);

// One point of the search space.
struct Candidate {
  int64_t dp = 1, pp = 1, tp = 1, zero = 0, micro_batch = 1;
  std::vector<bool> recompute;
  Offload offload = Offload::kNone;
};

// The dp x pp x tp splits of `n` workers that honour the job's fixed fields and the divisibility
// rules (tp | heads, kv_heads and ffn, pp <= layers, dp | global batch, a fixed micro_batch |
// global_batch / dp), tp outermost, then pp.
struct Mesh {
  int64_t dp = 1, pp = 1, tp = 1;
};
std::vector<Mesh> MeshesOf(const Problem& problem, int64_t n);

// Where the optimizer state may live, in the order the search tries them: the job's fixed
// offload, or none, then the optimizer's state, then the parameters too.
std::vector<Offload> OffloadTiers(const Problem& problem);

// A mesh's candidates for one offload that differ only in how many stages recompute: the first
// `recompute_counts[i]` stages of `base` (whose recompute is all false), ascending. A stage's
// memory depends only on its own flag, so the two ends of the counts bound every stage's
// memory over the branch (ChoosePlan skips a mesh no end can fit).
struct Branch {
  Candidate base;
  std::vector<int64_t> recompute_counts;
};
void ForEachBranch(const Problem& problem, const Mesh& mesh, Offload offload,
                   const std::function<void(const Branch&)>& visit);
Candidate WithRecompute(Candidate c, int64_t stages);  // recompute on the first `stages` stages
// Every candidate of one mesh and offload: its branches' recompute counts each.
void ForEachCandidateOf(const Problem& problem, const Mesh& mesh, Offload offload,
                        const std::function<void(const Candidate&)>& visit);

// Calls `visit` for every candidate on `workers_used` workers: each mesh's offloads, ZeRO stages,
// micro-batches (dividing global_batch / dp) and recompute counts.
void ForEachCandidate(const Problem& problem, int64_t workers_used, const std::function<void(const Candidate&)>& visit);

// Parameters of each pipeline unit: unit 0 = embedding, 1..layers = transformer layers,
// layers + 1 = final norm + head (a copy of the tied embedding for GPT-2 when pp > 1).
struct UnitParams {
  int64_t embedding_sharded = 0, embedding_replicated = 0;  // sharded = split over tp
  int64_t layer_sharded = 0, layer_replicated = 0;
  int64_t head_sharded = 0, head_replicated = 0;
};
UnitParams CountUnits(const ModelSpec& model, int64_t pp, int64_t tp);

// What a mesh's placement on the workers decides, per pipeline stage, whatever the rest of the
// candidate (ZeRO stage, micro-batch, recompute, offload): the smallest budget and slowest
// worker among the stage's ranks, and the slowest link of its data-parallel groups, its
// tensor-parallel groups and its pipeline link to the next stage. O(workers) to build, so a
// candidate's evaluation is O(stages) however large the cluster.
struct MeshGeometry {
  std::vector<int64_t> min_budget;
  std::vector<double> min_peak_flops, dp_bandwidth, tp_bandwidth, pp_bandwidth;
};

// Per worker set (one per search size): layer ranges per pipeline depth and geometry per mesh.
class StageCache {
 public:
  // `every_rank_is_first`: every rank is workers.front() (a mesh's estimate on the roomiest
  // worker, to tell that nothing of it can fit anywhere without picking its workers).
  StageCache(const Problem& problem, const std::vector<WorkerView>& workers, bool every_rank_is_first = false);
  const std::vector<LayerRange>& For(int64_t pp);
  const MeshGeometry& Geometry(int64_t dp, int64_t pp, int64_t tp);
  const WorkerView& Worker(int64_t rank) const {
    return workers_[every_rank_is_first_ ? 0 : static_cast<size_t>(rank)];
  }
  const UnitParams& Units(int64_t pp, int64_t tp);

 private:
  const Problem& problem_;
  const std::vector<WorkerView>& workers_;
  const bool every_rank_is_first_;
  std::vector<int> node_of_;  // each worker's node, numbered
  std::map<std::pair<int64_t, int64_t>, UnitParams> units_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, MeshGeometry> geometry_;
};

std::vector<LayerRange> BalanceStages(const Problem& problem, int64_t pp);

// Memory and step time of `candidate` on the cache's workers (in rank order, dp*pp*tp of them).
// With `with_workers` false the plan's per-worker list stays empty (the search's fast path) and
// `fill` receives what WorstFill would say and the largest per-worker total.
struct Fill {
  double worst = 0;  // largest estimate / budget (a node's host memory too, under offload)
  double largest_total = 0;
  bool host_limited = false;  // the worst is a node's host memory
  // ZeRO-3 without recompute: the most layers every such stage could keep gathered (the ones kept
  // now included) within half of what its budget leaves; 0 where no stage gathers.
  int64_t keep_room = 0;
  std::vector<double> stage_total;  // each pipeline stage's device estimate per worker, first to last
};
Plan Evaluate(const Problem& problem, const Candidate& candidate, StageCache& cache, bool with_workers = true,
              Fill* fill = nullptr);
Candidate CandidateOf(const Plan& plan);

// Whether ForEachCandidate(problem, n, ...) visits anything: most sizes have no mesh (dp must
// divide global_batch, tp the heads, pp <= layers; a fixed mesh allows one size), and a search
// over 1..N workers must not pay PickWorkers' O(N log N) copy and sorts for each of them.
bool HasCandidate(const Problem& problem, int64_t n);

// The workers a plan on `count` workers uses, ordered by node then name so consecutive ranks
// (tensor-parallel groups) share a node: the `count` with the most free memory, or with
// `whole_nodes` (plans with tp > 1) the nodes with the most workers first, each node's roomiest
// workers first. Taking the roomiest alone from two 4-worker nodes would give a tp = 4 plan on
// 4 of 8 workers two of each node, and every tensor-parallel all-reduce would cross the network.
std::vector<WorkerView> PickWorkers(const std::vector<WorkerView>& workers, int64_t count, bool whole_nodes = false);

// Largest ratio of estimated total to budget over the plan's workers (> 1: does not fit), and the
// index of that worker. `scale` multiplies every estimate (Replan's calibration after an OOM).
double WorstFill(const Plan& plan, double scale, size_t* worst_worker);

struct StateBytesPerParam {
  double weights;  // persistent weights (master copy)
  double gradients;
  double optimizer;
};
// `eight_bit_optimizer`: train.optimizer = "adamw8bit" (1 byte per moment element and an fp32
// scale per 256).
StateBytesPerParam BytesPerParam(StateLayout layout, bool eight_bit_optimizer = false);

// ChoosePlan's search without the chosen plan's per-worker list, runner-up or reasons (`why` is
// Describe's line), nor the memory options of a refusal: for callers that search many times.
// `splits` (optional): the stage splits of this model and job's stages, shared with other
// searches of the same model (the capacity table's options).
Result<Plan> PlanWithoutWorkers(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                                std::shared_ptr<StageSplits> splits = nullptr);
// ChoosePlan without the memory options of a refusal (its message is the refusal's first
// sentence): the capacity table's rows are those options.
Result<Plan> PlanWithoutOptions(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster);

// The LoRA Strata offers where a spec has none (a refusal's memory options, `strata plan`'s
// rows): r = 16, alpha = 32 on every linear of the family, PEFT's common QLoRA setting.
LoraSpec OfferedLora(Family family);

std::string FormatBytes(double bytes);
std::string Describe(const Plan& plan);  // "dp=2 pp=1 tp=1, ZeRO-1, micro_batch 4 x 2, ..."

}  // namespace strata::shard::internal
