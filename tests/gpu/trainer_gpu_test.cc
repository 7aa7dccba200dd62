// GPU tests (ctest label `gpu`): skip cleanly where LibTorch has no CUDA or no device is visible.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "model/parameters.h"
#include "tests/gpu/mirror_communicator.h"
#include "worker/comm/communicator.h"
#include "worker/nn/buffer_sink_testing.h"
#include "worker/nn/causal_lm.h"
#include "worker/nn/fused_linear.h"
#include "worker/nn/nf4_linear.h"
#include "worker/nn/torch_compat.h"
#include "worker/torch_executor.h"
#include "worker/train/trainer.h"

namespace strata::worker {
namespace {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
    char tmpl[] = "/tmp/strata-gpu-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream out(dir_ + "/corpus.txt");
    for (int i = 0; i < 300; ++i)
      out << "the quick brown fox jumps over the lazy dog. pack my box with five dozen jugs. ";
  }
  std::string dir_;
};

std::vector<double> Train(const std::string& corpus, torch::Device device, int steps,
                          const std::string& precision = "fp32", const std::string& family = "gpt2", int64_t zero = 0,
                          const std::function<void(RunSpec&)>& adjust = {}, int* graph_steps = nullptr,
                          FaultInjector* faults = nullptr, TensorParallelOverlapCounts* overlap_counts = nullptr,
                          bool mirrored = false) {
  TaskContext context;
  context.run_id = "gpu";
  if (faults) context.faults = faults;
  ModelSpec& m = context.spec.model;
  m.family = ParseChoice<Family>(family).value();
  m.layers = 2;
  m.hidden = 64;
  m.heads = 4;
  m.vocab = 256;
  m.sequence = 64;
  m.kv_heads = family == "llama" ? 2 : 4;
  m.ffn = family == "llama" ? 192 : 256;
  EXPECT_TRUE(ValidateModelSpec(m, "").ok());
  context.spec.data.path = corpus;
  context.spec.train.global_batch = 8;
  context.spec.train.lr = 3e-3;
  context.spec.train.precision = ParseChoice<Precision>(precision).value();
  context.spec.parallel.zero = zero;
  if (adjust) adjust(context.spec);
  const auto world = static_cast<uint32_t>(context.spec.parallel.workers());
  zmq::context_t zmq_context;  // outlives the communicator's sockets (its destructor waits for them)
  std::unique_ptr<Communicator> comm;
  if (world > 1 && mirrored) {
    // Rank 0 of a mesh whose other ranks are its copies (mirror_communicator.h).
    context.rank = 0;
    context.world_size = world;
    comm = CreateMirrorCommunicator(world, 0, device);
  } else if (world > 1) {
    // One rank of a mesh (TrainMesh below): this process's rank comes from the environment, its
    // peers are processes of this binary on the same GPU, over ZeroMQ.
    const char* rank = std::getenv("STRATA_GPU_TEST_RANK");
    EXPECT_NE(rank, nullptr) << "a mesh of " << world << " ranks runs as processes: TrainMesh";
    if (!rank) return {};
    std::vector<std::string> addresses;
    const size_t mesh_id =
        std::hash<std::string>{}(std::getenv("STRATA_GPU_TEST_MESH") ? std::getenv("STRATA_GPU_TEST_MESH") : "");
    for (uint32_t r = 0; r < world; ++r)
      addresses.push_back("ipc://" + corpus + "." + std::to_string(mesh_id % 1000000) + ".rank" + std::to_string(r));
    context.rank = static_cast<uint32_t>(std::stoul(rank));
    context.world_size = world;
    auto zmq = CreateZmqCommunicator(zmq_context, {context.rank, addresses, 5, 60000, std::nullopt});
    EXPECT_TRUE(zmq.ok()) << zmq.status().ToString();
    if (!zmq.ok()) return {};
    comm = std::move(zmq).value();
  } else {
    comm = strata::worker::CreateSoloCommunicator();
  }
  context.communicator = comm.get();
  auto data = TokenData::Load(context.spec.data, 256);
  EXPECT_TRUE(data.ok());
  if (world > 1) std::fprintf(stderr, "rank %u of %u: communicator up\n", context.rank, world);
  auto made = Trainer::Create(context, std::move(data).value(), device);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (!made.ok()) return {};
  Trainer& trainer = **made;
  if (world > 1) std::fprintf(stderr, "rank %u: trainer built\n", context.rank);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    auto loss = trainer.Step();
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    if (world > 1) std::fprintf(stderr, "rank %u: step %d loss %.6f\n", context.rank, s + 1, loss.ok() ? *loss : -1.0);
    losses.push_back(loss.ok() ? *loss : 0.0);
    if (graph_steps && trainer.last_step_replayed_graph()) ++*graph_steps;
  }
  if (overlap_counts) *overlap_counts = trainer.tp_overlap_counts();
  if (context.spec.parallel.tp > 1 && !mirrored) {
    // parallel.tp_comm_overlap is on by default: the weight gradients of the matmuls after f were
    // put off to its backward (here, over ZeroMQ, run after its host-staged collective: beside it
    // takes NCCL, mesh_gpu_test). The forward's collectives stay in turn: ZeroMQ stages them.
    EXPECT_GT(trainer.tp_overlap_counts().weight_gradients_deferred, 0);
    EXPECT_EQ(trainer.tp_overlap_counts().collectives_beside_matmuls, 0);
    std::fprintf(stderr, "rank %u: %lld weight gradients put off to a tp collective\n", context.rank,
                 static_cast<long long>(trainer.tp_overlap_counts().weight_gradients_deferred));
  }
  return losses;
}

