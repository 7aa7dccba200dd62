// Expected numbers below are worked out by hand from the formulas (see the comments), not
// copied from the implementation's output. Re-plans are in replan_test.cc, the estimator
// against measured peaks and step times in estimator_test.cc.
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

TEST(ParameterCount, Gpt2SmallMatchesHuggingFace) {
  EXPECT_EQ(kGpt2SmallLayer, 7'087'872);
  EXPECT_EQ(ParameterCount(Gpt2Small()), kGpt2SmallParams);
  // wte 50257*768 + wpe 1024*768 + 12 blocks + ln_f 2*768, the head tied to wte.
  EXPECT_EQ(ParameterCount(Gpt2Small()), 50257 * 768 + 1024 * 768 + 12 * kGpt2SmallLayer + 2 * 768);
}

TEST(ParameterCount, LlamaWithGroupedQueryAttention) {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 2, m.ffn = 176, m.vocab = 256;
  // head_dim 16. Per layer: RMSNorms 2*64 = 128, q 64*64 = 4096, k and v 2 * 64*(2*16) = 4096,
  // o 64*64 = 4096, gate/up/down 3*64*176 = 33792 -> 46208. Embedding 256*64 = 16384, final
  // norm 64, untied lm_head 16384.
  EXPECT_EQ(ParameterCount(m), 16384 + 2 * 46208 + 64 + 16384);
  EXPECT_EQ(ParameterCount(m), 125'248);
}

WorkerAssignment Rank(int64_t stage, int64_t dp_rank, int64_t tp_rank) {
  WorkerAssignment w;
  w.stage = stage, w.dp_rank = dp_rank, w.tp_rank = tp_rank;
  return w;
}

TEST(CheckpointShardBytes, EachRankWritesItsShareOfTheWeightsAndBothMoments) {
  // GPT-2 124M on one worker: 124,439,808 parameters x (weights, m, v) x 4 bytes.
  Plan one;
  one.stages = {{0, 12}};
  EXPECT_EQ(CheckpointShardBytes(Gpt2Small(), one, Rank(0, 0, 0)), int64_t{124'439'808} * 12);
  // pp = 2 x dp = 2: stage 0 holds wte (50257 x 768 = 38,597,376), wpe (786,432) and 6 blocks
  // (42,527,232): 81,911,040 / 2 a rank. Stage 1: 6 blocks and ln_f (1,536), 42,528,768 / 2; the
  // tied head's copy on the last stage is not written.
  Plan piped;
  piped.dp = 2, piped.pp = 2;
  piped.stages = {{0, 6}, {6, 12}};
  EXPECT_EQ(CheckpointShardBytes(Gpt2Small(), piped, Rank(0, 1, 0)), int64_t{40'955'520} * 12);
  EXPECT_EQ(CheckpointShardBytes(Gpt2Small(), piped, Rank(1, 1, 0)), int64_t{21'264'384} * 12);
}

TEST(CheckpointShardBytes, TensorParallelRanksSplitWhatIsSplitAndWriteReplicatedTensorsOnce) {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 2, m.ffn = 176, m.vocab = 256;  // 125,248 parameters
  Plan plan;
  plan.tp = 2;
  plan.stages = {{0, 2}};
  const int64_t b0 = CheckpointShardBytes(m, plan, Rank(0, 0, 0)), b1 = CheckpointShardBytes(m, plan, Rank(0, 0, 1));
  EXPECT_EQ(b0 + b1, int64_t{125'248} * 12);
  // The RMSNorms (2 x 64 a layer, 64 final) are replicated: rank 0 writes them.
  EXPECT_EQ(b0 - b1, int64_t{2 * 128 + 64} * 12);
}

TEST(ModelStateBytes, ZeroPaperStagesAtDp4) {
  const int64_t p = 1'000'000'000;
  // Stage 0: 2 (fp16 weights) + 2 (fp16 grads) + 12 (fp32 master, m, v) = 16 GB.
  auto s0 = ModelStateBytes(p, StateLayout::kZeroPaperMixed, 0, 4);
  EXPECT_EQ(s0.weights, 2'000'000'000);
  EXPECT_EQ(s0.gradients, 2'000'000'000);
  EXPECT_EQ(s0.optimizer_state, 12'000'000'000);
  EXPECT_EQ(s0.total(), 16'000'000'000);
  // Stage 1: 2 + 2 + 12/4 = 7 GB; stage 2: 2 + 2/4 + 12/4 = 5.5 GB; stage 3: (2 + 2 + 12)/4 = 4 GB.
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kZeroPaperMixed, 1, 4).total(), 7'000'000'000);
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kZeroPaperMixed, 2, 4).total(), 5'500'000'000);
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kZeroPaperMixed, 3, 4).total(), 4'000'000'000);
}

TEST(ModelStateBytes, EightBitMomentsTakeAQuarterOfTheirFp32Bytes) {
  const int64_t p = 1'000'000'000;
  // adamw8bit: m and v as 1 byte + 4 bytes per 256 each = 2.03125 bytes, against fp32 AdamW's 8.
  const MemoryEstimate eight =
      ModelStateBytes(p, StateLayout::kBf16Autocast, 0, 1, Offload::kNone, /*eight_bit_optimizer=*/true);
  const MemoryEstimate fp32 = ModelStateBytes(p, StateLayout::kBf16Autocast, 0, 1);
  EXPECT_EQ(eight.optimizer_state, 2'031'250'000);
  EXPECT_EQ(fp32.optimizer_state, 8'000'000'000);
  EXPECT_EQ(eight.weights, fp32.weights);
  EXPECT_EQ(eight.gradients, fp32.gradients);
  // Sharded like the fp32 moments under ZeRO-1.
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kBf16Autocast, 1, 4, Offload::kNone, true).optimizer_state, 507'812'500);
}

TEST(ModelStateBytes, OurTrainerLayouts) {
  const int64_t p = 1'000'000'000;
  // fp32: 4 weights + 4 grads + 8 (AdamW m and v) = 16; ZeRO-1 at dp 4: 4 + 4 + 2 = 10.
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kFp32, 0, 4).total(), 16'000'000'000);
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kFp32, 1, 4).total(), 10'000'000'000);
  // ZeRO-2 reduce-scatters into the whole gradient buffer: as ZeRO-1 in memory.
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kFp32, 2, 4).total(), 10'000'000'000);
  // bf16 keeps the same fp32 state (its bf16 working copies depend on the plan: Evaluate adds
  // them); ZeRO-3 at dp 4: 16 / 4 = 4.
  auto bf16 = ModelStateBytes(p, StateLayout::kBf16Autocast, 0, 1);
  EXPECT_EQ(bf16.weights, 4'000'000'000);
  EXPECT_EQ(bf16.total(), 16'000'000'000);
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kBf16Autocast, 3, 4).total(), 4'000'000'000);
  // Offload takes the moments off the GPU.
  EXPECT_EQ(ModelStateBytes(p, StateLayout::kFp32, 0, 1, Offload::kOptimizer).total(), 8'000'000'000);
}

// What a GPT-2 shaped layer saves: h = 1024, 16 heads of 64, s = 2048, b = 2, so
// sbh = 2048 * 2 * 1024 = 4,194,304. Per element of sbh: the fp32 residual stream at both norms
// (4 + 4) and, in bf16 (2 bytes), both norms' outputs (2), q, k, v and attention's output (4),
// the MLP's up projection and its GELU (2 * 4096 / 1024 = 8): 8 + 2 * 14 = 36. Unfused
// attention adds the softmax probabilities, heads * s / h = 32 elements.
class Activations : public ::testing::Test {
 protected:
  void SetUp() override { model_.hidden = 1024, model_.heads = 16, model_.sequence = 2048; }
  ModelSpec model_;
  const int64_t sbh_ = 4'194'304;
};

TEST_F(Activations, NoRecomputeNoTensorParallel) {
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 1, false, /*fused=*/false), sbh_ * (36 + 2 * 32));
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 1, false, /*fused=*/true), sbh_ * 36);
  // fp32: the 14 elements take 4 bytes each; the residual stream is fp32 either way.
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 1, /*fp32=*/true, true), sbh_ * (8 + 4 * 14));
}

