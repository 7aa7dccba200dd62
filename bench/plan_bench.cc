// Planning time for a large cluster (targets: 4,096 GPUs under 1 s, 32,768 under 5 s, on a
// 2-core machine): Llama-3-70B's shape (80 layers, hidden 8192, 64 heads, 8 kv-heads, ffn 28672,
// vocab 128256, sequence 4096), global batch 1024, bf16, on nodes of 8 H100 80 GiB, every
// [parallel] field "auto" (offload too). shard/planner_test.cc pins the candidates each search
// evaluates; this measures the time.
//
//   plan_bench [--benchmark_min_time=...]
#include <benchmark/benchmark.h>

#include "shard/planner.h"

namespace {

using namespace strata;

ModelSpec Llama70B() {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 80, m.hidden = 8192, m.heads = 64, m.kv_heads = 8, m.ffn = 28672, m.vocab = 128256, m.sequence = 4096;
  return m;
}

shard::ClusterView Nodes(int nodes, int gpus) {
  shard::ClusterView view;
  for (int n = 0; n < nodes; ++n) {
    for (int g = 0; g < gpus; ++g) {
      shard::WorkerView w;
      w.node = "node" + std::to_string(n);
      w.name = w.node + "/gpu" + std::to_string(g);
      w.total_bytes = w.free_bytes = int64_t{80} << 30;
      view.workers.push_back(std::move(w));
    }
  }
  return view;
}

void BM_Plan(benchmark::State& state) {
  const auto cluster = Nodes(static_cast<int>(state.range(0)), 8);
  shard::JobSpec job;
  job.global_batch = 1024, job.precision = Precision::kBf16;
  for (auto _ : state) {
    auto plan = shard::ChoosePlan(Llama70B(), job, cluster);
    if (!plan.ok()) state.SkipWithError(plan.status().message().c_str());
    benchmark::DoNotOptimize(plan);
  }
  state.counters["gpus"] = static_cast<double>(cluster.workers.size());
}
BENCHMARK(BM_Plan)->Arg(64)->Arg(512)->Arg(4096)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
