#include "shard/capacity.h"

#include <algorithm>
#include <map>
#include <memory>

#include "shard/internal.h"

namespace strata::shard {

namespace internal {
LoraSpec OfferedLora(Family family) {
  LoraSpec lora;
  lora.enabled = true;
  lora.rank = 16;
  lora.alpha = 32;
  lora.target_modules = LoraTargetModules(family);
  return lora;
}
}  // namespace internal

std::vector<CapacityOption> CapacityOptions(Family family, const LoraSpec& lora) {
  std::vector<CapacityOption> options = {
      {"adamw", Optimizer::kAdamW, Offload::kNone},
      {"adamw8bit", Optimizer::kAdamW8bit, Offload::kNone},
      {"adamw, offload = \"optimizer\"", Optimizer::kAdamW, Offload::kOptimizer},
      {"adamw, offload = \"optimizer+params\"", Optimizer::kAdamW, Offload::kOptimizerAndParams}};
  LoraSpec adapters = lora.enabled ? lora : internal::OfferedLora(family);
  const std::string rank = "r=" + std::to_string(adapters.rank);
  adapters.base = LoraBase::kDense;
  options.push_back({"LoRA " + rank + ", bf16 base", Optimizer::kAdamW, Offload::kNone, adapters});
  adapters.base = LoraBase::kNf4;
  options.push_back({"QLoRA " + rank + ", nf4 base", Optimizer::kAdamW, Offload::kNone, adapters});
  return options;
}

std::vector<Capacity> LargestTrainable(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster) {
  std::vector<Capacity> out;
  // The stage splits of each layer count, shared by the options (they search the same models).
  std::map<int64_t, std::shared_ptr<internal::StageSplits>> splits;
  for (const CapacityOption& option : CapacityOptions(model.family, job.lora)) {
    JobSpec j = job;
    j.optimizer = option.optimizer;
    j.offload = option.offload;
    j.lora = option.lora;
    j.stages.clear();  // a stage split of the spec's layer count does not fit another count
    if (j.pp && *j.pp > 1) j.pp.reset();
    std::map<int64_t, Result<Plan>> tried;  // the bisection asks some counts twice
    auto fits = [&](int64_t layers) -> const Result<Plan>& {
      auto it = tried.find(layers);
      if (it != tried.end()) return it->second;
      ModelSpec m = model;
      m.layers = layers;
      auto& shared = splits[layers];
      if (!shared) shared = std::make_shared<internal::StageSplits>();
      return tried.emplace(layers, internal::PlanWithoutWorkers(m, j, cluster, shared)).first->second;
    };
    Capacity c{option, 0, 0, "", false, 0, ""};
    // The spec's own model: a full search (with workers, so with a peak) of its layer count.
    if (auto own = internal::PlanWithoutOptions(model, j, cluster); own.ok()) {
      c.model_fits = true;
      for (const WorkerAssignment& w : own->workers) c.model_peak = std::max(c.model_peak, w.memory.total());
      c.model_plan = internal::Describe(*own);
    } else {
      c.model_plan = own.status().message();
    }
    const Result<Plan>& first = fits(1);
    if (!first.ok()) {
      c.plan = first.status().message();
      out.push_back(c);
      continue;
    }
    // Doubling from the spec's own count to the first that does not fit, then bisection between
    // it and the last that did (the small counts a large cluster fits at once are not asked).
    int64_t good = 1, bad = 2;
    if (const int64_t start = std::min(model.layers, spec_bounds::kLayers); start > 1) {
      if (fits(start).ok())
        good = start, bad = 2 * start;
      else
        bad = start;
    }
    while (bad <= spec_bounds::kLayers && fits(bad).ok()) good = bad, bad *= 2;
    if (bad > spec_bounds::kLayers) {
      bad = spec_bounds::kLayers + 1;
      if (fits(spec_bounds::kLayers).ok()) good = spec_bounds::kLayers;
    }
    while (bad - good > 1) {
      const int64_t mid = good + (bad - good) / 2;
      (fits(mid).ok() ? good : bad) = mid;
    }
    ModelSpec m = model;
    m.layers = good;
    c.layers = good;
    c.parameters = ParameterCount(m);
    c.plan = fits(good)->why;
    out.push_back(c);
  }
  return out;
}

}  // namespace strata::shard
