// LoRA plans (JobSpec::lora, shard/lora_memory.cc): the frozen base priced in the compute dtype
// without gradients or optimizer state, the adapters as trainable state under ZeRO's shares, a
// step's matmuls without the base's weight gradients, and the meshes a LoRA run takes (tp = 1,
// ZeRO 0-2, no streamed parameters). Expected numbers are worked out from model/'s parameter
// counts and the formulas in lora_memory.cc's header, not copied from the estimator's output.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

#include "model/parameters.h"
#include "shard/estimator_constants.h"
#include "shard/internal.h"
#include "shard/planner_test_util.h"

namespace strata::shard {
namespace {

// Llama 3.1 8B's shape at sequence 2048.
ModelSpec Llama31_8B() {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.head_dim = 128, m.ffn = 14336, m.vocab = 128256;
  m.sequence = 2048;
  return m;
}

LoraSpec Lora(int64_t rank, std::vector<std::string> modules) {
  LoraSpec lora;
  lora.enabled = true, lora.rank = rank, lora.alpha = 2.0 * static_cast<double>(rank);
  lora.target_modules = std::move(modules);
  return lora;
}

LoraSpec AllLinear(int64_t rank) { return Lora(rank, LoraTargetModules(Family::kLlama)); }

// A bf16 train spec of global batch 8 with every [parallel] field left to the planner (as a
// spec without a [parallel] table reads).
RunSpec AutoSpec(const ModelSpec& model, std::optional<LoraSpec> lora = std::nullopt) {
  RunSpec spec;
  spec.model = model;
  spec.train.global_batch = 8, spec.train.precision = Precision::kBf16;
  spec.parallel.automatic = {"dp", "pp", "tp", "micro_batch", "zero", "recompute", "keep_gathered", "offload"};
  if (lora) spec.lora = *lora;
  return spec;
}

// GPUs of 80 GB (79 GiB free) on one node, each host with 64 GiB free: the host memory an
// offloaded optimizer takes is checked (with a larger host, one GPU trains the 8B in full with the
// parameters streamed from it).
ClusterView Gpus(int n) {
  ClusterView cluster = Workers(n, 79 * kGiB, 80 * kGiB);
  for (WorkerView& w : cluster.workers) w.host_free_bytes = 64 * kGiB;
  return cluster;
}

int64_t ModelState(const MemoryEstimate& m) { return m.weights + m.gradients + m.optimizer_state; }

// (a) The brief's case: full training of the 8B does not fit one 80 GB GPU (16 bytes a parameter
// on the device, or 10 with the optimizer's state in a host that cannot hold it), LoRA r=16 on
// every linear does, on tp = 1, with the model state of a frozen bf16 base and fp32-trained adapters.
TEST(LoraPlan, Llama8BTrainsOnOne80GBGpuWithLoraAndNotInFull) {
  const ModelSpec model = Llama31_8B();
  auto full = ChoosePlan(model, JobForRun(AutoSpec(model)), Gpus(1));
  ASSERT_FALSE(full.ok()) << full->why;
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().ToString();
  // The refusal offers LoRA among the memory options, with its plan.
  const std::string refusal = full.status().message();
  const size_t offered = refusal.find("[lora] rank = 16, alpha = 32, target_modules = \"all-linear\"");
  ASSERT_NE(offered, std::string::npos) << refusal;
  EXPECT_EQ(refusal.compare(refusal.find(": ", offered) + 2, 12, "fits - peak "), 0) << refusal;

  const LoraSpec lora = AllLinear(16);
  const JobSpec job = JobForRun(AutoSpec(model, lora));
  ASSERT_TRUE(job.lora.enabled);
  auto plan = ChoosePlan(model, job, Gpus(1));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->tp, 1);
  ASSERT_EQ(plan->workers.size(), 1u);
  ASSERT_EQ(plan->offload, Offload::kNone) << plan->why;  // the optimizer's state on the device
  ExpectFits(*plan, Gpus(1), 0.1);
  const int64_t base = model::ParameterCount(model), adapters = model::LoraParameterCount(model, lora);
  // Per layer: q 16*4096 + 4096*16, k and v 16*4096 + 1024*16 each, o as q, gate/up/down
  // 16*4096 + 14336*16 each: 1,310,720; 32 layers.
  EXPECT_EQ(adapters, 32 * 1'310'720);
  // The base in bf16 (2); the adapters' fp32 master (4), gradient (4), AdamW m and v (8) and bf16
  // working copy (2).
  EXPECT_EQ(ModelState(plan->workers[0].memory), base * 2 + adapters * (4 + 4 + 8 + 2));
  EXPECT_EQ(plan->workers[0].memory.gradients, adapters * 4);
  EXPECT_EQ(plan->workers[0].memory.optimizer_state, adapters * 8);
  EXPECT_NE(plan->why.find("LoRA r=16 on every linear: 41.9M trainable of 8.07B"), std::string::npos) << plan->why;
}

// (b) Everything "auto" on 8 GPUs: no candidate the search (or a re-plan) can visit has tp > 1,
// ZeRO-3 or the parameters streamed from the host, though the same job without LoRA has all three.
TEST(LoraPlan, AnAutoJobOnEightGpusIsNeverPlannedWithTensorParallelZero3OrStreamedParameters) {
  const ModelSpec model = Llama31_8B();
  const ClusterView cluster = Gpus(8);
  auto visited = [&](const JobSpec& job) {
    std::set<std::string> seen;
    auto problem = internal::Validate(model, job, cluster, PlannerOptions{});
    EXPECT_TRUE(problem.ok()) << problem.status().ToString();
    if (!problem.ok()) return seen;
    for (int64_t n = 1; n <= 8; ++n) {
      internal::ForEachCandidate(*problem, n, [&](const internal::Candidate& c) {
        seen.insert("candidate");
        if (c.tp > 1) seen.insert("tp > 1");
        if (c.zero == 3) seen.insert("zero 3");
        if (c.offload == Offload::kOptimizerAndParams) seen.insert("optimizer+params");
        if (c.offload == Offload::kOptimizer) seen.insert("optimizer");
      });
    }
    return seen;
  };
  EXPECT_EQ(visited(JobForRun(AutoSpec(model))),
            (std::set<std::string>{"candidate", "tp > 1", "zero 3", "optimizer+params", "optimizer"}));
  const JobSpec job = JobForRun(AutoSpec(model, AllLinear(16)));
  EXPECT_EQ(visited(job), (std::set<std::string>{"candidate", "optimizer"}));

  auto plan = ChoosePlan(model, job, cluster);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->tp, 1) << plan->why;
  EXPECT_LT(plan->zero, 3) << plan->why;
  EXPECT_NE(plan->offload, Offload::kOptimizerAndParams) << plan->why;
  EXPECT_EQ(plan->dp * plan->pp, 8) << plan->why;