TEST_F(Activations, TensorParallel) {
  // The norms' inputs and outputs are whole on every rank, the rest split: at t = 4,
  // 8 + 2 * (2 + 12 / 4) = 18; unfused, the probabilities split by heads too: 8 + 2 * (2 + 44 / 4) = 34.
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 4, false, false), sbh_ * 34);
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 4, false, true), sbh_ * 18);
}

TEST_F(Activations, FullRecomputeAndPipeline) {
  // 24 layers, recompute: each layer's fp32 input kept (4 sbh) + one layer's 36 sbh = 132 sbh.
  EXPECT_EQ(StageActivationBytes(model_, 2048, 2, 1, false, true, 24, 1, true), sbh_ * (24 * 4 + 36));
  // Unfused, recompute: the layer in flight carries the probabilities: 96 + 100.
  EXPECT_EQ(StageActivationBytes(model_, 2048, 2, 1, false, false, 24, 1, true), sbh_ * (96 + 100));
  // 1F1B first stage of pp = 4 holds 4 micro-batches of 6 layers each.
  EXPECT_EQ(StageActivationBytes(model_, 2048, 2, 1, false, true, 6, 4, false), sbh_ * 36 * 24);
}

TEST_F(Activations, SwiGluKeepsThreeWideTensors) {
  model_.family = Family::kLlama;
  model_.ffn = 2816;
  // Gate, up and their product: 3 * 2816 / 1024 = 8.25 elements, in place of GELU's 8:
  // 8 + 2 * (2 + 4 + 8.25) = 36.5 sbh.
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 1, false, true), sbh_ * 73 / 2);
  // Grouped-query attention: 4 kv heads of 64 make k and v 2 * 256 / 1024 = 0.5 element, not 2:
  // 8 + 2 * (2 + 2.5 + 8.25) = 33.5 sbh.
  model_.kv_heads = 4;
  EXPECT_EQ(LayerActivationBytes(model_, 2048, 2, 1, false, true), sbh_ * 67 / 2);
}

