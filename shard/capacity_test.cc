#include "shard/capacity.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "shard/parallel_change.h"

namespace strata::shard {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A Llama-style model 4096 wide (Llama 2 7B's width); its layer count is what the search varies.
ModelSpec Llama4096() {
  ModelSpec m;
  m.family = Family::kLlama, m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 32, m.ffn = 11008,
  m.vocab = 32000;
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
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 1, job.pp = 1, job.tp = 1;
  const ClusterView cluster = OneGpu(80 * kGiB);
  const auto capacities = LargestTrainable(Llama4096(), job, cluster);
  ASSERT_EQ(capacities.size(), 6u);
  for (const Capacity& c : capacities) {
    SCOPED_TRACE(c.option.name);
    ASSERT_GT(c.layers, 0) << c.plan;
    JobSpec j = job;
    j.optimizer = c.option.optimizer, j.offload = c.option.offload, j.lora = c.option.lora;
    ModelSpec m = Llama4096();
    m.layers = c.layers;
    EXPECT_TRUE(ChoosePlan(m, j, cluster).ok());
    EXPECT_EQ(c.parameters, ParameterCount(m));
    if (c.layers < spec_bounds::kLayers) {
      m.layers = c.layers + 1;
      EXPECT_FALSE(ChoosePlan(m, j, cluster).ok()) << "one more layer should not fit";
    }
    EXPECT_FALSE(c.plan.empty());
  }
  // 8-bit moments take 2.03 bytes a parameter of AdamW's 8, offload none of them, and with the
  // parameters streamed the GPU holds nothing per parameter: each trains more layers than the
  // one before (with no host memory given, the last is bound by activations and streaming
  // buffers only).
  EXPECT_LT(capacities[0].layers, capacities[1].layers);
  EXPECT_LT(capacities[1].layers, capacities[2].layers);
  EXPECT_LT(capacities[2].layers, capacities[3].layers);
  EXPECT_NE(capacities[3].plan.find("ZeRO-3"), std::string::npos) << capacities[3].plan;
  EXPECT_NE(capacities[3].plan.find("recompute on 0 of 1"), std::string::npos) << capacities[3].plan;
  // Fine-tuning the frozen base (2 bytes a weight, or NF4's 0.52) goes past every way of training
  // it in full, QLoRA furthest; both are PEFT's r = 16 on every linear.
  const Capacity &lora = capacities[4], &qlora = capacities[5];
  EXPECT_EQ(lora.option.name, "LoRA r=16, bf16 base");
  EXPECT_EQ(qlora.option.name, "QLoRA r=16, nf4 base");
  EXPECT_EQ(lora.option.lora.base, LoraBase::kDense);
  EXPECT_EQ(qlora.option.lora.base, LoraBase::kNf4);
  EXPECT_EQ(lora.option.lora.target_modules, LoraTargetModules(Family::kLlama));
  EXPECT_GT(lora.layers, capacities[2].layers);
  EXPECT_GT(qlora.layers, lora.layers);
}

// The spec's own model each way: a 7B-shaped Llama trains in full on one 80 GB GPU only with the
// parameters streamed from the host; LoRA and QLoRA fit it, each with the peak of the plan
// ChoosePlan gives that way.
TEST(LargestTrainable, SaysWhetherTheSpecsModelFitsEachWayWithItsPeak) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 1, job.pp = 1, job.tp = 1;
  const ClusterView cluster = OneGpu(80 * kGiB);
  const auto capacities = LargestTrainable(Llama4096(), job, cluster);
  ASSERT_EQ(capacities.size(), 6u);
  for (const Capacity& c : capacities) {
    SCOPED_TRACE(c.option.name);
    JobSpec j = job;
    j.optimizer = c.option.optimizer, j.offload = c.option.offload, j.lora = c.option.lora;
    auto plan = ChoosePlan(Llama4096(), j, cluster);
    ASSERT_EQ(c.model_fits, plan.ok()) << c.model_plan;
    EXPECT_EQ(c.model_fits, c.layers >= Llama4096().layers);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().message().rfind(c.model_plan, 0), 0u) << c.model_plan;
      EXPECT_EQ(c.model_plan.find("Memory options"), std::string::npos);
      continue;
    }
    int64_t peak = 0;
    for (const WorkerAssignment& w : plan->workers) peak = std::max(peak, w.memory.total());
    EXPECT_EQ(c.model_peak, peak);
    EXPECT_LE(c.model_peak, 80 * kGiB);
  }
  EXPECT_FALSE(capacities[0].model_fits);  // 16 bytes a parameter: 108 GB
  EXPECT_TRUE(capacities[4].model_fits);
  EXPECT_TRUE(capacities[5].model_fits);
  EXPECT_LT(capacities[5].model_peak, capacities[4].model_peak);
}