  // A re-plan after a lost worker opens every field again, and stays on LoRA's meshes.
  ClusterView seven = cluster;
  const std::string lost = plan->workers.front().worker;
  std::erase_if(seven.workers, [&](const WorkerView& w) { return w.name == lost; });
  auto change = Replan(*plan, model, job, seven, ReplanReason::WorkerLost(lost));
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(change->plan.tp, 1) << change->plan.why;
  EXPECT_LT(change->plan.zero, 3) << change->plan.why;
  EXPECT_NE(change->plan.offload, Offload::kOptimizerAndParams) << change->plan.why;
}

// Fixed values a LoRA run does not take are refused naming the field (as the run spec refuses
// them: spec/run_spec_lora.cc), rather than searched into no plan.
TEST(LoraPlan, FixedTensorParallelZero3AndStreamedParametersAreRefused) {
  const ModelSpec model = Llama31_8B();
  JobSpec base = JobForRun(AutoSpec(model, AllLinear(16)));
  JobSpec tp = base, zero = base, offload = base;
  tp.tp = 2, zero.zero = 3, offload.offload = Offload::kOptimizerAndParams;
  for (const auto& [job, field] : {std::pair{tp, "parallel.tp = 2"}, std::pair{zero, "parallel.zero = 3"},
                                   std::pair{offload, "\"optimizer+params\""}}) {
    auto plan = ChoosePlan(model, job, Gpus(8));
    ASSERT_FALSE(plan.ok()) << field;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << plan.status().ToString();
    EXPECT_NE(plan.status().message().find(field), std::string::npos) << plan.status().ToString();
  }
}

