#include "shard/capacity.h"

#include "shard/internal.h"

namespace strata::shard {

std::vector<CapacityOption> CapacityOptions() {
  return {{"adamw", "adamw", Offload::kNone},
          {"adamw8bit", "adamw8bit", Offload::kNone},
          {"adamw, offload = \"optimizer\"", "adamw", Offload::kOptimizer},
          {"adamw, offload = \"optimizer+params\"", "adamw", Offload::kOptimizerAndParams}};
}

std::vector<Capacity> LargestTrainable(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster) {
  std::vector<Capacity> out;
  for (const CapacityOption& option : CapacityOptions()) {
    JobSpec j = job;
    j.optimizer = option.optimizer;
    j.offload = option.offload;
    j.stages.clear();  // a stage split of the spec's layer count does not fit another count
    if (j.pp && *j.pp > 1) j.pp.reset();
    auto fits = [&](int64_t layers) -> Result<Plan> {
      ModelSpec m = model;
      m.layers = layers;
      return ChoosePlan(m, j, cluster);
    };
    Capacity c{option, 0, 0, ""};
    auto first = fits(1);
    if (!first.ok()) {
      c.plan = first.status().message();
      out.push_back(c);
      continue;
    }
    // Doubling to the first count that does not fit, then bisection between it and the last that did.
    int64_t good = 1, bad = 2;
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
    const Result<Plan> plan = fits(good);
    c.plan = internal::Describe(plan.value());
    out.push_back(c);
  }
  return out;
}

}  // namespace strata::shard
