// The plan search's cost and its prunings: a 4,096-GPU plan in a pinned number of estimates,
// and the pruned search against an exhaustive one over every candidate (planner_test_util.h).
#include <gtest/gtest.h>

#include <optional>
#include <regex>

#include "shard/internal.h"
#include "shard/planner_test_util.h"

namespace strata::shard {
namespace {

ModelSpec Llama3_70B() {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 80, m.hidden = 8192, m.heads = 64, m.kv_heads = 8, m.ffn = 28672, m.vocab = 128256, m.sequence = 4096;
  return m;
}

ModelSpec Llama3_8B() {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn = 14336, m.vocab = 128256, m.sequence = 4096;
  return m;
}

ClusterView Nodes(int nodes, int gpus, int64_t memory = 80 * kGiB) {
  ClusterView view;
  for (int n = 0; n < nodes; ++n) {
    for (int g = 0; g < gpus; ++g) {
      WorkerView w;
      w.node = "node" + std::to_string(n);
      w.name = w.node + "/gpu" + std::to_string(g);
      w.total_bytes = w.free_bytes = memory;
      view.workers.push_back(std::move(w));
    }
  }
  return view;
}

JobSpec Bf16Job(int64_t global_batch) {
  JobSpec job;
  job.global_batch = global_batch, job.precision = Precision::kBf16;
  job.offload.reset();  // "auto", as a run spec leaves it
  return job;
}

// The issue's case: minutes of CPU before the search was bounded. The mesh is the one the
// exhaustive search chose (dp=64 pp=8 tp=8 ZeRO-3, micro-batch 1); the count of estimates is
// pinned so that a change that makes the search grow with the cluster fails here, not in a
// user's terminal (bench/plan_bench.cc measures the time).
TEST(PlanSearch, Llama70BOn4096GpusInAPinnedNumberOfEstimates) {
  JobSpec job = Bf16Job(1024);
  job.uniform_recompute = true;  // as JobForRun plans a run
  auto plan = ChoosePlan(Llama3_70B(), job, Nodes(512, 8));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->dp, 64);
  EXPECT_EQ(plan->pp, 8);
  EXPECT_EQ(plan->tp, 8);
  EXPECT_EQ(plan->zero, 3);
  EXPECT_EQ(plan->micro_batch, 1);
  EXPECT_EQ(plan->offload, Offload::kNone);
  EXPECT_EQ(plan->workers.size(), 4096u);
  EXPECT_EQ(plan->candidates_evaluated, 882);