TEST(ChoosePlan, OneRoomyWorkerRunsUnsharded) {
  JobSpec job;
  job.global_batch = 8;
  const ClusterView cluster = Workers(1, 80 * kGiB);
  auto plan = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->dp, 1);
  EXPECT_EQ(plan->pp, 1);
  EXPECT_EQ(plan->tp, 1);
  EXPECT_EQ(plan->offload, Offload::kNone);
  ASSERT_EQ(plan->stages.size(), 1u);
  EXPECT_EQ(plan->stages[0].begin, 0);
  EXPECT_EQ(plan->stages[0].end, 12);
  EXPECT_EQ(plan->micro_batch * plan->gradient_accumulation, 8);
  // fp32: 4 bytes of weights, 4 of gradients and 8 of AdamW moments per parameter.
  EXPECT_EQ(plan->workers[0].memory.weights, 4 * kGpt2SmallParams);
  EXPECT_EQ(plan->workers[0].memory.gradients, 4 * kGpt2SmallParams);
  EXPECT_EQ(plan->workers[0].memory.optimizer_state, 8 * kGpt2SmallParams);
  EXPECT_GT(plan->step_time.compute_s, 0);
  EXPECT_EQ(plan->step_time.bubble_s, 0);
  EXPECT_NE(plan->why.find("dp=1 pp=1 tp=1"), std::string::npos) << plan->why;
  ExpectFits(*plan, cluster, 0.1);
}

// A cluster of 10,000 workers and a fixed 1 x 1 x 1 mesh (a one-worker job, or any spec whose
// dp, pp and tp are set): the search goes over sizes 10,000 down to 1, and only size 1 has a mesh.
// It used to copy and sort all 10,000 workers for every size (minutes; the coordinator's event
// loop stalled until every worker was declared lost); sizes without a mesh are now skipped.
// The plan is the one it always was: the worker with the most free memory.
TEST(ChoosePlan, FixedMeshOnTenThousandWorkersSkipsSizesWithoutAMesh) {
  JobSpec job;
  job.global_batch = 8;
  job.dp = 1;
  job.pp = 1;
  job.tp = 1;
  ClusterView cluster = Workers(10000, 40 * kGiB);
  cluster.workers[7321].free_bytes = 60 * kGiB;
  const auto start = std::chrono::steady_clock::now();
  auto plan = ChoosePlan(Gpt2Small(), job, cluster);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->workers.size(), 1u);
  EXPECT_EQ(plan->workers[0].worker, "w7321");
  EXPECT_LT(seconds, 5.0) << "a plan for one worker of 10,000 should take milliseconds";
}

// Two workers whose budget is 15.5 bytes per parameter, on one pipeline stage. Replicated fp32
// state (16) does not fit, nor do ZeRO-1 and -2 (4 + 4 + 8/2 = 12, plus the fused loss's
// head-sized buffers, about 4 more, and activations); ZeRO-3 (16/2 = 8, plus those buffers and
// the gathered head, about 5) does. Two pipeline stages would fit too (half the layers each), so
// the mesh keeps one.
class TwoTightWorkers : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.global_batch = 4, job_.sequence = 128, job_.pp = 1, job_.tp = 1, job_.offload = Offload::kNone;
    options_.workspace_bytes = 0;
    cluster_ = Workers(2, static_cast<int64_t>(15.5 * kGpt2SmallParams / 0.9));
  }
  JobSpec job_;
  PlannerOptions options_;
  ClusterView cluster_;
};

TEST_F(TwoTightWorkers, FindsAPlanThatFits) {
  auto plan = ChoosePlan(Gpt2Small(), job_, cluster_, options_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->zero, 3) << plan->why;
  EXPECT_EQ(plan->workers.size(), 2u);
  ExpectFits(*plan, cluster_, options_.safety_margin);
}

TEST_F(TwoTightWorkers, ReplicatedStateIsRejected) {
  job_.dp = 2, job_.zero = 0;
  auto plan = ChoosePlan(Gpt2Small(), job_, cluster_, options_);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
}

