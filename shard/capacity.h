// The largest model each way of holding the optimizer state trains on a cluster: what `strata
// plan` shows beside a plan, so a user sees what 8-bit moments or offload would buy before
// changing a run.
#pragma once

#include <string>
#include <vector>

#include "shard/planner.h"
#include "spec/run_spec.h"

namespace strata::shard {

struct CapacityOption {
  std::string name;                         // "adamw", "adamw8bit", "adamw, offload = \"optimizer\"", ...
  Optimizer optimizer = Optimizer::kAdamW;  // train.optimizer
  Offload offload = Offload::kNone;         // parallel.offload
};
// AdamW; 8-bit AdamW; AdamW with its state offloaded to host memory; and with the parameters too.
std::vector<CapacityOption> CapacityOptions();

struct Capacity {
  CapacityOption option;
  // The most layers of the model's width (hidden, heads, ffn, vocab and sequence kept) that have
  // a plan that fits; 0 when not even one layer fits.
  int64_t layers = 0;
  int64_t parameters = 0;  // ParameterCount of that model
  std::string plan;        // the plan for it, described; or why none fits at one layer
};

// For each option: the largest layer count (up to spec_bounds::kLayers) with a plan on
// `cluster` for `job` (its fixed [parallel] fields kept, the rest searched), found by doubling
// and bisection - a plan's memory grows with layers.
std::vector<Capacity> LargestTrainable(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster);

}  // namespace strata::shard
