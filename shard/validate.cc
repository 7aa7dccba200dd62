// Input validation: the cluster's workers, the model and the job, each refusal naming the field
// and what to do; the planner's Problem with the defaults filled in (shard/internal.h).
#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "shard/internal.h"

namespace strata::shard::internal {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

double DefaultBandwidth(const std::string& link) {
  // NVLink: what NCCL's collectives reached between 2 H200s (docs/history/benchmarks-sessions.md,
  // 2026-11-28, "ZeRO-3 streamed in bf16 beside the compute": a 498 MB reduce-scatter in 1.25 ms,
  // 134 MB all-reduces in 0.72 ms), not the 450 GB/s a
  // direction of the link carries.
  if (link == "nvlink") return 200e9;
  if (link == "pcie") return 25e9;  // PCIe 4.0 x16 in practice
  return 1.25e9;                    // 10 Gb/s Ethernet
}

Status ValidateWorkers(const ClusterView& cluster, std::vector<WorkerView>* out) {
  if (cluster.workers.empty()) {
    return InvalidArgument("cluster: no workers are registered; start at least one strata-worker before planning");
  }
  std::set<std::string> names;
  for (WorkerView w : cluster.workers) {
    const std::string who = "worker \"" + w.name + "\": ";
    if (w.name.empty()) return InvalidArgument("cluster: a worker has an empty name; give every worker a unique name");
    if (!names.insert(w.name).second) return InvalidArgument(who + "name appears twice; worker names must be unique");
    if (w.total_bytes <= 0)
      return InvalidArgument(who + "total_bytes = " + Str(w.total_bytes) + "; it must report its device memory (> 0)");
    if (w.free_bytes <= 0)
      return InvalidArgument(who + "free_bytes = " + Str(w.free_bytes) +
                             "; free memory on it or leave it out of the plan");
    if (w.free_bytes > w.total_bytes)
      return InvalidArgument(who + "free_bytes exceeds total_bytes; report both from the same device");
    if (w.link != "nvlink" && w.link != "pcie" && w.link != "tcp") {
      return InvalidArgument(who + "link = \"" + w.link + "\"; use \"nvlink\", \"pcie\" or \"tcp\"");
    }
    if (!(w.peak_flops > 0)) return InvalidArgument(who + "peak_flops must be > 0 (989e12 for an H100 in bf16)");
    if (w.bandwidth < 0) return InvalidArgument(who + "bandwidth must be >= 0 (0 = typical for its link)");
    if (w.bandwidth == 0) w.bandwidth = DefaultBandwidth(w.link);
    if (w.node.empty()) w.node = w.name;  // unknown node: assume it shares nothing
    out->push_back(std::move(w));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateModel(ModelSpec& m) {
  if (m.layers < 1)
    return InvalidArgument("model.layers = " + Str(m.layers) +
                           "; a model needs at least one layer, set model.layers >= 1");
  for (const auto& [field, value] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"hidden", m.hidden}, {"heads", m.heads}, {"vocab", m.vocab}, {"sequence", m.sequence}}) {
    if (value < 1) return InvalidArgument(std::string("model.") + field + " = " + Str(value) + "; it must be >= 1");
  }
  // The run spec's bounds (spec/run_spec.h), again here for callers that build a ModelSpec
  // themselves, and before anything multiplies them: within them every parameter count and
  // per-layer product fits an int64 (kv_heads and ffn as given: 0 fills in within bounds).
  for (const auto& [field, value, bound] : std::initializer_list<std::tuple<const char*, int64_t, int64_t>>{
           {"layers", m.layers, spec_bounds::kLayers},
           {"hidden", m.hidden, spec_bounds::kHidden},
           {"heads", m.heads, spec_bounds::kHeads},
           {"kv_heads", m.kv_heads, spec_bounds::kHeads},
           {"ffn", m.ffn, spec_bounds::kFfn},
           {"vocab", m.vocab, spec_bounds::kVocab},
           {"sequence", m.sequence, spec_bounds::kSequence}}) {
    if (value > bound) {
      return InvalidArgument(std::string("model.") + field + " = " + Str(value) + " is over the bound of " +
                             Str(bound) +
                             "; the planner's estimates are defined up to the run spec's bounds, use a smaller one");
    }
  }
  if (m.kv_heads < 0) return InvalidArgument("model.kv_heads = " + Str(m.kv_heads) + "; it must be >= 0 (0 = heads)");
  if (m.ffn < 0) return InvalidArgument("model.ffn = " + Str(m.ffn) + "; it must be >= 0 (0 = 4 * hidden)");
  if (m.head_dim < 0 || m.head_dim > spec_bounds::kHidden)
    return InvalidArgument("model.head_dim = " + Str(m.head_dim) + "; it must be in [0, " + Str(spec_bounds::kHidden) +
                           "] (0 = hidden / heads)");
  return ValidateModelSpec(m, "");
}

namespace {

Status ValidateJob(const ModelSpec& model, JobSpec& job, int64_t workers) {
  if (job.global_batch < 1)
    return InvalidArgument("train.global_batch = " + Str(job.global_batch) + "; it must be >= 1");
  if (job.global_batch > spec_bounds::kGlobalBatch) {
    return InvalidArgument("train.global_batch = " + Str(job.global_batch) + " is over the bound of " +
                           Str(spec_bounds::kGlobalBatch) + "; use a smaller global batch (more steps)");
  }
  if (job.sequence > spec_bounds::kSequence) {
    return InvalidArgument("job sequence = " + Str(job.sequence) + " is over the bound of " +
                           Str(spec_bounds::kSequence));
  }
  if (job.sequence == 0) job.sequence = model.sequence;
  if (job.sequence < 1)
    return InvalidArgument("job sequence = " + Str(job.sequence) + "; it must be >= 1 (0 = model.sequence)");
  if (model.family == Family::kGpt2 && job.sequence > model.sequence) {
    return InvalidArgument("job sequence = " + Str(job.sequence) + " exceeds model.sequence = " + Str(model.sequence) +
                           " (GPT-2's learned positions); shorten it or raise model.sequence");
  }
  for (const auto& [field, value] : std::initializer_list<std::pair<const char*, std::optional<int64_t>>>{
           {"dp", job.dp}, {"pp", job.pp}, {"tp", job.tp}, {"micro_batch", job.micro_batch}}) {
    if (value && *value < 1)
      return InvalidArgument(std::string("parallel.") + field + " = " + Str(*value) + "; it must be >= 1, or \"auto\"");
  }
  if (job.zero && (*job.zero < 0 || *job.zero > 3))
    return InvalidArgument("parallel.zero = " + Str(*job.zero) + "; ZeRO stages are 0, 1, 2 and 3 (or \"auto\")");
  if (job.tp && (model.heads % *job.tp != 0 || model.kv_heads % *job.tp != 0)) {
    return InvalidArgument("parallel.tp = " + Str(*job.tp) + " does not divide model.heads = " + Str(model.heads) +
                           " and model.kv_heads = " + Str(model.kv_heads) +
                           "; choose a tp that divides both, or \"auto\"");
  }
  if (job.pp && *job.pp > model.layers) {
    return InvalidArgument("parallel.pp = " + Str(*job.pp) + " exceeds model.layers = " + Str(model.layers) +
                           "; every pipeline stage needs a layer, use pp <= layers");
  }
  if (!job.stages.empty()) {
    int64_t sum = 0;
    for (int64_t n : job.stages) {
      if (n < 1)
        return InvalidArgument("parallel.stages gives a stage " + Str(n) + " layers; every stage needs at least one");
      sum += n;
    }
    if (sum != model.layers) {
      return InvalidArgument("parallel.stages covers " + Str(sum) + " layers but model.layers = " + Str(model.layers) +
                             "; the counts must add up to the model's layers");
    }
  }
  if (job.dp && job.global_batch % *job.dp != 0) {
    return InvalidArgument("parallel.dp = " + Str(*job.dp) + " does not divide train.global_batch = " +
                           Str(job.global_batch) + "; change one so each rank gets whole sequences");
  }
  if (job.micro_batch && job.global_batch % *job.micro_batch != 0) {
    return InvalidArgument("parallel.micro_batch = " + Str(*job.micro_batch) +
                           " does not divide train.global_batch = " + Str(job.global_batch));
  }
  int64_t fixed = 1;  // overflow-checked: each factor may be up to 2^63 from a caller other than the run spec
  for (const std::optional<int64_t>& factor : {job.dp, job.pp, job.tp}) {
    if (factor && __builtin_mul_overflow(fixed, *factor, &fixed)) fixed = std::numeric_limits<int64_t>::max();
  }
  if (fixed > workers) {  // a fixed mesh smaller than the cluster takes the workers with the most free memory
    return InvalidArgument("parallel.dp * parallel.pp * parallel.tp = " + Str(fixed) + " but the cluster has " +
                           Str(workers) + " workers; make the product at most " + Str(workers) +
                           " or set one of them to \"auto\"");
  }
  return Status::Ok();
}

}  // namespace

Result<Problem> Validate(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                         const PlannerOptions& options) {
  Problem p{model, job, StateLayout::kFp32, {}, options};
  STRATA_RETURN_IF_ERROR(ValidateWorkers(cluster, &p.workers));
  STRATA_RETURN_IF_ERROR(ValidateModel(p.model));
  STRATA_RETURN_IF_ERROR(ValidateJob(p.model, p.job, static_cast<int64_t>(p.workers.size())));
  STRATA_RETURN_IF_ERROR(ValidateLora(p.model, p.job));
  p.lora = CountLora(p.model, p.job.lora);
  if (!(options.safety_margin >= 0 && options.safety_margin < 1))
    return InvalidArgument("planner safety_margin must be in [0, 1)");
  if (!(options.compute_efficiency > 0 && options.compute_efficiency <= 1))
    return InvalidArgument("planner compute_efficiency must be in (0, 1]");
  p.layout = p.job.precision == Precision::kBf16 ? StateLayout::kBf16Autocast : StateLayout::kFp32;
  if (std::none_of(p.workers.begin(), p.workers.end(), [](const WorkerView& w) { return w.gpu; })) {
    p.options.workspace_bytes = options.cpu_workspace_bytes;
    p.cuda = false;
    // A CPU worker's device memory is its host's: offloading there frees nothing, so "auto"
    // offloads nothing (a fixed offload still runs as asked).
    if (!p.job.offload) p.job.offload = Offload::kNone;
  }
  p.host_checked =
      std::any_of(p.workers.begin(), p.workers.end(), [](const WorkerView& w) { return w.host_free_bytes > 0; });
  return p;
}

}  // namespace strata::shard::internal