TEST(ChoosePlan, FixedFieldsAreRespected) {
  JobSpec job;
  job.global_batch = 16, job.pp = 2, job.micro_batch = 2, job.zero = 1, job.recompute = true;
  const ClusterView cluster = Workers(4, 80 * kGiB);
  auto plan = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->pp, 2);
  EXPECT_EQ(plan->micro_batch, 2);
  EXPECT_EQ(plan->zero, 1);
  EXPECT_EQ(plan->recompute, std::vector<bool>({true, true}));
  EXPECT_EQ(plan->dp * plan->pp * plan->tp, 4);
  EXPECT_EQ(plan->dp * plan->micro_batch * plan->gradient_accumulation, 16);
  // Pipeline bubble (pp-1)/m of the micro-batches' compute (less the step's fixed 1 ms, which
  // counts once), m = micro-batches per dp rank.
  EXPECT_NEAR(plan->step_time.bubble_s, (plan->step_time.compute_s - 1e-3) / plan->gradient_accumulation, 1e-12);
  ExpectFits(*plan, cluster, 0.1);
}

TEST(ChoosePlan, StagesPutEmbeddingFirstAndHeadLast) {
  JobSpec job;
  job.global_batch = 8, job.pp = 4, job.tp = 1;
  auto plan = ChoosePlan(Gpt2Small(), job, Workers(4, 80 * kGiB));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->stages.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_GE(plan->stages[k].size(), 1);
    EXPECT_EQ(plan->stages[k].begin, k == 0 ? 0 : plan->stages[k - 1].end);
  }
  EXPECT_EQ(plan->stages[3].end, 12);
  // The head's matmul (50257*768, about 5.4 layers of compute) makes the last stage the busiest
  // even with one layer; the embedding (about 5.6 layers of parameters) caps stage 0 at 2 layers.
  EXPECT_EQ(plan->stages[3].size(), 1);
  EXPECT_LE(plan->stages[0].size(), 2);

  // What a run with pp = 4 fixed and no [parallel] stages is given: the same boundaries.
  auto balanced = BalancedStages(Gpt2Small(), 4);
  ASSERT_TRUE(balanced.ok()) << balanced.status().ToString();
  ASSERT_EQ(balanced->size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ((*balanced)[k], plan->stages[k].size()) << "stage " << k;
  EXPECT_FALSE(BalancedStages(Gpt2Small(), 13).ok());

  // Stages the user fixed are what the plan (and its estimate) uses.
  job.stages = {3, 3, 3, 3};
  auto fixed = ChoosePlan(Gpt2Small(), job, Workers(4, 80 * kGiB));
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(fixed->stages[k].size(), 3) << "stage " << k;
  EXPECT_GT(fixed->workers.back().memory.total(), plan->workers.back().memory.total()) << "3 layers + head vs 1 + head";
  job.stages = {3, 3, 3, 4};
  auto wrong = ChoosePlan(Gpt2Small(), job, Workers(4, 80 * kGiB));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("parallel.stages covers 13 layers but model.layers = 12"), std::string::npos)
      << wrong.status().message();
}

// Two hosts of four GPUs, named so that name order alone would alternate between them (w0 on A,
// w1 on B, ...), as `strata up --hosts 2` and cluster specs with round-robin names do.
ClusterView TwoHostsOfFour() {
  ClusterView c;
  for (int i = 0; i < 8; ++i)
    c.workers.push_back(
        {"w" + std::to_string(i), 80 * kGiB, 80 * kGiB, i % 2 ? "hostB" : "hostA", "nvlink", 989e12, 0});
  return c;
}

std::string NodeOf(const ClusterView& cluster, const std::string& worker) {
  for (const auto& w : cluster.workers) {
    if (w.name == worker) return w.node;
  }
  return "?";
}

// Every tensor-parallel group (same stage and dp rank) inside one node: its all-reduces run on
// every layer, forward and backward, and would crawl over the inter-node network.
void ExpectTensorParallelInsideNodes(const Plan& plan, const ClusterView& cluster) {
  for (const auto& a : plan.workers) {
    for (const auto& b : plan.workers) {
      if (a.stage == b.stage && a.dp_rank == b.dp_rank) {
        EXPECT_EQ(NodeOf(cluster, a.worker), NodeOf(cluster, b.worker))
            << "tp group (stage " << a.stage << ", dp rank " << a.dp_rank << ") spans " << a.worker << " and "
            << b.worker;
      }
    }
  }
}