TEST_F(GpuTest, CudaTrainingMatchesCpuInFp32) {
  auto cpu = Train(dir_ + "/corpus.txt", torch::kCPU, 10);
  auto gpu = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), 10);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 2e-3 * cpu[i]) << "step " << i + 1;
  EXPECT_LT(gpu.back(), gpu.front());
}

// A dp x tp mesh on the one GPU there is: each rank a process of this test binary
// (GpuTest.DISABLED_MeshRank), talking over ZeroMQ - host-staged collectives of CUDA tensors,
// where a worker per GPU would use NCCL. (Threads of one process cannot: autograd runs every
// backward on a CUDA device in one thread, where one rank's collective would wait for another's
// backward queued behind it.) Steps run op by op: a host-staged collective cannot be captured in
// a CUDA graph. Returns rank 0's losses.
std::vector<double> TrainMesh(const std::string& dir, int64_t dp, int64_t tp, int64_t zero, int steps,
                              const std::string& precision, const std::string& family) {
  const int world = static_cast<int>(dp * tp);
  for (int r = 0; r < world; ++r)
    std::remove((dir + "/losses.rank" + std::to_string(r)).c_str());  // none left from a run before
  std::vector<pid_t> children;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("STRATA_GPU_TEST_RANK", std::to_string(r).c_str(), 1);
      setenv("STRATA_GPU_TEST_MESH",
             (dir + "|" + std::to_string(steps) + "|" + precision + "|" + family + "|" + std::to_string(dp) + "|" +
              std::to_string(tp) + "|" + std::to_string(zero))
                 .c_str(),
             1);
      execl("/proc/self/exe", "trainer_gpu_test", "--gtest_filter=GpuTest.DISABLED_MeshRank",
            "--gtest_also_run_disabled_tests", static_cast<char*>(nullptr));
      _exit(127);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank's process failed (its output is above)";
  }
  // Every rank wrote its losses, and they agree (every rank reports the step's mean loss).
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir + "/losses.rank" + std::to_string(r));
    for (double loss; in >> loss;) losses[static_cast<size_t>(r)].push_back(loss);
    EXPECT_EQ(losses[static_cast<size_t>(r)].size(), static_cast<size_t>(steps)) << "rank " << r << " wrote no losses";
    EXPECT_EQ(losses[static_cast<size_t>(r)], losses[0]) << "rank " << r;
  }
  return losses[0];
}

// One rank of TrainMesh (run only as its child: disabled otherwise).
TEST_F(GpuTest, DISABLED_MeshRank) {
  const char* mesh = std::getenv("STRATA_GPU_TEST_MESH");
  ASSERT_NE(mesh, nullptr) << "run by TrainMesh";
  std::vector<std::string> fields;
  std::stringstream in(mesh);
  for (std::string field; std::getline(in, field, '|');) fields.push_back(field);
  ASSERT_EQ(fields.size(), 7u);
  const int64_t dp = std::stoll(fields[4]), tp = std::stoll(fields[5]);
  auto losses = Train(fields[0] + "/corpus.txt", torch::Device(torch::kCUDA, 0), std::stoi(fields[1]), fields[2],
                      fields[3], std::stoll(fields[6]), [dp, tp](RunSpec& spec) {
                        spec.parallel.dp = dp;
                        spec.parallel.tp = tp;
                        spec.train.cuda_graphs = false;
                      });
  ASSERT_EQ(losses.size(), static_cast<size_t>(std::stoi(fields[1])));
  std::ofstream out(fields[0] + "/losses.rank" + std::getenv("STRATA_GPU_TEST_RANK"));
  out.precision(17);
  for (double loss : losses) out << loss << "\n";
}

