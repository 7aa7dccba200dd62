// The mesh a run's spec holds now (after any re-planning), as `strata status` and the dashboard
// show it: one derivation for both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/run_spec.h"

namespace strata::shard {

struct PlanSummary {
  int64_t dp = 1, pp = 1, tp = 1, zero = 0;
  int64_t micro_batch = 0;            // rows per forward/backward
  int64_t gradient_accumulation = 1;  // micro-batches per step on each rank
  bool recompute = false;
  int64_t keep_gathered = 0;         // ZeRO-3: layers a stage keeps gathered for the backward
  Offload offload = Offload::kNone;  // where AdamW's state (and with "+params" the parameters) lives
  bool planned = false;              // every [parallel] field decided (not "auto")
  std::vector<int64_t> stages;       // layers per pipeline stage; empty until planned
};

PlanSummary SummarizePlan(const RunSpec& spec);

}  // namespace strata::shard