TEST(ChoosePlan, TensorParallelStaysInsideAHostAndDataOrPipelineParallelSpansHosts) {
  const ClusterView cluster = TwoHostsOfFour();
  JobSpec job;
  job.global_batch = 16, job.dp = 2, job.pp = 1, job.tp = 4;
  auto dp_plan = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(dp_plan.ok()) << dp_plan.status().ToString();
  ExpectTensorParallelInsideNodes(*dp_plan, cluster);
  // The two data-parallel replicas are the two hosts: each dp group (same tp rank) crosses them.
  for (const auto& a : dp_plan->workers) {
    for (const auto& b : dp_plan->workers) {
      if (a.tp_rank == b.tp_rank && a.dp_rank != b.dp_rank) {
        EXPECT_NE(NodeOf(cluster, a.worker), NodeOf(cluster, b.worker)) << a.worker << " " << b.worker;
      }
    }
  }

  job.dp = 1, job.pp = 2;
  auto pp_plan = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_TRUE(pp_plan.ok()) << pp_plan.status().ToString();
  ExpectTensorParallelInsideNodes(*pp_plan, cluster);
  // One pipeline stage per host: only stage boundaries' activations cross the network.
  std::string stage_node[2];
  for (const auto& w : pp_plan->workers) {
    if (stage_node[w.stage].empty()) stage_node[w.stage] = NodeOf(cluster, w.worker);
    EXPECT_EQ(NodeOf(cluster, w.worker), stage_node[w.stage]) << w.worker << " in stage " << w.stage;
  }
  EXPECT_NE(stage_node[0], stage_node[1]);

  // Mesh left to the planner, tp = 2 fixed: whatever it picks keeps each pair on one host; and
  // after losing a worker of host A the re-plan still does.
  JobSpec open;
  open.global_batch = 16, open.tp = 2;
  auto auto_plan = ChoosePlan(Gpt2Small(), open, cluster);
  ASSERT_TRUE(auto_plan.ok()) << auto_plan.status().ToString();
  ExpectTensorParallelInsideNodes(*auto_plan, cluster);
  ClusterView shrunk = cluster;
  shrunk.workers.erase(shrunk.workers.begin());  // w0, host A
  auto change = Replan(*dp_plan, Gpt2Small(), job, shrunk, ReplanReason::WorkerLost("w0"));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  ExpectTensorParallelInsideNodes(change->plan, shrunk);
}

// Why the planner avoids splitting a tensor-parallel group across hosts where it has a choice:
// such a group is priced at the inter-node bandwidth. Four workers, tp = 4 forced: two on each of
// two hosts communicate for longer than four on one host.
TEST(ChoosePlan, TensorParallelAcrossHostsCostsInterNodeBandwidth) {
  JobSpec job;
  job.global_batch = 8, job.dp = 1, job.pp = 1, job.tp = 4;
  ClusterView split = Workers(4, 80 * kGiB);
  for (size_t i = 0; i < split.workers.size(); ++i) split.workers[i].node = i < 2 ? "hostA" : "hostB";
  auto across = ChoosePlan(Gpt2Small(), job, split);
  auto inside = ChoosePlan(Gpt2Small(), job, Workers(4, 80 * kGiB));
  ASSERT_TRUE(across.ok()) << across.status().ToString();
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  EXPECT_GT(across->step_time.communication_s, inside->step_time.communication_s);
}

TEST(ChoosePlan, InfeasibleNamesTheMemoryNeeded) {
  JobSpec job;
  job.global_batch = 8;
  auto plan = ChoosePlan(Gpt2Small(), job, Workers(1, 512 << 20));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  std::smatch match;
  const std::string message = plan.status().message();
  ASSERT_TRUE(std::regex_search(message, match, std::regex(R"(needs ([0-9.]+) GiB free per GPU)"))) << message;
  const double gib = std::atof(match[1].str().c_str());
  // At least the fp32 weights and gradients that stay on the GPU with offload (8 bytes per
  // parameter) over the 10% margin; at most that plus the 1 GiB workspace, the step temporaries
  // and one sequence of activations and logits (under 1 GiB).
  EXPECT_GE(gib, 8.0 * kGpt2SmallParams / 0.9 / kGiB - 0.05);
  EXPECT_LE(gib, (8.0 * kGpt2SmallParams + 2.0 * kGiB) / 0.9 / kGiB);
  EXPECT_NE(message.find("\"w0\""), std::string::npos) << message;
}

// CPU workers have no CUDA context or cuBLAS workspace to reserve, and a refusal for them speaks
// of workers, not GPUs.
TEST(ChoosePlan, CpuWorkersGetTheCpuWorkspaceAndCpuWords) {
  JobSpec job;
  job.global_batch = 8;
  ClusterView cpus = Workers(2, int64_t{64} << 30);
  for (auto& w : cpus.workers) w.gpu = false;
  auto plan = ChoosePlan(Gpt2Small(), job, cpus);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const PlannerOptions defaults;
  for (const auto& w : plan->workers) EXPECT_EQ(w.memory.workspace, defaults.cpu_workspace_bytes) << w.worker;
  auto gpu_plan = ChoosePlan(Gpt2Small(), job, Workers(2, int64_t{64} << 30));
  ASSERT_TRUE(gpu_plan.ok());
  EXPECT_EQ(gpu_plan->workers[0].memory.workspace, defaults.workspace_bytes);

  for (auto& w : cpus.workers) w.free_bytes = 512 << 20;
  auto refused = ChoosePlan(Gpt2Small(), job, cpus);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("free per worker"), std::string::npos) << refused.status().message();
  EXPECT_EQ(refused.status().message().find("GPU"), std::string::npos) << refused.status().message();
}