// Tensor parallelism with the vocabulary split (vocab 256 over tp = 2: the lookup's masked sum,
// the loss's row statistics gathered across ranks and its dx summed), on CUDA tensors: the
// losses of one rank, in fp32 within rounding and in bf16 within its precision. GPT-2's tied
// table and Llama's own head both.
TEST_F(GpuTest, TensorParallelRanksWithTheVocabularySplitTrainAsOneRank) {
  const torch::Device gpu(torch::kCUDA, 0);
  for (const char* family : {"gpt2", "llama"}) {
    for (const char* precision : {"fp32", "bf16"}) {
      auto one = Train(dir_ + "/corpus.txt", gpu, 6, precision, family);
      auto two = TrainMesh(dir_, 1, 2, 0, 6, precision, family);
      ASSERT_EQ(two.size(), one.size()) << family << " " << precision;
      const double bound = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_NEAR(two[i], one[i], bound * one[i]) << family << " " << precision << " step " << i + 1;
      EXPECT_LT(two.back(), two.front()) << family << " " << precision;
      std::printf("%s %s tp=2 on one GPU: losses %.6f .. %.6f, one rank %.6f .. %.6f\n", family, precision, two.front(),
                  two.back(), one.front(), one.back());
    }
  }
}

// Data parallel under ZeRO 1 and 2: each unit's gradient sum starts beside the backward on a side
// stream (worker/train/optimizer.h), here with CUDA tensors staged through the host. dp = 2 is gradient
// accumulation over two ranks: one rank's losses, in fp32 within rounding, in bf16 within its
// precision.
TEST_F(GpuTest, DataParallelRanksSumBesideTheBackwardAndTrainAsOneRank) {
  const torch::Device gpu(torch::kCUDA, 0);
  for (const int64_t zero : {1, 2}) {
    for (const char* precision : {"fp32", "bf16"}) {
      auto one = Train(dir_ + "/corpus.txt", gpu, 6, precision, "llama", zero);
      auto two = TrainMesh(dir_, 2, 1, zero, 6, precision, "llama");
      ASSERT_EQ(two.size(), one.size()) << "zero " << zero << " " << precision;
      const double bound = std::string(precision) == "fp32" ? 1e-5 : 2e-2;
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_NEAR(two[i], one[i], bound * one[i]) << "zero " << zero << " " << precision << " step " << i + 1;
      std::printf("llama %s dp=2 zero %lld on one GPU: losses %.6f .. %.6f, one rank %.6f .. %.6f\n", precision,
                  static_cast<long long>(zero), two.front(), two.back(), one.front(), one.back());
    }
  }
}