// (c) Under ZeRO-1 and ZeRO-2 over dp = 2 every rank holds the whole frozen base (nothing of it is
// sharded) and the adapters' optimizer state is halved; their gradient buffer stays whole, as for
// any unit (the trainer reduce-scatters in place: ModelStateBytes). Only the adapters' gradients
// cross the data-parallel ranks.
TEST(LoraPlan, ZeroOneAndTwoShardTheAdaptersStateAndNeverTheFrozenBase) {
  const ModelSpec model = Llama31_8B();
  const LoraSpec lora = Lora(16, {"q_proj", "v_proj"});
  const int64_t base = model::ParameterCount(model), adapters = model::LoraParameterCount(model, lora);
  // q: 16*4096 + 4096*16, v: 16*4096 + 1024*16, per layer.
  EXPECT_EQ(adapters, 32 * (131'072 + 81'920));
  auto planned = [&](int64_t dp, int64_t zero) {
    JobSpec job = JobForRun(AutoSpec(model, lora));
    job.dp = dp, job.pp = 1, job.tp = 1, job.zero = zero, job.micro_batch = 2, job.recompute = true;
    job.offload = Offload::kNone;
    auto plan = ChoosePlan(model, job, Gpus(static_cast<int>(dp)));
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? *plan : Plan{};
  };
  const Plan one = planned(1, 0);
  ASSERT_EQ(one.workers.size(), 1u);
  EXPECT_EQ(one.workers[0].memory.weights, base * 2 + adapters * (4 + 2));
  EXPECT_EQ(one.step_time.communication_s, 0);
  for (int64_t zero : {1, 2}) {
    const Plan two = planned(2, zero);
    ASSERT_EQ(two.workers.size(), 2u) << "zero " << zero;
    for (const WorkerAssignment& w : two.workers) {
      EXPECT_EQ(w.memory.weights, one.workers[0].memory.weights) << "zero " << zero;
      EXPECT_EQ(w.memory.weights, base * 2 + adapters * (4 + 2)) << "zero " << zero;
      EXPECT_EQ(w.memory.gradients, adapters * 4) << "zero " << zero;
      EXPECT_EQ(w.memory.optimizer_state, adapters * 8 / 2) << "zero " << zero;
    }
    // The adapters' fp32 gradients, ring all-reduced over NVLink's 200 GB/s (ZeRO-2's reduce-scatter
    // and gather move as much); ZeRO-1 gathers the updated fp32 adapter shards too (half as much again).
    const double all_reduce = 2.0 * (2 - 1) / 2 * static_cast<double>(adapters) * 4 / 200e9;
    EXPECT_DOUBLE_EQ(two.step_time.communication_s, zero == 1 ? 1.5 * all_reduce : all_reduce) << "zero " << zero;
  }
}