TEST(ChoosePlan, BadInputsNameTheField) {
  struct Case {
    const char* expected;
    std::function<void(ModelSpec&, JobSpec&, ClusterView&)> mutate;
  };
  const std::vector<Case> cases = {
      {"no workers", [](ModelSpec&, JobSpec&, ClusterView& c) { c.workers.clear(); }},
      {"free_bytes", [](ModelSpec&, JobSpec&, ClusterView& c) { c.workers[1].free_bytes = 0; }},
      {"total_bytes", [](ModelSpec&, JobSpec&, ClusterView& c) { c.workers[0].total_bytes = -1; }},
      {"model.layers", [](ModelSpec& m, JobSpec&, ClusterView&) { m.layers = 0; }},
      {"parallel.dp * parallel.pp * parallel.tp",
       [](ModelSpec&, JobSpec& j, ClusterView&) { j.dp = 8, j.pp = 1, j.tp = 1; }},
      {"parallel.tp", [](ModelSpec&, JobSpec& j, ClusterView&) { j.tp = 5; }},
      {"model.kv_heads",
       [](ModelSpec& m, JobSpec& j, ClusterView&) { m.family = Family::kLlama, m.kv_heads = 2, j.tp = 4; }},
      {"parallel.pp", [](ModelSpec& m, JobSpec& j, ClusterView&) { m.layers = 1, j.pp = 2; }},
      {"parallel.zero", [](ModelSpec&, JobSpec& j, ClusterView&) { j.zero = 4; }},
  };
  for (const Case& c : cases) {
    ModelSpec model = Gpt2Small();
    JobSpec job;
    ClusterView cluster = Workers(4, 80 * kGiB);
    c.mutate(model, job, cluster);
    auto plan = ChoosePlan(model, job, cluster);
    ASSERT_FALSE(plan.ok()) << c.expected;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(plan.status().message().find(c.expected), std::string::npos) << plan.status().message();
  }
}

// fp32 master weights and gradients, and a bf16 working copy of every unit but the tied
// embedding (its one-stage head reads the fp32 master) and, with recompute, the blocks.
TEST(ChoosePlan, Bf16KeepsFp32MasterWeightsAndGradients) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16;
  for (bool recompute : {false, true}) {
    job.recompute = recompute;
    auto plan = ChoosePlan(Gpt2Small(), job, Workers(1, 80 * kGiB));
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const int64_t working = kGpt2SmallParams - 50257 * 768 - (recompute ? 12 * kGpt2SmallLayer : 0);
    EXPECT_EQ(plan->workers[0].memory.weights, 4 * kGpt2SmallParams + 2 * working) << recompute;
    EXPECT_EQ(plan->workers[0].memory.gradients, 4 * kGpt2SmallParams) << recompute;
  }
  // CPU workers keep no working copies: their bf16 run computes from the fp32 weights.
  ClusterView cpus = Workers(1, 80 * kGiB);
  cpus.workers[0].gpu = false;
  auto cpu_plan = ChoosePlan(Gpt2Small(), job, cpus);
  ASSERT_TRUE(cpu_plan.ok()) << cpu_plan.status().ToString();
  EXPECT_EQ(cpu_plan->workers[0].memory.weights, 4 * kGpt2SmallParams);
}

// A small Llama on a fixed tp = 2 mesh (fp32, one micro-batch of 8): the tensor-parallel layout tests.
ModelSpec SmallTpLlama() {
  ModelSpec llama;
  llama.family = Family::kLlama, llama.layers = 2, llama.hidden = 256, llama.heads = 4, llama.kv_heads = 2,
  llama.ffn = 512;
  return llama;
}

JobSpec FixedTp2Job() {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kFp32, job.tp = 2, job.dp = 1, job.pp = 1, job.zero = 0,
  job.micro_batch = 8;
  job.recompute = false, job.offload = Offload::kNone;
  return job;
}

// Vocab-parallel (shard/layout.h): where tp divides the vocabulary, each tensor-parallel rank
// holds 1/tp of the token embedding and of the head, so 64 more rows of vocabulary cost each of
// two ranks 64 rows of each table (4 bytes a weight, fp32): 2 * 64 * h * 4 / 2. An odd vocabulary
// stays whole on every rank: 2 more rows cost each rank 2 rows of each table.
TEST(ChoosePlan, TensorParallelRanksHoldTheirSliceOfAVocabularyTpDivides) {
  ModelSpec llama = SmallTpLlama();
  llama.sequence = 128;
  const JobSpec job = FixedTp2Job();
  auto weights = [&](int64_t vocab) {
    ModelSpec m = llama;
    m.vocab = vocab;
    auto plan = ChoosePlan(m, job, Workers(2, 80 * kGiB));
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan.ok() ? plan->tp : 0, 2);
    return plan.ok() ? plan->workers[0].memory.weights : 0;
  };
  EXPECT_EQ(weights(32064) - weights(32000), 2 * 64 * 256 * 4 / 2) << "split: each rank holds half the added rows";
  EXPECT_EQ(weights(32001) - weights(31999), 2 * 2 * 256 * 4) << "an odd vocabulary stays whole on each rank";
}

