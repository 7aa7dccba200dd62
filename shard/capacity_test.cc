#include "shard/capacity.h"

#include <gtest/gtest.h>

namespace strata::shard {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A Llama-style model 4096 wide (Llama 2 7B's width); its layer count is what the search varies.
ModelSpec Llama4096() {
  ModelSpec m;
  m.family = "llama", m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 32, m.ffn = 11008, m.vocab = 32000;
  m.sequence = 1024, m.norm_eps = 1e-5;
  return m;
}

ClusterView OneGpu(int64_t bytes) {
  ClusterView c;
  c.workers.push_back({"gpu0", bytes, bytes, "n0", "nvlink", 989e12, 0});
  return c;
}

TEST(LargestTrainable, EachOptionsLayerCountFitsAndOneMoreDoesNot) {
  JobSpec job;
  job.global_batch = 8, job.precision = "bf16", job.dp = 1, job.pp = 1, job.tp = 1;
  const ClusterView cluster = OneGpu(80 * kGiB);
  const auto capacities = LargestTrainable(Llama4096(), job, cluster);
  ASSERT_EQ(capacities.size(), 3u);
  for (const Capacity& c : capacities) {
    SCOPED_TRACE(c.option.name);
    ASSERT_GT(c.layers, 0) << c.plan;
    JobSpec j = job;
    j.optimizer = c.option.optimizer, j.offload = c.option.offload;
    ModelSpec m = Llama4096();
    m.layers = c.layers;
    EXPECT_TRUE(ChoosePlan(m, j, cluster).ok());
    EXPECT_EQ(c.parameters, ParameterCount(m));
    m.layers = c.layers + 1;
    EXPECT_FALSE(ChoosePlan(m, j, cluster).ok()) << "one more layer should not fit";
    EXPECT_FALSE(c.plan.empty());
  }
  // 8-bit moments take 2.03 bytes a parameter of AdamW's 8, offload none of them: each trains
  // more layers than the one before.
  EXPECT_LT(capacities[0].layers, capacities[1].layers);
  EXPECT_LT(capacities[1].layers, capacities[2].layers);
}

TEST(LargestTrainable, NothingFitsSaysWhy) {
  JobSpec job;
  job.global_batch = 8, job.precision = "bf16", job.dp = 1;
  const auto capacities = LargestTrainable(Llama4096(), job, OneGpu(kGiB));
  for (const Capacity& c : capacities) {
    EXPECT_EQ(c.layers, 0) << c.option.name;
    EXPECT_FALSE(c.plan.empty()) << c.option.name;
  }
}

}  // namespace
}  // namespace strata::shard