// A spec with its own [lora] is shown its rank and targets, over both bases.
TEST(LargestTrainable, ALoraSpecsFineTuningRowsUseItsRankAndTargets) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 1, job.pp = 1, job.tp = 1;
  job.lora.enabled = true, job.lora.rank = 64, job.lora.alpha = 16, job.lora.target_modules = {"q_proj", "v_proj"};
  job.lora.base = LoraBase::kNf4;
  const auto capacities = LargestTrainable(Llama4096(), job, OneGpu(80 * kGiB));
  ASSERT_EQ(capacities.size(), 6u);
  EXPECT_FALSE(capacities[0].option.lora.enabled);  // full training rows train every weight
  EXPECT_EQ(capacities[4].option.name, "LoRA r=64, bf16 base");
  EXPECT_EQ(capacities[4].option.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(capacities[4].option.lora.base, LoraBase::kDense);
  EXPECT_EQ(capacities[5].option.lora.base, LoraBase::kNf4);
  EXPECT_EQ(capacities[5].option.lora.rank, 64);
}

TEST(LargestTrainable, NothingFitsSaysWhy) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 1;
  const auto capacities = LargestTrainable(Llama4096(), job, OneGpu(kGiB));
  for (const Capacity& c : capacities) {
    EXPECT_EQ(c.layers, 0) << c.option.name;
    EXPECT_FALSE(c.plan.empty()) << c.option.name;
  }
}

}  // namespace
}  // namespace strata::shard

namespace strata::shard {
namespace {

// A node's host memory bounds what its workers can offload: 16 bytes a parameter (m, v, the
// master copy and the gradient buffer) within the host's free memory less the safety margin.
TEST(OffloadPlanning, HostMemoryBoundsTheOffloadedModel) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 1, job.pp = 1, job.tp = 1;
  ClusterView cluster = OneGpu(141 * kGiB);
  const int64_t unbounded = LargestTrainable(Llama4096(), job, cluster)[2].layers;
  cluster.workers[0].host_free_bytes = 128 * kGiB;  // the GPU node's host
  const Capacity bounded = LargestTrainable(Llama4096(), job, cluster)[2];
  ASSERT_GT(bounded.layers, 0) << bounded.plan;
  EXPECT_LT(bounded.layers, unbounded);
  ModelSpec m = Llama4096();
  m.layers = bounded.layers;
  job.offload = Offload::kOptimizer;
  auto plan = ChoosePlan(m, job, cluster);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->workers[0].memory.host, 16 * ParameterCount(m));
  EXPECT_LE(plan->workers[0].memory.host, static_cast<int64_t>(0.9 * 128 * kGiB));
  m.layers = bounded.layers + 1;
  auto refused = ChoosePlan(m, job, cluster);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("need more host memory than the nodes have free"), std::string::npos)
      << refused.status().message();
}

// offload = "optimizer+params": the GPU keeps nothing per parameter (weights, gradients and
// optimizer state are 0 on it), the host the same 16 bytes a parameter plus two staging buffers
// of the longest unit for the gradients' sums; it is planned as ZeRO-3 without recompute, and
// the host bounds it as it bounds "optimizer".
TEST(OffloadPlanning, StreamedParametersLeaveTheGpuOnlyWhatIsInFlight) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 1, job.pp = 1, job.tp = 1;
  ClusterView cluster = OneGpu(141 * kGiB);
  cluster.workers[0].host_free_bytes = 128 * kGiB;
  const auto capacities = LargestTrainable(Llama4096(), job, cluster);
  const Capacity& streamed = capacities[3];
  ASSERT_EQ(streamed.option.offload, Offload::kOptimizerAndParams);
  ASSERT_GT(streamed.layers, 0) << streamed.plan;
  ModelSpec m = Llama4096();
  m.layers = streamed.layers;
  job.offload = Offload::kOptimizerAndParams;
  auto plan = ChoosePlan(m, job, cluster);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->zero, 3);
  EXPECT_FALSE(plan->recompute.front());
  const MemoryEstimate& mem = plan->workers[0].memory;
  EXPECT_EQ(mem.weights + mem.gradients + mem.optimizer_state, 0);
  ModelSpec one_layer = m;
  one_layer.layers = 1;
  const int64_t layer = (ParameterCount(m) - ParameterCount(one_layer)) / (m.layers - 1);
  const int64_t longest = std::max(layer, m.vocab * m.hidden);  // a block, or the embedding
  EXPECT_EQ(mem.host, 16 * ParameterCount(m) + 2 * 4 * longest);
  // Host-bound here (141 GB of GPU, 128 GiB of host): one layer more does not fit the host.
  m.layers = streamed.layers + 1;
  auto refused = ChoosePlan(m, job, cluster);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("host memory"), std::string::npos) << refused.status().message();
  // A zero other than 3 leaves no candidate for it.
  job.zero = 1;
  m.layers = 2;
  EXPECT_FALSE(ChoosePlan(m, job, cluster).ok());
}

