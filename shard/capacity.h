// The largest model each way of holding the training state trains on a cluster, and whether the
// spec's own model fits that way: what `strata plan` shows beside a plan, so a user sees what
// 8-bit moments, offload, LoRA or QLoRA would buy before changing a run.
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
  LoraSpec lora{};                          // [lora]; lora.enabled false: every weight trains
};
// Full training: AdamW; 8-bit AdamW; AdamW with its state offloaded to host memory; and with the
// parameters too. Fine-tuning: LoRA over a bf16 base and QLoRA over an NF4 one, with `lora`'s
// rank and targets when it is enabled (the spec's [lora]), else r = 16 on every linear of the
// family (PEFT's common QLoRA setting).
std::vector<CapacityOption> CapacityOptions(Family family, const LoraSpec& lora = {});

struct Capacity {
  CapacityOption option;
  // The most layers of the model's width (hidden, heads, ffn, vocab and sequence kept) that have
  // a plan that fits; 0 when not even one layer fits.
  int64_t layers = 0;
  int64_t parameters = 0;  // ParameterCount of that model
  std::string plan;        // the plan for it, described; or why none fits at one layer
  // The spec's own model (its layer count) this way: its plan's peak per worker and its
  // description, or why it does not fit (fits false).
  bool model_fits = false;
  int64_t model_peak = 0;  // bytes on the fullest worker
  std::string model_plan;
};

// For each option of CapacityOptions(model.family, job.lora): the largest layer count (up to spec_bounds::kLayers) with
// a plan on `cluster` for `job` (its fixed [parallel] fields kept, the rest searched), found by doubling and bisection
// - a plan's memory grows with layers.
std::vector<Capacity> LargestTrainable(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster);

}  // namespace strata::shard
