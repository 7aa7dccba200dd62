// The plans' one-line descriptions (shard/internal.h): byte counts, and the mesh as `strata plan`,
// the planned event and a refusal name it.
#include <algorithm>
#include <cstdio>
#include <string>

#include "shard/internal.h"

namespace strata::shard::internal {

std::string FormatBytes(double bytes) {
  char text[32];
  if (bytes >= double(1 << 30)) {
    std::snprintf(text, sizeof text, "%.1f GiB", bytes / double(1 << 30));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / double(1 << 20));
  }
  return text;
}

std::string Describe(const Plan& plan) {
  const auto recomputed = std::count(plan.recompute.begin(), plan.recompute.end(), true);
  char text[200];
  std::snprintf(
      text, sizeof text,
      "dp=%lld pp=%lld tp=%lld, ZeRO-%lld, micro_batch %lld x %lld accumulation, recompute on %lld of %lld stages, %s",
      static_cast<long long>(plan.dp), static_cast<long long>(plan.pp), static_cast<long long>(plan.tp),
      static_cast<long long>(plan.zero), static_cast<long long>(plan.micro_batch),
      static_cast<long long>(plan.gradient_accumulation), static_cast<long long>(recomputed),
      static_cast<long long>(plan.pp),
      plan.offload == Offload::kNone        ? "no offload"
      : plan.offload == Offload::kOptimizer ? "optimizer offloaded"
                                            : "optimizer and parameters offloaded");
  std::string described = text;
  if (plan.keep_gathered > 0) {
    const bool all = std::all_of(plan.stages.begin(), plan.stages.end(),
                                 [&](const LayerRange& r) { return r.size() <= plan.keep_gathered; });
    described += all ? ", every layer kept gathered for its backward"
                     : ", the last " + std::to_string(plan.keep_gathered) +
                           " layers of each stage kept gathered for their backward";
  }
  return described;
}

}  // namespace strata::shard::internal