// The collectives of a mesh as device work on the one GPU (mirror_communicator.h: the other ranks
// are rank 0's copies), where NCCL's kernels would run - on the side streams, joined, captured.
// What a missing join would break shows as losses that differ from the ordered form's:
// - data parallel, ZeRO 1 and 2: each unit's sum starts beside the backward (optimizer.h); ZeRO-3
//   gathers and reduce-scatters beside the compute. Captured as one graph from the second step on,
//   against op by op (fp32: the same kernels in the same order, within rounding);
// - tensor parallel (sequence parallel, 2 and 4 ranks), parallel.tp_comm_overlap on against off:
//   f's backward collective beside the weight gradients put off for it, f's forward gather beside
//   the first matmul's own rows, g's sum in chunks beside the next chunk's matmul, g's backward
//   gather beside the own tokens' dx. A read before its join reads the mirror's NaN. In fp32 and
//   bf16, within rounding (the row blocks); captured as a graph, against op by op.
TEST_F(GpuTest, MirroredMeshCollectivesOnSideStreamsGiveTheOrderedLosses) {
  const torch::Device gpu(torch::kCUDA, 0);
  const int steps = 6;
  for (const int64_t zero : {1, 2, 3}) {
    const std::string what = "llama fp32 dp=2 zero " + std::to_string(zero) + " mirrored";
    auto mesh = [&](bool graphs) {
      return [zero, graphs](RunSpec& spec) {
        spec.parallel.dp = 2;
        spec.parallel.zero = zero;
        spec.train.global_batch = 16;
        spec.train.cuda_graphs = graphs;
      };
    };
    auto eager =
        Train(dir_ + "/corpus.txt", gpu, steps, "fp32", "llama", zero, mesh(false), nullptr, nullptr, nullptr, true);
    int graph_steps = 0;
    auto graphed = Train(dir_ + "/corpus.txt", gpu, steps, "fp32", "llama", zero, mesh(true), &graph_steps, nullptr,
                         nullptr, true);
    ASSERT_EQ(graphed.size(), eager.size()) << what;
    EXPECT_EQ(graph_steps, steps - 1) << what << ": the first step runs eagerly, every later one as the graph";
    double worst = 0;
    for (size_t i = 0; i < eager.size(); ++i) {
      worst = std::max(worst, std::abs(graphed[i] - eager[i]) / eager[i]);
      EXPECT_NEAR(graphed[i], eager[i], 1e-5 * eager[i]) << what << " step " << i + 1;
    }
    std::printf("%s: losses %.6f .. %.6f, graph vs op by op largest relative difference %.3g\n", what.c_str(),
                graphed.front(), graphed.back(), worst);
  }
  for (const std::string family : {"llama", "gpt2"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      for (const int64_t tp : {2, 4}) {
        const std::string what = family + " " + precision + " tp=" + std::to_string(tp) + " mirrored";
        // Per train.cuda_graphs (the steps after the first replay as one graph, or run op by op) and
        // per overlap.
        std::map<std::pair<bool, bool>, std::vector<double>> losses;
        std::map<std::pair<bool, bool>, TensorParallelOverlapCounts> counts;
        std::map<bool, int> graph_steps;
        for (const bool graphs : {false, true}) {
          for (const bool overlap : {false, true}) {
            losses[std::make_pair(graphs, overlap)] = Train(
                dir_ + "/corpus.txt", gpu, steps, precision, family, 0,
                [&](RunSpec& spec) {
                  spec.parallel.tp = tp;
                  spec.parallel.tp_comm_overlap = overlap;
                  spec.train.cuda_graphs = graphs;
                  spec.model.heads = 4;
                  spec.model.kv_heads = 4;
                },
                &graph_steps[graphs], nullptr, &counts[std::make_pair(graphs, overlap)], true);
          }
          const std::pair<bool, bool> with{graphs, true}, without{graphs, false};
          ASSERT_EQ(losses[with].size(), static_cast<size_t>(steps)) << what;
          // The backward's overlap computes the same ops in another order; the forward's multiplies
          // row blocks (the gather's own rows first, the sum's chunks), which cuBLAS may round
          // otherwise than the whole matmul: equal within the graphs' bound, and said whether bit for bit.
          double overlap_worst = 0;
          for (int i = 0; i < steps; ++i) {
            const double on = losses[with][i], off = losses[without][i];
            overlap_worst = std::max(overlap_worst, std::abs(on - off) / off);
            EXPECT_NEAR(on, off, (precision == "fp32" ? 1e-5 : 2e-3) * off)
                << what << (graphs ? ", graphs" : "") << " step " << i + 1;
          }
          std::printf("%s%s: overlap on vs off largest relative loss difference %.3g (%s)\n", what.c_str(),
                      graphs ? ", graphs" : "", overlap_worst,
                      losses[with] == losses[without] ? "bit for bit" : "not bit for bit");
          EXPECT_GT(counts[with].weight_gradients_deferred, 0) << what;
          EXPECT_GT(counts[with].collectives_beside_matmuls, 0) << what;
          EXPECT_EQ(counts[without].weight_gradients_deferred, 0) << what;
          EXPECT_EQ(counts[without].collectives_beside_matmuls, 0) << what;
        }
        EXPECT_EQ(graph_steps[false], 0) << what;
        EXPECT_EQ(graph_steps[true], 2 * (steps - 1)) << what << ": each run's steps after the first replay as a graph";
        const double bound = precision == "fp32" ? 1e-5 : 2e-3;
        double worst = 0;
        for (int i = 0; i < steps; ++i) {
          const double eager = losses[std::make_pair(false, true)][i], graphed = losses[std::make_pair(true, true)][i];
          worst = std::max(worst, std::abs(graphed - eager) / eager);
          EXPECT_NEAR(graphed, eager, bound * eager) << what << " step " << i + 1;
        }
        std::printf(
            "%s: losses %.6f .. %.6f, %lld weight gradients beside a collective, %lld collectives beside a matmul; "
            "%d of two runs' %d steps replayed a graph; graph vs op by op largest relative difference %.3g\n",
            what.c_str(), losses[std::make_pair(false, true)].front(), losses[std::make_pair(false, true)].back(),
            static_cast<long long>(counts[std::make_pair(false, true)].weight_gradients_deferred),
            static_cast<long long>(counts[std::make_pair(false, true)].collectives_beside_matmuls), graph_steps[true],
            2 * steps, worst);
      }
    }
  }
}