// Sequence parallelism (worker/train/stage_model.h): a rank keeps its 1/tp of the fp32 residual stream
// the norms save - per layer s * b * h * 8 bytes, half of it under tp = 2 - and on the last stage
// the final norm's fp32 input (s * b * h * 4, halved). Where tp does not divide the sequence, or
// the spec switches it off, the estimate is the whole-sequence one.
TEST(ChoosePlan, SequenceParallelRanksHoldHalfTheResidualStream) {
  ModelSpec llama = SmallTpLlama();
  llama.vocab = 32000;
  const JobSpec job = FixedTp2Job();
  auto activations = [&](int64_t sequence, bool on) {
    JobSpec j = job;
    j.sequence = sequence;
    j.sequence_parallel = on;
    auto plan = ChoosePlan(llama, j, Workers(2, 80 * kGiB));
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? plan->workers[0].memory.activations : 0;
  };
  const double sbh = 128.0 * 8 * 256;  // tokens x hidden of a micro-batch (a gated-MLP block's scale is 1)
  const double saved = static_cast<double>(activations(128, false) - activations(128, true));
  EXPECT_NEAR(saved, llama.layers * sbh * 8 / 2 + sbh * 4 / 2, 8)
      << "half the norms' residual stream and the final norm's input";
  EXPECT_EQ(activations(127, true), activations(127, false))
      << "tp = 2 does not divide 127 tokens: no sequence parallelism";
}

// ZeRO-3 without recompute keeps the last layers of a stage gathered for their backward where
// the budget has room (parallel.keep_gathered = "auto"): each kept GPT-2 block holds its bf16
// weights (2 bytes a parameter) and saves its backward's gather, so the step is predicted
// faster; with less room fewer layers are kept, within half of what the plan leaves; a fixed
// value is kept as given.
TEST(ChoosePlan, Zero3KeepsLayersGatheredWhereTheBudgetHasRoom) {
  JobSpec job = Zero3Job();
  const ClusterView roomy = Workers(2, 140 * kGiB, 141 * kGiB);
  job.keep_gathered = 0;
  auto none = ChoosePlan(Gpt2Small(), job, roomy);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->keep_gathered, 0);
  job.keep_gathered = std::nullopt;
  auto all = ChoosePlan(Gpt2Small(), job, roomy);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->keep_gathered, 12);
  const int64_t per_layer = 2 * kGpt2SmallLayer;  // one micro-batch in flight (no pipeline)
  EXPECT_NEAR(static_cast<double>(all->workers[0].memory.total() - none->workers[0].memory.total()), 12.0 * per_layer,
              2.0);
  // Over NVLink the backward's gathers hide behind the gradients' matmuls (2x H200, 2026-11-29,
  // bench/results/mesh-ranking-2026-11-29-h200x2.json: keeping every layer measured 0.2%
  // faster): no time is predicted saved. Across two hosts their bytes
  // show, and keeping saves them.
  EXPECT_LE(all->step_time.communication_s, none->step_time.communication_s);
  EXPECT_NE(all->why.find("every layer kept gathered for its backward"), std::string::npos) << all->why;
  ClusterView two_hosts = roomy;
  two_hosts.workers[1].node = "n1";
  job.keep_gathered = 0;
  auto none_across = ChoosePlan(Gpt2Small(), job, two_hosts);
  job.keep_gathered = std::nullopt;
  auto all_across = ChoosePlan(Gpt2Small(), job, two_hosts);
  ASSERT_TRUE(none_across.ok() && all_across.ok());
  EXPECT_EQ(all_across->keep_gathered, 12);
  EXPECT_LT(all_across->step_time.communication_s, none_across->step_time.communication_s);

  // Room for 5.5 layers in half the headroom: 5 are kept, and the plan stays within the budget.
  const double budget = static_cast<double>(none->workers[0].memory.total()) + 2 * 5.5 * per_layer;
  const auto free = static_cast<int64_t>(budget / 0.9) + 1;
  auto some = ChoosePlan(Gpt2Small(), job, Workers(2, free, 141 * kGiB));
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(some->keep_gathered, 5);
  EXPECT_NE(some->why.find("the last 5 layers of each stage kept gathered"), std::string::npos) << some->why;
  ExpectFits(*some, Workers(2, free, 141 * kGiB), 0.1);
  // Fixed: as given, even where auto would keep fewer.
  job.keep_gathered = 8;
  auto fixed = ChoosePlan(Gpt2Small(), job, Workers(2, free, 141 * kGiB));
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_EQ(fixed->keep_gathered, 8);
  EXPECT_NEAR(static_cast<double>(fixed->workers[0].memory.total() - none->workers[0].memory.total()), 8.0 * per_layer,
              2.0);
}