// Two workers of one node share its host: ZeRO-1 halves each one's offloaded state, and the sum
// is what the host must hold.
TEST(OffloadPlanning, WorkersOfANodeShareItsHost) {
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.dp = 2, job.pp = 1, job.tp = 1, job.zero = 1,
  job.offload = Offload::kOptimizer;
  ClusterView cluster = OneGpu(141 * kGiB);
  cluster.workers.push_back(cluster.workers[0]);
  cluster.workers[1].name = "gpu1";
  ModelSpec m = Llama4096();
  const double per_node = 16.0 * static_cast<double>(ParameterCount(m));  // both halves
  for (auto& w : cluster.workers) w.host_free_bytes = static_cast<int64_t>(per_node / 0.9 * 1.01);
  auto fits = ChoosePlan(m, job, cluster);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_NEAR(static_cast<double>(fits->workers[0].memory.host), per_node / 2, per_node * 1e-6);
  for (auto& w : cluster.workers) w.host_free_bytes = static_cast<int64_t>(per_node / 0.9 * 0.99);
  EXPECT_FALSE(ChoosePlan(m, job, cluster).ok());
}

// The offloaded update runs beside the next forward (worker/train/optimizer.h): the step pays only
// what the forward does not hide, so offload's share of the step falls as the batch grows and
// is gone once the forward outlasts the update. ZeRO-1 with dp > 1 gathers the updated shards
// before any forward: there all of it counts.
TEST(OffloadPlanning, TheNextForwardHidesTheUpdate) {
  JobSpec job;
  job.precision = Precision::kBf16, job.dp = 1, job.pp = 1, job.tp = 1, job.offload = Offload::kOptimizer,
  job.micro_batch = 8;
  const ClusterView cluster = OneGpu(141 * kGiB);
  ModelSpec m = Llama4096();
  m.layers = 4;
  double last = -1;
  for (const int64_t batch : {8, 16, 32, 4096}) {
    job.global_batch = batch;
    auto plan = ChoosePlan(m, job, cluster);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const double offload = plan->step_time.communication_s;  // one GPU: offload is all of it
    if (last >= 0) {
      EXPECT_LT(offload, last) << "batch " << batch;
    }
    std::printf("batch %lld: offload's share of the step %.4f s\n", static_cast<long long>(batch), offload);
    if (batch == 4096) {
      EXPECT_EQ(offload, 0.0);
    }
    last = offload;
  }
  ClusterView two = cluster;
  two.workers.push_back(two.workers[0]);
  two.workers[1].name = "gpu1";
  job.global_batch = 4096, job.dp = 2, job.zero = 0;
  auto hidden = ChoosePlan(m, job, two);  // the gradients' all-reduce alone
  job.zero = 1;
  auto gathered = ChoosePlan(m, job, two);
  ASSERT_TRUE(hidden.ok()) << hidden.status().ToString();
  ASSERT_TRUE(gathered.ok()) << gathered.status().ToString();
  EXPECT_GT(gathered->step_time.communication_s, hidden->step_time.communication_s);
}

TEST(OffloadPlanning, TheSpecsOffloadIsTheJobsAndAPlanCarriesItBack) {
  RunSpec spec;
  spec.model = Llama4096();
  spec.train.global_batch = 8;
  for (const Offload o : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerAndParams}) {
    spec.parallel.offload = o;
    EXPECT_EQ(JobForRun(spec).offload, std::optional<Offload>(o)) << Name(o);
    Plan plan;
    plan.dp = 1, plan.pp = 1, plan.tp = 1, plan.micro_batch = 8, plan.offload = o, plan.recompute = {false};
    EXPECT_EQ(ParallelFromPlan(RunSpec().parallel, plan).offload, o);
  }
  EXPECT_EQ(ParseChoice<Offload>("disk"), std::nullopt);
}

}  // namespace
}  // namespace strata::shard

namespace strata::shard {
namespace {

// Out of memory at micro-batch 1 with recompute on, on one GPU: the re-plan's last resort before
// giving up is the optimizer in host memory (same losses), and only where the host can hold it.
TEST(OffloadPlanning, OutOfMemoryReplanTurnsOffloadOnWhenNothingElseFits) {
  ModelSpec m = Llama4096();
  JobSpec job;
  job.global_batch = 8, job.precision = Precision::kBf16, job.offload = Offload::kNone;
  ClusterView cluster = OneGpu(141 * kGiB);
  m.layers = LargestTrainable(m, job, cluster)[0].layers;  // the most AdamW on the GPU trains
  job.micro_batch = 1, job.recompute = true;               // nothing left to shrink (the re-plan opens every field)
  auto current = ChoosePlan(m, job, cluster);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  ASSERT_EQ(current->offload, Offload::kNone);
  ASSERT_EQ(current->micro_batch, 1) << "the test wants a plan with nothing left to shrink";
  ASSERT_TRUE(current->recompute.front());
  // The device's free memory turned out to be what the plan estimated, less a tenth.
  ClusterView after = cluster;
  after.workers[0].free_bytes = current->workers[0].memory.total() * 9 / 10;
  const ReplanReason oom = ReplanReason::OutOfMemory("gpu0", 1);
  auto change = Replan(*current, m, job, after, oom);
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_NE(change->plan.offload, Offload::kNone) << change->description;
  EXPECT_NE(change->description.find("offload"), std::string::npos) << change->description;
  // A host too small for the state: no re-plan, and the message says what to do.
  for (auto& w : after.workers) w.host_free_bytes = 8 * kGiB;
  auto none = Replan(*current, m, job, after, oom);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata::shard