// ZeRO-3 under tensor parallel, mirrored: the tp overlap's collectives on the tp group's side
// stream run beside ZeRO-3's gathers and reduce-scatters on theirs (two communicators); ZeRO-3's
// shards put no weight gradient off (each use is reduce-scattered as it completes). Overlap on
// against off, op by op and as graphs (where the step is captured), within rounding.
TEST_F(GpuTest, MirroredZero3UnderTensorParallelOverlapsAndGivesTheOrderedLosses) {
  const torch::Device gpu(torch::kCUDA, 0);
  const int steps = 6;
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string what = "llama " + precision + " dp=2 x tp=2 zero 3 mirrored";
    std::map<std::pair<bool, bool>, std::vector<double>> losses;
    std::map<std::pair<bool, bool>, TensorParallelOverlapCounts> counts;
    std::map<bool, int> graph_steps;
    for (const bool graphs : {false, true}) {
      for (const bool overlap : {false, true}) {
        losses[std::make_pair(graphs, overlap)] = Train(
            dir_ + "/corpus.txt", gpu, steps, precision, "llama", 3,
            [&](RunSpec& spec) {
              spec.parallel.dp = 2;
              spec.parallel.tp = 2;
              spec.parallel.tp_comm_overlap = overlap;
              spec.train.global_batch = 16;
              spec.train.cuda_graphs = graphs;
              spec.model.heads = 4;
              spec.model.kv_heads = 4;
            },
            &graph_steps[graphs], nullptr, &counts[std::make_pair(graphs, overlap)], true);
      }
    }
    const std::vector<double>& ordered = losses[std::make_pair(false, false)];
    ASSERT_EQ(ordered.size(), static_cast<size_t>(steps)) << what;
    const double bound = precision == "fp32" ? 1e-5 : 2e-3;
    double worst = 0;
    for (const auto& [key, run] : losses) {
      ASSERT_EQ(run.size(), ordered.size()) << what;
      for (int i = 0; i < steps; ++i) {
        worst = std::max(worst, std::abs(run[i] - ordered[i]) / ordered[i]);
        EXPECT_NEAR(run[i], ordered[i], bound * ordered[i])
            << what << (key.first ? ", graphs" : "") << (key.second ? ", overlap" : "") << " step " << i + 1;
      }
    }
    EXPECT_GT(counts[std::make_pair(false, true)].collectives_beside_matmuls, 0) << what;
    EXPECT_EQ(counts[std::make_pair(false, true)].weight_gradients_deferred, 0) << what;
    EXPECT_EQ(counts[std::make_pair(false, false)].collectives_beside_matmuls, 0) << what;
    std::printf(
        "%s: losses %.6f .. %.6f, %lld collectives beside a matmul, %d of two runs' %d steps replayed a graph; "
        "largest relative difference from the ordered op-by-op run %.3g\n",
        what.c_str(), ordered.front(), ordered.back(),
        static_cast<long long>(counts[std::make_pair(false, true)].collectives_beside_matmuls), graph_steps[true],
        2 * steps, worst);
  }
}

// train.cuda_graphs: from the second step on, the forwards and backwards replay as one graph, and
// the losses are those of the op-by-op run (the same kernels in the same order; only attention's
// backward may add in another order). With gradient accumulation (4 micro-batches) and ZeRO-1.
TEST_F(GpuTest, CudaGraphStepsGiveTheLossesOfOpByOpSteps) {
  const int steps = 12;
  for (const std::string family : {"gpt2", "llama"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      for (const int64_t micro : {int64_t{0}, int64_t{2}}) {
        const std::string what = family + " " + precision + " micro_batch " + std::to_string(micro);
        auto eager = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, precision, family,
                           micro ? 1 : 0, [&](RunSpec& spec) {
                             spec.train.cuda_graphs = false;
                             spec.parallel.micro_batch = micro;
                           });
        int graph_steps = 0;
        auto graphed = Train(
            dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, precision, family, micro ? 1 : 0,
            [&](RunSpec& spec) { spec.parallel.micro_batch = micro; }, &graph_steps);
        EXPECT_EQ(graph_steps, steps - 1) << what << ": the first step runs eagerly, every later one as the graph";
        const double bound = precision == "fp32" ? 1e-5 : 2e-3;
        double worst = 0;
        for (int i = 0; i < steps; ++i) {
          worst = std::max(worst, std::abs(graphed[i] - eager[i]) / eager[i]);
          EXPECT_NEAR(graphed[i], eager[i], bound * eager[i]) << what << " step " << i + 1;
        }
        std::printf("%s: largest relative loss difference graph vs op by op %.3g\n", what.c_str(), worst);
        EXPECT_LT(graphed.back(), graphed.front()) << what;
      }
    }
  }
}

