// Re-plans after an out-of-memory or a lost worker (shard/parallel_change.h): what changes, in
// what order, and what is refused (planner_test_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <regex>

#include "shard/parallel_change.h"
#include "shard/planner_test_util.h"

namespace strata::shard {
namespace {

// Where the planner finds no re-plan after an out-of-memory, the layers kept gathered are dropped
// first - at micro-batch 1 too, where there is no micro-batch left to halve.
TEST(ChangeForOutOfMemory, DropsTheLayersKeptGatheredFirstEvenAtMicroBatchOne) {
  RunSpec spec;
  spec.model = Gpt2Small();
  spec.train.global_batch = 2, spec.train.precision = Precision::kBf16;
  spec.parallel.dp = 2, spec.parallel.zero = 3, spec.parallel.micro_batch = 1, spec.parallel.recompute = false;
  spec.parallel.keep_gathered = 12;
  const ClusterView unbounded = Workers(2, int64_t{1} << 50, int64_t{1} << 50),
                    after = Workers(2, kGiB / 4, 141 * kGiB);
  auto change = ChangeForOutOfMemory(spec, unbounded, after, "w0", 1, 2);
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(change->parallel.keep_gathered, 0);
  EXPECT_EQ(change->parallel.micro_batch, 1);
  EXPECT_NE(change->description.find("keep_gathered 12 -> 0"), std::string::npos) << change->description;
}

// An out-of-memory re-plan gives up the layers kept gathered (with whatever else it changes):
// their room was what the estimate left, and the estimate was just proved low.
TEST(Replan, OutOfMemoryDropsTheLayersKeptGathered) {
  const JobSpec job = Zero3Job();
  const ClusterView cluster = Workers(2, 140 * kGiB, 141 * kGiB);
  auto current = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  ASSERT_EQ(current->keep_gathered, 12);
  auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::OutOfMemory("w0", 4));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(change->plan.keep_gathered, 0);
  EXPECT_NE(change->description.find("keep_gathered 12 -> 0"), std::string::npos) << change->description;
}

// After a lost worker the new mesh's room decides how many layers stay gathered ("auto"), but a
// spec that keeps none still keeps none. The workers are tight enough for ZeRO-3 without
// recompute to be the re-plan's mesh, where "auto" would keep layers.
TEST(Replan, ALostWorkerKeepsASpecsZeroKeptLayers) {
  for (std::optional<int64_t> keep : {std::optional<int64_t>(0), std::optional<int64_t>()}) {
    JobSpec job = Zero3Job();
    job.keep_gathered = keep;
    job.dp = 4, job.micro_batch = 2;
    ClusterView cluster = Workers(4, 140 * kGiB, 141 * kGiB);
    auto current = ChoosePlan(Gpt2Small(), job, cluster);
    ASSERT_TRUE(current.ok()) << current.status().ToString();
    cluster.workers.pop_back();  // w3
    auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::WorkerLost("w3"));
    ASSERT_TRUE(change.ok()) << change.status().ToString();
    ASSERT_EQ(change->plan.zero, 3);
    ASSERT_EQ(change->plan.recompute, std::vector<bool>({false}));
    if (keep) {
      EXPECT_EQ(change->plan.keep_gathered, 0) << "the spec keeps none";
    } else {
      EXPECT_GT(change->plan.keep_gathered, 0) << "auto: the new mesh's room decides";
    }
  }
}

TEST(Replan, OutOfMemoryHalvesTheMicroBatch) {
  JobSpec job;
  job.global_batch = 64, job.micro_batch = 8;
  const ClusterView cluster = Workers(1, 80 * kGiB);
  auto current = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  ASSERT_EQ(current->gradient_accumulation, 8);
  auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::OutOfMemory("w0", 8));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(change->plan.micro_batch, 4);
  EXPECT_EQ(change->plan.gradient_accumulation, 16);
  EXPECT_EQ(change->plan.dp, current->dp);
  EXPECT_EQ(change->plan.recompute, current->recompute);
  EXPECT_EQ(change->bytes_to_move, 0);
  EXPECT_NE(change->description.find("micro_batch 8 -> 4"), std::string::npos) << change->description;
}

TEST(Replan, OutOfMemoryAtMicroBatchOneTurnsOnRecompute) {
  JobSpec job;
  job.global_batch = 8, job.micro_batch = 1, job.recompute = false;
  const ClusterView cluster = Workers(1, 80 * kGiB);
  auto current = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::OutOfMemory("w0", 1));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(change->plan.micro_batch, 1);
  EXPECT_EQ(change->plan.recompute, std::vector<bool>({true}));
  EXPECT_EQ(change->plan.zero, current->zero);
}

TEST(Replan, WorkerLostFromFourToThree) {
  JobSpec job;
  job.global_batch = 12;
  ClusterView cluster = Workers(4, 80 * kGiB);
  auto current = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  ASSERT_EQ(current->workers.size(), 4u);
  cluster.workers.pop_back();  // w3
  auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::WorkerLost("w3"));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  const Plan& plan = change->plan;
  EXPECT_EQ(plan.workers.size(), 3u);
  EXPECT_EQ(plan.dp * plan.pp * plan.tp, 3);
  EXPECT_EQ(plan.dp * plan.micro_batch * plan.gradient_accumulation, 12);
  for (const auto& w : plan.workers) EXPECT_NE(w.worker, "w3");
  ExpectFits(plan, cluster, 0.1);
  EXPECT_FALSE(change->description.empty());
}

TEST(Replan, CountsTheStateThatMoves) {
  JobSpec job;
  job.global_batch = 8, job.pp = 2, job.tp = 1;
  ClusterView cluster = Workers(2, 80 * kGiB);
  auto current = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  ASSERT_EQ(current->workers[1].worker, "w1");
  cluster.workers.pop_back();
  auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::WorkerLost("w1"));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  ASSERT_EQ(change->plan.pp, 1);
  // w0 already holds the embedding and stage 0's layers; it must receive stage 1's layers and
  // ln_f (2*768), weights (4 bytes) and AdamW moments (8 bytes) each.
  const int64_t stage1_layers = current->stages[1].size();
  EXPECT_EQ(change->bytes_to_move, (stage1_layers * kGpt2SmallLayer + 2 * 768) * 12);
}

TEST(Replan, RejectsAWorkerOutsideThePlan) {
  JobSpec job;
  const ClusterView cluster = Workers(1, 80 * kGiB);
  auto current = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(current.ok());
  auto change = Replan(*current, Gpt2Small(), job, cluster, ReplanReason::OutOfMemory("w9", 1));
  ASSERT_FALSE(change.ok());
  EXPECT_EQ(change.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::shard