  auto larger = ChoosePlan(Llama3_70B(), job, Nodes(4096, 8));
  ASSERT_TRUE(larger.ok()) << larger.status().ToString();
  EXPECT_EQ(larger->workers.size(), 32768u);
  EXPECT_EQ(larger->candidates_evaluated, 300);
}

// The pruned search (leanest-candidate checks per mesh, bisection over recompute, offload tiers)
// chooses what evaluating every candidate chooses: on each worker count from the largest down,
// each offload tier in turn, the best plan that fits.
std::optional<Plan> ExhaustiveBest(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster) {
  auto problem = internal::Validate(model, job, cluster, PlannerOptions{});
  EXPECT_TRUE(problem.ok()) << problem.status().ToString();
  for (int64_t n = static_cast<int64_t>(cluster.workers.size()); n >= 1; --n) {
    const std::vector<WorkerView> workers = internal::PickWorkers(problem->workers, n);
    const std::vector<WorkerView> whole_nodes = internal::PickWorkers(problem->workers, n, true);
    internal::StageCache stages(*problem, workers), tp_stages(*problem, whole_nodes);
    for (Offload tier : internal::OffloadTiers(*problem)) {
      std::optional<Plan> best;
      internal::ForEachCandidate(*problem, n, [&](const internal::Candidate& c) {
        if (c.offload != tier) return;
        internal::Fill fill;
        Plan plan = internal::Evaluate(*problem, c, c.tp > 1 ? tp_stages : stages, false, &fill);
        if (fill.worst > 1.0) return;
        const double ta = plan.step_time.total_s(), tb = best ? best->step_time.total_s() : 0;
        if (!best || ta < tb * (1 - 1e-9)) best = plan;
      });
      if (best) return best;
    }
  }
  return std::nullopt;
}

TEST(PlanSearch, ChoosesWhatEvaluatingEveryCandidateChooses) {
  ModelSpec llama;
  llama.family = Family::kLlama;
  llama.layers = 6, llama.hidden = 256, llama.heads = 8, llama.kv_heads = 4, llama.ffn = 688, llama.vocab = 1000,
  llama.sequence = 512;
  ModelSpec one_layer = Gpt2Small();  // recomputing its one layer needs more than keeping it
  one_layer.layers = 1;
  int compared = 0;
  for (const ModelSpec& model : {Gpt2Small(), llama, one_layer}) {
    for (const int64_t memory : {int64_t{1} << 30, int64_t{3} << 30, int64_t{6} << 30, int64_t{24} << 30}) {
      for (const int workers : {1, 2, 4, 6, 8}) {
        for (const bool bf16 : {false, true}) {
          JobSpec job = Bf16Job(16);
          if (!bf16) job.precision = Precision::kFp32;
          const ClusterView cluster = Workers(workers, memory);
          const std::optional<Plan> reference = ExhaustiveBest(model, job, cluster);
          auto plan = ChoosePlan(model, job, cluster);
          const std::string what = std::string(Name(model.family)) + " on " + std::to_string(workers) + " x " +
                                   std::to_string(memory >> 20) + " MiB, " + std::string(Name(job.precision));
          ASSERT_EQ(plan.ok(), reference.has_value()) << what << ": " << plan.status().ToString();
          if (!reference) continue;
          ++compared;
          EXPECT_EQ(plan->dp, reference->dp) << what;
          EXPECT_EQ(plan->pp, reference->pp) << what;
          EXPECT_EQ(plan->tp, reference->tp) << what;
          EXPECT_EQ(plan->offload, reference->offload) << what;
          // Equal-time plans are told apart by the tie-breaks, which the reference leaves out.
          EXPECT_NEAR(plan->step_time.total_s(), reference->step_time.total_s(), 1e-9 * reference->step_time.total_s())
              << what;
        }
      }
    }
  }
  EXPECT_GT(compared, 60);  // most of the grid has a plan
  // Where recompute is faster than keeping the activations (ZeRO-3 at dp = 8: recomputed layers
  // pay no per-unit gather cost), and where kept layers make micro-batch 1 the hungriest.
  JobSpec zero3 = Bf16Job(512);
  zero3.dp = 8, zero3.pp = 1, zero3.tp = 1, zero3.zero = 3, zero3.micro_batch = 1;
  JobSpec kept = Bf16Job(8);
  kept.pp = 2, kept.zero = 3, kept.keep_gathered = 2, kept.recompute = false;
  for (const auto& [what, job, model, cluster] :
       {std::make_tuple("zero3 dp=8", zero3, Gpt2Small(), Workers(8, 80 * kGiB)),
        std::make_tuple("keep_gathered 2", kept, llama, Workers(4, int64_t{2} << 30))}) {
    const std::optional<Plan> reference = ExhaustiveBest(model, job, cluster);
    auto plan = ChoosePlan(model, job, cluster);
    ASSERT_EQ(plan.ok(), reference.has_value()) << what << ": " << plan.status().ToString();
    if (!reference) continue;
    EXPECT_NEAR(plan->step_time.total_s(), reference->step_time.total_s(), 1e-9 * reference->step_time.total_s())
        << what;
    EXPECT_EQ(plan->recompute, reference->recompute) << what;
    EXPECT_EQ(plan->micro_batch, reference->micro_batch) << what;
  }
}

// An 8B model's full training state (16 bytes a parameter) is over an 80 GiB card: the search
// offloads, and says why; with the offload fixed off it is refused.
TEST(PlanSearch, OffloadIsPlannedWhenNothingFitsWithoutIt) {
  auto plan = ChoosePlan(Llama3_8B(), Bf16Job(8), Nodes(1, 1));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_NE(plan->offload, Offload::kNone);
  EXPECT_NE(plan->why.find("to host memory: without it the leanest plan on 1 worker needs"), std::string::npos)
      << plan->why;
  JobSpec fixed = Bf16Job(8);
  fixed.offload = Offload::kNone;
  EXPECT_FALSE(ChoosePlan(Llama3_8B(), fixed, Nodes(1, 1)).ok());
  // With room to spare nothing is offloaded.
  auto roomy = ChoosePlan(Llama3_8B(), Bf16Job(8), Nodes(1, 8));
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  EXPECT_EQ(roomy->offload, Offload::kNone);
  EXPECT_EQ(roomy->why.find("to host memory"), std::string::npos) << roomy->why;
}

// A refusal lists each memory option with what it would need, and each line's number is the
// one ChoosePlan gives for the spec with that one edit (what `strata plan` prints).
TEST(PlanSearch, ARefusalListsEachMemoryOptionWithNumbersItsPlanReproduces) {
  // Llama-3-70B on one node of 8 x 80 GiB with the offload fixed off (the user's choice): the
  // other two offloads and 8-bit AdamW are the options.
  JobSpec job = Bf16Job(1024);
  job.offload = Offload::kNone;
  job.uniform_recompute = true;
  ClusterView cluster = Nodes(1, 8);
  auto refused = ChoosePlan(Llama3_70B(), job, cluster);
  ASSERT_FALSE(refused.ok());
  const std::string message = refused.status().message();
  struct Edit {
    std::string line;
    JobSpec job;
  };
  JobSpec optimizer = job, params = job, eight_bit = job;
  optimizer.offload = Offload::kOptimizer;
  params.offload = Offload::kOptimizerAndParams;
  eight_bit.optimizer = Optimizer::kAdamW8bit;
  for (const Edit& edit : {Edit{"parallel.offload = \"optimizer\": ", optimizer},
                           Edit{"parallel.offload = \"optimizer+params\": ", params},
                           Edit{"train.optimizer = \"adamw8bit\": ", eight_bit}}) {
    const size_t at = message.find("\n  " + edit.line);
    ASSERT_NE(at, std::string::npos) << edit.line << " missing from: " << message;
    const std::string line = message.substr(at + 3, message.find('\n', at + 3) - at - 3);
    auto again = ChoosePlan(Llama3_70B(), edit.job, cluster);
    std::smatch number;
    if (again.ok()) {
      ASSERT_TRUE(std::regex_search(line, number, std::regex(R"(fits - peak ([0-9.]+ [KMGT]iB))"))) << line;
      EXPECT_NE(again->why.find("peak " + number[1].str()), std::string::npos) << line << " vs " << again->why;
    } else {
      ASSERT_TRUE(std::regex_search(line, number, std::regex(R"(needs ([0-9.]+ [KMGT]iB) free per GPU)"))) << line;
      EXPECT_NE(again.status().message().find("needs " + number[1].str() + " free per GPU"), std::string::npos)
          << line << " vs " << again.status().message();
    }
  }
  EXPECT_EQ(message.find("\n  parallel.offload = \"none\""), std::string::npos)
      << "the searched setting is not an option: " << message;
}

// One H200 (139 GiB free) on a host with 120 GiB free, as the GPU node measured: Llama-3.1-8B's
// full state is over the GPU and its offloaded state over the host, so the run is refused; the
// list names the host memory as what the offloads miss, and 8-bit AdamW as what fits.
TEST(PlanSearch, ARefusalSaysWhenTheHostMemoryIsWhatAnOffloadMisses) {
  ClusterView cluster = Nodes(1, 1, 141 * kGiB);
  cluster.workers[0].free_bytes = 139 * kGiB;
  cluster.workers[0].host_free_bytes = 120 * kGiB;
  auto refused = ChoosePlan(Llama3_8B(), Bf16Job(8), cluster);
  ASSERT_FALSE(refused.ok());
  const std::string message = refused.status().message();
  const size_t line = message.find("\n  parallel.offload = \"optimizer\": does not fit");
  ASSERT_NE(line, std::string::npos) << message;
  EXPECT_NE(message.find("need more host memory for the offloaded state than the nodes have free", line),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("\n  train.optimizer = \"adamw8bit\" (offload planned as now): fits - peak"),
            std::string::npos)
      << message;
}

// The issue's case: Llama-3-70B (sequence 4096, global batch 1024) on one node of 8 x 80 GiB
// whose host has 1 TiB free, offload left to the planner. Without the host memory stated it
// would plan the optimizer's state offloaded; with it nothing fits (the offloaded state of 70B
// parameters is over the host), and the list's 8-bit line is the plan `strata plan` gives for it.
TEST(PlanSearch, Llama70BOnANodeOf80GiBCardsIsRefusedWithOptionsItsPlanReproduces) {
  JobSpec job = Bf16Job(1024);
  job.uniform_recompute = true;
  ClusterView cluster = Nodes(1, 8);
  auto without_host = ChoosePlan(Llama3_70B(), job, cluster);
  ASSERT_TRUE(without_host.ok()) << without_host.status().ToString();
  EXPECT_EQ(without_host->offload, Offload::kOptimizer);
  for (WorkerView& w : cluster.workers) w.host_free_bytes = int64_t{1} << 40;
  auto refused = ChoosePlan(Llama3_70B(), job, cluster);
  ASSERT_FALSE(refused.ok());
  const std::string message = refused.status().message();
  std::smatch peak;
  ASSERT_TRUE(std::regex_search(
      message, peak,
      std::regex(R"(train.optimizer = "adamw8bit" \(offload planned as now\): fits - peak ([0-9.]+ GiB))")))
      << message;
  JobSpec eight_bit = job;
  eight_bit.optimizer = Optimizer::kAdamW8bit;
  auto again = ChoosePlan(Llama3_70B(), eight_bit, cluster);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(again->why.find("peak " + peak[1].str()), std::string::npos) << again->why;
}

}  // namespace
}  // namespace strata::shard