// ZeRO-3 steps replay as one graph too (their gathers and reduce-scatters on the side stream are
// captured), with the op-by-op losses bit for bit; and when the capture is refused after the
// backwards (an op that synchronises, injected), what the refused schedule left - its calls, its
// gradient buffers' and gathers' events from the dead capture - is dropped, the step runs op by op
// and so does the rest of the run, with the same losses.
TEST_F(GpuTest, Zero3StepsReplayAsAGraphAndARefusedCaptureFallsBackCleanly) {
  struct SyncAtStep2 final : FaultInjector {
    int64_t StepBallastBytesPerSequence(int64_t, uint32_t) const override { return 0; }
    Hang HangBeforeStep(int64_t, uint32_t) override { return Hang::kNone; }
    bool SyncInStep(int64_t step) const override { return step == 2; }
  } refuse;
  const int steps = 6;
  for (const std::string family : {"gpt2", "llama"}) {
    auto micro2 = [](RunSpec& spec) { spec.parallel.micro_batch = 2; };  // 4 micro-batches: uses add up
    auto eager =
        Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, "bf16", family, 3, [&](RunSpec& spec) {
          micro2(spec);
          spec.train.cuda_graphs = false;
        });
    int graph_steps = 0;
    auto graphed =
        Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, "bf16", family, 3, micro2, &graph_steps);
    EXPECT_EQ(graph_steps, steps - 1) << family;
    int refused_graph_steps = 0;
    auto refused = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, "bf16", family, 3, micro2,
                         &refused_graph_steps, &refuse);
    EXPECT_EQ(refused_graph_steps, 0) << family << ": after a refused capture every step runs op by op";
    for (int i = 0; i < steps; ++i) {
      EXPECT_EQ(graphed[i], eager[i]) << family << " step " << i + 1;
      EXPECT_EQ(refused[i], eager[i]) << family << " step " << i + 1 << " (capture refused at step 2)";
    }
  }
}

// [parallel] offload = "optimizer" on a CUDA worker: the host AdamW, with gradients leaving during
// the backward and each unit's update waited for by the next forward (worker/train/optimizer.h), gives
// the on-GPU optimizer's losses - bit for bit where two on-GPU runs agree bit for bit (the host
// AdamW's arithmetic is the GPU kernel's). With gradient accumulation (the last micro-batch's
// backward sends the gradients) and with recompute (its units are sent after the backward).
TEST_F(GpuTest, OffloadedOptimizerGivesTheOnGpuLosses) {
  const int steps = 8;
  for (const std::string family : {"gpt2", "llama"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      for (const auto& [micro, recompute] :
           {std::pair{int64_t{0}, false}, std::pair{int64_t{2}, false}, std::pair{int64_t{2}, true}}) {
        const std::string what =
            family + " " + precision + " micro_batch " + std::to_string(micro) + (recompute ? " recompute" : "");
        auto run = [&](Offload offload) {
          return Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, precision, family, 0,
                       [&](RunSpec& spec) {
                         spec.train.cuda_graphs = false;
                         spec.parallel.micro_batch = micro;
                         spec.parallel.recompute = recompute;
                         spec.parallel.offload = offload;
                       });
        };
        const auto on_gpu = run(Offload::kNone);
        const bool deterministic = run(Offload::kNone) == on_gpu;
        const auto offloaded = run(Offload::kOptimizer);
        for (int i = 0; i < steps; ++i) {
          if (deterministic) {
            EXPECT_EQ(offloaded[i], on_gpu[i]) << what << " step " << i + 1;
          } else {
            EXPECT_NEAR(offloaded[i], on_gpu[i], (precision == "fp32" ? 1e-5 : 2e-3) * on_gpu[i])
                << what << " step " << i + 1;
          }
        }
        std::printf("%s: on-GPU runs %s; offloaded vs on-GPU at the last step %.17g vs %.17g\n", what.c_str(),
                    deterministic ? "agree bit for bit" : "differ", offloaded.back(), on_gpu.back());
        EXPECT_LT(offloaded.back(), offloaded.front()) << what;
      }
    }
  }
}

// offload = "optimizer+params": every layer uploaded from pinned host memory as streamed ZeRO-3
// gathers it (cast to bf16 on the GPU), the gradients summed on the host. The same arithmetic as
// streamed ZeRO-3 with its shards on the GPU, so the losses are equal where two GPU runs agree.
TEST_F(GpuTest, HostStreamedParametersGiveTheOnGpuZero3Losses) {
  const int steps = 8;
  for (const std::string family : {"gpt2", "llama"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      for (const int64_t micro : {int64_t{0}, int64_t{2}}) {
        const std::string what = family + " " + precision + " micro_batch " + std::to_string(micro);
        auto run = [&](Offload offload) {
          return Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), steps, precision, family, 3,
                       [&](RunSpec& spec) {
                         spec.train.cuda_graphs = false;
                         spec.parallel.micro_batch = micro;
                         spec.parallel.offload = offload;
                       });
        };
        const auto on_gpu = run(Offload::kNone);
        const bool deterministic = run(Offload::kNone) == on_gpu;
        const auto streamed = run(Offload::kOptimizerAndParams);
        for (int i = 0; i < steps; ++i) {
          if (deterministic) {
            EXPECT_EQ(streamed[i], on_gpu[i]) << what << " step " << i + 1;
          } else {
            EXPECT_NEAR(streamed[i], on_gpu[i], (precision == "fp32" ? 1e-5 : 2e-3) * on_gpu[i])
                << what << " step " << i + 1;
          }
        }
        std::printf("%s: on-GPU ZeRO-3 runs %s; host-streamed vs on-GPU at the last step %.17g vs %.17g\n",
                    what.c_str(), deterministic ? "agree bit for bit" : "differ", streamed.back(), on_gpu.back());
        EXPECT_LT(streamed.back(), streamed.front()) << what;
      }
    }
  }
}