// A small Llama on a roomy GPU, one fixed mesh with LoRA and without: the activations add x A^T per
// adapted matrix per layer and drop the head's weight gradient in the fused loss; the matmuls drop
// the base's weight gradients (2 FLOPs a parameter and token) and add the adapters' 6, and the
// optimizer's time is the adapters'.
TEST(LoraPlan, ActivationsAndStepTimeOfAFrozenBase) {
  ModelSpec model;
  model.family = Family::kLlama;
  model.layers = 4, model.hidden = 1024, model.heads = 16, model.kv_heads = 4, model.ffn = 2816, model.vocab = 32000;
  model.sequence = 512;
  const LoraSpec lora = AllLinear(8);
  auto planned = [&](bool with_lora) {
    JobSpec job = JobForRun(AutoSpec(model, with_lora ? std::optional<LoraSpec>(lora) : std::nullopt));
    job.dp = 1, job.pp = 1, job.tp = 1, job.zero = 0, job.micro_batch = 4, job.recompute = false;
    job.offload = Offload::kNone;
    auto plan = ChoosePlan(model, job, Workers(1, 140 * kGiB, 141 * kGiB));
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? *plan : Plan{};
  };
  const Plan full = planned(false), adapted = planned(true);
  ASSERT_EQ(full.workers.size(), 1u);
  ASSERT_EQ(adapted.workers.size(), 1u);
  const double tokens = 512.0 * 4, h = 1024, vocab = 32000;
  // 7 adapted matrices a layer, [tokens, 8] in bf16 each; the full run's head keeps dW in fp32 and a
  // chunk's partial dW in bf16 (6 bytes a weight; 32000 rows are a multiple of 64, so no padded copy).
  const double adapter_activations = 4 * tokens * 7 * 8 * 2;
  EXPECT_NEAR(static_cast<double>(adapted.workers[0].memory.activations - full.workers[0].memory.activations),
              adapter_activations - 6 * vocab * h, 2.0);

  const double base = static_cast<double>(model::ParameterCount(model));
  const double adapters = static_cast<double>(model::LoraParameterCount(model, lora));
  const double layer = (base - 2 * vocab * h - h) / 4;  // one block's parameters
  const double matmul_params = 4 * layer + vocab * h;   // the blocks' and the head's (the lookup is none)
  const double peak = 989e12 * 0.7, step_tokens = 8 * 512;
  const double matmuls_saved = (2 * matmul_params - 6 * adapters) * step_tokens / peak;
  const double optimizer_saved = estimator_constants::kOptimizerSecondsPerParam * (base - adapters);
  EXPECT_NEAR(full.step_time.compute_s - adapted.step_time.compute_s, matmuls_saved + optimizer_saved,
              1e-9 * full.step_time.compute_s);
}

// QLoRA: the block linears leave the dense bf16 base for NF4's 4.127 bits a weight; the rest of
// the model state is LoRA's.
TEST(LoraPlan, AnNf4BaseHoldsTheBlockLinearsAtFourPointOneBitsAWeight) {
  const ModelSpec model = Llama31_8B();
  LoraSpec lora = AllLinear(16);
  auto dense = ChoosePlan(model, JobForRun(AutoSpec(model, lora)), Gpus(1));
  lora.base = LoraBase::kNf4;
  auto nf4 = ChoosePlan(model, JobForRun(AutoSpec(model, lora)), Gpus(1));
  ASSERT_TRUE(dense.ok() && nf4.ok()) << nf4.status().ToString();
  ASSERT_EQ(dense->workers.size(), 1u);
  ASSERT_EQ(nf4->workers.size(), 1u);
  int64_t matrices = 0;
  for (const model::Parameter& p : model::BlockParameters(model))
    if (p.shape.size() == 2) matrices += p.numel();
  matrices *= model.layers;
  const double saved = static_cast<double>(matrices) * (2.0 - (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8);
  EXPECT_NEAR(static_cast<double>(dense->workers[0].memory.weights - nf4->workers[0].memory.weights), saved, 1e3);
  EXPECT_EQ(dense->workers[0].memory.optimizer_state, nf4->workers[0].memory.optimizer_state);
}

}  // namespace
}  // namespace strata::shard

namespace strata::shard {
namespace {

// A LoRA checkpoint holds the adapters and their AdamW moments (fp32 each), the frozen base not:
// what submit's disk check asks of each store (client/estimate.cc), not the 8B's 96 GB of full
// training state.
TEST(LoraCheckpointShardBytes, TheAdaptersAndTheirMomentsOnlyInEachRanksShare) {
  const ModelSpec model = Llama31_8B();
  const LoraSpec lora = AllLinear(16);
  Plan one;
  one.stages = {{0, 32}};
  WorkerAssignment w;
  EXPECT_EQ(CheckpointShardBytes(model, one, w, lora), int64_t{32} * 1'310'720 * 12);
  EXPECT_EQ(CheckpointShardBytes(model, one, w), model::ParameterCount(model) * 12);  // full training
  // pp = 2 x dp = 2: 16 layers a stage, half of them a rank.
  Plan piped;
  piped.dp = 2, piped.pp = 2;
  piped.stages = {{0, 16}, {16, 32}};
  w.stage = 1, w.dp_rank = 1;
  EXPECT_EQ(CheckpointShardBytes(model, piped, w, lora), int64_t{8} * 1'310'720 * 12);
}

}  // namespace
}  // namespace strata::shard