// On a pipeline, a stage without the head keeps its last layer's gather anyway (its last call):
// keep_gathered = 1 costs it nothing, and 3 two layers for each micro-batch in flight (2 on the
// first of two stages at 2 micro-batches, 1 on the last, which keeps all 3 extra).
TEST(ChoosePlan, KeptLayersCostWhatTheWorkerKeepsOnEachPipelineStage) {
  JobSpec job = Zero3Job();
  job.dp = 1, job.pp = 2;  // 8 sequences in micro-batches of 4: 2 a step
  const ClusterView roomy = Workers(2, 140 * kGiB, 141 * kGiB);
  auto extra = [&](int64_t keep) {
    job.keep_gathered = 0;
    auto none = ChoosePlan(Gpt2Small(), job, roomy);
    job.keep_gathered = keep;
    auto kept = ChoosePlan(Gpt2Small(), job, roomy);
    EXPECT_TRUE(none.ok() && kept.ok());
    std::vector<double> layers;
    for (size_t k = 0; k < 2; ++k) {
      layers.push_back(static_cast<double>(kept->workers[k].memory.total() - none->workers[k].memory.total()) /
                       (2.0 * kGpt2SmallLayer));
    }
    return layers;
  };
  const std::vector<double> one = extra(1), three = extra(3);
  EXPECT_NEAR(one[0], 0.0, 1e-6);
  EXPECT_NEAR(one[1], 1.0, 1e-6);
  EXPECT_NEAR(three[0], 2.0 * 2, 1e-6);
  EXPECT_NEAR(three[1], 3.0, 1e-6);
}

// A fixed keep_gathered > 0 asks for ZeRO-3 without recompute: with those fields left to the
// planner, it plans that (as offload = "optimizer+params" does), not a mesh that would drop it.
TEST(ChoosePlan, AFixedKeepGatheredPlansZero3WithoutRecompute) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.keep_gathered = 4;
  auto plan = ChoosePlan(Gpt2Small(), job, Workers(2, 140 * kGiB, 141 * kGiB));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->zero, 3);
  EXPECT_EQ(std::count(plan->recompute.begin(), plan->recompute.end(), true), 0);
  EXPECT_EQ(plan->keep_gathered, 4);
}

// Issue #20: global_batch = 2^40 spun `strata plan` for minutes (divisors counted one by one);
// hidden = 2^62 printed "-8589934591.76 GiB". Within the run spec's bounds the search is quick
// and every estimate is a positive byte count; beyond them the planner refuses, naming the bound.
TEST(ChoosePlan, LargestBatchAllowedPlansQuicklyAndHugeOnesAreRefused) {
  ClusterView cluster = Workers(8, 80 * kGiB);
  JobSpec job;
  job.global_batch = 14'414'400;  // under 2^24 with 576 divisors: the most candidates a spec can ask for
  const auto start = std::chrono::steady_clock::now();
  auto plan = ChoosePlan(Gpt2Small(), job, cluster);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(plan->dp * plan->micro_batch * plan->gradient_accumulation, job.global_batch);
  job.global_batch = int64_t{1} << 40;
  auto refused = ChoosePlan(Gpt2Small(), job, cluster);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("train.global_batch = 1099511627776 is over the bound of 16777216"),
            std::string::npos)
      << refused.status().message();
}

TEST(ChoosePlan, EstimatesAtTheBoundsSaturateInsteadOfWrapping) {
  ModelSpec m;
  m.layers = 1024, m.hidden = 65536, m.heads = 1024, m.vocab = int64_t{1} << 24, m.sequence = int64_t{1} << 20;
  m.ffn = int64_t{1} << 20;
  JobSpec job;
  job.global_batch = int64_t{1} << 24;
  job.micro_batch = int64_t{1} << 24;
  auto plan = ChoosePlan(m, job, Workers(2, 80 * kGiB));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(std::regex_search(plan.status().message(), std::regex("(^|[ (=])-[0-9]")))
      << "a negative size: " << plan.status().message();
  const MemoryEstimate state = ModelStateBytes(ParameterCount(m), StateLayout::kFp32, 0, 1);
  EXPECT_GT(state.total(), 0);
  for (bool recompute : {false, true}) {
    const int64_t acts =
        StageActivationBytes(m, m.sequence, job.global_batch, 1, true, false, m.layers, 1024, recompute);
    EXPECT_GT(acts, int64_t{1} << 50) << recompute;  // clamped high, never wrapped negative
  }
  ModelSpec huge = Gpt2Small();
  huge.hidden = int64_t{1} << 62;
  auto refused = ChoosePlan(huge, JobSpec{}, Workers(2, 80 * kGiB));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("model.hidden = 4611686018427387904 is over the bound of 65536"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace strata::shard