TEST_F(GpuTest, AutocastGuardRunsMatmulsInBf16OnlyWhileAlive) {
  // Drawn on the host, as the workers draw their weights: a capture refused earlier in this
  // process (Zero3StepsReplayAsAGraphAndARefusedCaptureFallsBackCleanly) leaves LibTorch's CUDA
  // generator marked as capturing (its CUDAGraph::capture_end throws before the generator's
  // epilogue), and a random op on the device then fails.
  auto a = torch::randn({8, 8}).to(torch::Device(torch::kCUDA, 0));
  {
    compat::AutocastGuard guard(a.device(), /*bf16=*/true);
    EXPECT_EQ(torch::matmul(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, a).scalar_type(), torch::kFloat);
  compat::AutocastGuard off(a.device(), /*bf16=*/false);
  EXPECT_EQ(torch::matmul(a, a).scalar_type(), torch::kFloat);
}

std::string Join(const std::vector<double>& v) {
  std::string out;
  for (double x : v) out += std::to_string(x).substr(0, 6) + " ";
  return out;
}

TEST_F(GpuTest, Bf16ComputeTracksFp32) {
  for (const char* family : {"gpt2", "llama"}) {
    auto fp32 = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), 20, "fp32", family);
    auto bf16 = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), 20, "bf16", family);
    SCOPED_TRACE(std::string(family) + "\n fp32: " + Join(fp32) + "\n bf16: " + Join(bf16));
    // Same weights at step 1: only the compute precision differs, so the losses are close but not equal.
    EXPECT_NEAR(bf16[0], fp32[0], 0.01 * fp32[0]);
    EXPECT_NE(bf16[0], fp32[0]) << "bf16 autocast had no effect";
    // Trajectories drift apart slowly; both must learn.
    for (size_t i = 0; i < fp32.size(); ++i) EXPECT_NEAR(bf16[i], fp32[i], 0.1 * fp32[i]) << "step " << i + 1;
    EXPECT_LT(bf16.back(), bf16.front() * 0.8);
  }
}

TEST_F(GpuTest, ZeroShardedUpdateOnACudaWorkerMatchesStageZero) {
  auto plain = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), 8);
  auto sharded = Train(dir_ + "/corpus.txt", torch::Device(torch::kCUDA, 0), 8, "fp32", "gpt2", /*zero=*/2);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(sharded[i], plain[i], 1e-4 * plain[i]) << "step " << i + 1;
}

TEST_F(GpuTest, ExecutorReportsAllocatorStats) {
  auto executor = CreateTorchExecutor({"cuda:0"});
  ASSERT_TRUE(executor.ok()) << executor.status().ToString();
  // A worker heartbeats before it has run anything: stats must be readable from the start.
  auto fresh = (*executor)->ReadMemory();
  EXPECT_EQ(fresh.device, "cuda:0");
  EXPECT_GT(fresh.total_bytes, 10ull << 30);
  auto big = torch::empty({256, 1024, 1024}, torch::TensorOptions().device(torch::kCUDA, 0));  // 1 GiB
  // A GPU worker reports what its sampler thread read last (every 200 ms, so heartbeats never
  // wait on the driver): the allocation shows within a few samples.
  auto m = (*executor)->ReadMemory();
  for (int i = 0; i < 50 && m.allocated_bytes < (1ull << 30); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = (*executor)->ReadMemory();
  }
  EXPECT_EQ(m.device, "cuda:0");
  EXPECT_GT(m.total_bytes, 10ull << 30);
  EXPECT_GE(m.allocated_bytes, 1ull << 30);
  EXPECT_GE(m.peak_bytes, m.allocated_bytes);
  EXPECT_LT(m.free_bytes, m.total_bytes);
}

