// The planner tests' shared model, clusters and checks (shard/planner_test.cc, replan_test.cc,
// estimator_test.cc). Expected numbers in those tests are worked out by hand from the formulas,
// not copied from the implementation's output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "shard/planner.h"

namespace strata::shard {

inline constexpr int64_t kGiB = int64_t{1} << 30;

inline ModelSpec Gpt2Small() {
  ModelSpec m;
  m.family = Family::kGpt2;
  m.layers = 12, m.hidden = 768, m.heads = 12, m.vocab = 50257, m.sequence = 1024;
  return m;
}

inline constexpr int64_t kGpt2SmallParams = 124'439'808;
// One GPT-2 small block: LayerNorms 2*(2*768) + qkv 3*768*768 + 3*768 + proj 768*768 + 768
// + fc 768*3072 + 3072 + mlp_proj 3072*768 + 768.
inline constexpr int64_t kGpt2SmallLayer = 3072 + 1'771'776 + 590'592 + 2'362'368 + 2'360'064;

inline ClusterView Workers(int n, int64_t free_bytes, int64_t total_bytes = 80 * kGiB) {
  ClusterView c;
  for (int i = 0; i < n; ++i)
    c.workers.push_back({"w" + std::to_string(i), total_bytes, free_bytes, "n0", "nvlink", 989e12, 0});
  return c;
}

inline void ExpectFits(const Plan& plan, const ClusterView& cluster, double margin) {
  ASSERT_FALSE(plan.workers.empty());
  EXPECT_EQ(static_cast<int64_t>(plan.workers.size()), plan.dp * plan.pp * plan.tp);
  for (const auto& w : plan.workers) {
    const auto it = std::find_if(cluster.workers.begin(), cluster.workers.end(),
                                 [&](const WorkerView& v) { return v.name == w.worker; });
    ASSERT_NE(it, cluster.workers.end()) << w.worker;
    EXPECT_LE(w.memory.total(), static_cast<double>(it->free_bytes) * (1 - margin)) << w.worker;
  }
}

// GPT-2 small on dp = 2 under ZeRO-3 without recompute, bf16: keep_gathered left to the planner.
inline JobSpec Zero3Job() {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 2, job.zero = 3, job.micro_batch = 4,
  job.recompute = false;
  job.offload = Offload::kNone;
  return job;
}

}  // namespace strata::shard