// LinearIntoGradient on a bf16 working weight: the weight gradient arrives in fp32 from the matmul
// itself (no bf16 rounding on the way), written on the first use and added on the second; dx
// equals torch::linear's.
TEST_F(GpuTest, ABaseDrawnAndQuantizedOnTheGpuIsTheHostsBitForBit) {
  // What a QLoRA run from the seed does on a GPU (trainer.cc): ParameterDraw on the device, then
  // QuantizeNf4Weight there - the same weights and the same NF4 bytes as the host's draw and
  // quant::QuantizeNf4, so a GPU run starts from a CPU run's base.
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 2, m.ffn = 192, m.vocab = 256, m.sequence = 32;
  ASSERT_TRUE(ValidateModelSpec(m, "").ok());
  const ParameterDraw draw(m, 5);
  const torch::Device gpu(torch::kCUDA, 0);
  for (const model::Parameter& p : {model::Parameter{"layers.0.mlp.up_proj.weight", {192, 64}},
                                    model::Parameter{"layers.1.mlp.down_proj.weight", {1024, 4099}},
                                    model::Parameter{"layers.0.input_layernorm.weight", {64}}}) {
    SCOPED_TRACE(p.name);
    const torch::Tensor host = draw(p), device = draw(p, gpu);
    ASSERT_TRUE(device.is_cuda());
    EXPECT_TRUE(torch::equal(device.cpu(), host));
    if (p.shape.size() != 2) continue;
    auto on_host = QuantizeNf4Weight(host, torch::kCPU, torch::kFloat);
    auto on_gpu = QuantizeNf4Weight(device, gpu, torch::kFloat);
    ASSERT_TRUE(on_host.ok() && on_gpu.ok());
    EXPECT_TRUE(torch::equal(on_gpu->codes.cpu(), on_host->codes));
    EXPECT_TRUE(torch::equal(on_gpu->absmax_codes.cpu(), on_host->absmax_codes));
    EXPECT_TRUE(torch::equal(on_gpu->nested_absmax.cpu(), on_host->nested_absmax));
    EXPECT_EQ(on_gpu->offset, on_host->offset);
    EXPECT_TRUE(torch::equal(DequantizeNf4Weight(*on_gpu).cpu(), DequantizeNf4Weight(*on_host)));
  }
}

TEST(GpuLinearTest, LinearIntoGradientWritesTheBf16MatmulsGradientInFp32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  torch::manual_seed(5);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto x = torch::randn({4, 64, 512}, bf16), dy1 = torch::randn({4, 64, 256}, bf16),
             dy2 = torch::randn({4, 64, 256}, bf16);
  const auto param = torch::randn({256, 512}, bf16.dtype(torch::kFloat)).requires_grad_(true);
  const auto working = param.detach().to(torch::kBFloat16);
  BufferSink sink(torch::full({256, 512}, std::nan(""), torch::TensorOptions().device(torch::kCUDA)));
  const auto x_ours = x.clone().requires_grad_(true);
  const auto y1 = LinearIntoGradient(x_ours, param, working, torch::Tensor(), &sink);
  const auto y2 = LinearIntoGradient(x_ours, param, working, torch::Tensor(), &sink);
  ((y1.to(torch::kFloat) * dy1.to(torch::kFloat)).sum() + (y2.to(torch::kFloat) * dy2.to(torch::kFloat)).sum())
      .backward();
  const auto exact = dy1.to(torch::kFloat).reshape({-1, 256}).t().mm(x.to(torch::kFloat).reshape({-1, 512})) +
                     dy2.to(torch::kFloat).reshape({-1, 256}).t().mm(x.to(torch::kFloat).reshape({-1, 512}));
  const double error = ((sink.buffer - exact).abs().max() / exact.abs().max()).item<double>();
  std::printf("LinearIntoGradient bf16 -> fp32 weight gradient: largest relative error %.3g (fused matmul: %d)\n",
              error, STRATA_TORCH_HAS_MATMUL_OUT_DTYPE);
  EXPECT_EQ(sink.received, 2);
  EXPECT_LT(error, STRATA_TORCH_HAS_MATMUL_OUT_DTYPE ? 1e-5 : 1e-2);
  const auto x_ref = x.clone().requires_grad_(true);
  const auto r = torch::linear(x_ref, working);
  ((r.to(torch::kFloat) * dy1.to(torch::kFloat)).sum() + (r.to(torch::kFloat) * dy2.to(torch::kFloat)).sum())
      .backward();
  EXPECT_LT(((x_ours.grad().to(torch::kFloat) - x_ref.grad().to(torch::kFloat)).abs().max() /
             x_ref.grad().to(torch::kFloat).abs().max())
                .item<double>(),
            1e-2);
}

}  // namespace
}  // namespace strata::worker
