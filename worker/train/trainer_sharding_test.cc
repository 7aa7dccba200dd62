// Trainer tests of the sharded meshes: every family under every mesh, ZeRO stages and their
// layers kept gathered, ZeRO-3's embedding lookup, the offloaded optimizer and host-streamed
// parameters, tensor and sequence parallelism, and resumes across meshes (trainer_test_fixture.h).
#include "worker/train/trainer_test_fixture.h"

namespace strata::worker {
namespace {

// Every mesh trains the single worker's model: same seed, same global batch, same losses within
// 1e-5 relative over 10 steps (fp32), and every rank reports the same loss.
struct MeshCase {
  int64_t dp, pp, tp, zero;
  bool recompute;
  std::string Name() const {
    return "dp" + std::to_string(dp) + "_pp" + std::to_string(pp) + "_tp" + std::to_string(tp) + "_zero" +
           std::to_string(zero) + (recompute ? "_recompute" : "");
  }
};

class MeshTest : public TrainerTest, public ::testing::WithParamInterface<std::string> {};
// The resume matrix: every checkpoint mesh under every other, for families of each layout kind.
class MeshResumeTest : public MeshTest {};

TEST_P(MeshTest, EveryMeshGivesTheSingleWorkerLosses) {
  spec_.model = TinyModel(GetParam());
  spec_.train.global_batch = 8;
  spec_.train.grad_clip = 0.5;  // exercises the global norm across stages, tp ranks and shards
  spec_.parallel.micro_batch = 2;
  const int steps = 10;
  auto reference = Train(steps)[0];
  const std::vector<MeshCase> cases = {
      {2, 1, 1, 0, false}, {2, 1, 1, 1, false}, {2, 1, 1, 2, false}, {2, 1, 1, 3, false}, {1, 2, 1, 0, false},
      {1, 1, 2, 0, false}, {1, 2, 2, 0, false}, {2, 2, 2, 0, false}, {1, 2, 1, 0, true},  {1, 1, 2, 0, true},
      {2, 2, 2, 1, true},  {2, 2, 2, 2, false}, {2, 2, 2, 3, false}, {2, 1, 2, 3, true},
  };
  for (const MeshCase& c : cases) {
    SetMesh(c.dp, c.pp, c.tp, c.zero, c.recompute);
    auto losses = Train(steps);
    for (size_t r = 0; r < losses.size(); ++r) {
      ASSERT_EQ(losses[r].size(), static_cast<size_t>(steps)) << c.Name();
      for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(losses[r][s], reference[s], 1e-5 * reference[s]) << c.Name() << " rank " << r << " step " << s + 1;
        EXPECT_EQ(losses[r][s], losses[0][s]) << c.Name() << ": ranks disagree at step " << s + 1;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MeshTest,
                         ::testing::Values("gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "gpt_neox"));
INSTANTIATE_TEST_SUITE_P(Families, MeshResumeTest, ::testing::Values("gpt2", "llama", "gpt_neox"));

// ZeRO-3 layers kept gathered for their backward (parallel.keep_gathered) train the same model
// bit for bit, and each kept layer saves exactly one gather per micro-batch: on dp=2, and on a
// pipeline whose stages keep all of theirs (more than a stage has = all of them).
TEST_F(TrainerTest, LayersKeptGatheredTrainTheSameModelWithOneGatherLessEach) {
  spec_.model = TinyModel("llama", 4);
  spec_.train.global_batch = 8;
  spec_.parallel.micro_batch = 2;  // 2 micro-batches a step on each of dp = 2
  const int steps = 3;
  struct Case {
    int64_t pp, keep, saved_first_stage, saved_last_stage;  // gathers saved per micro-batch
  };
  // A stage's last call keeps its gather anyway: on the first of two stages, its last layer.
  for (const Case& c : {Case{1, 1, 1, 1}, Case{1, 4, 4, 4}, Case{2, 9, 1, 2}, Case{2, 1, 0, 1}}) {
    SetMesh(2, c.pp, 1, 3);
    spec_.parallel.keep_gathered = 0;
    std::vector<int64_t> gathers_again(static_cast<size_t>(spec_.parallel.workers()));
    auto again = Train(steps, [&](uint32_t r, Trainer& t) { gathers_again[r] = t.unit_gathers(); });
    spec_.parallel.keep_gathered = c.keep;
    std::vector<int64_t> gathers_kept(gathers_again.size());
    auto kept = Train(steps, [&](uint32_t r, Trainer& t) { gathers_kept[r] = t.unit_gathers(); });
    const std::string name = "pp " + std::to_string(c.pp) + ", keep_gathered " + std::to_string(c.keep);
    for (size_t r = 0; r < kept.size(); ++r) {
      ASSERT_EQ(kept[r].size(), static_cast<size_t>(steps)) << name;
      for (int s = 0; s < steps; ++s)
        EXPECT_EQ(kept[r][s], again[r][s]) << name << ", rank " << r << ", step " << s + 1;
      const int64_t saved = r < 2 ? c.saved_first_stage : c.saved_last_stage;  // ranks 0, 1: stage 0 (dp = 2)
      EXPECT_EQ(gathers_again[r] - gathers_kept[r], saved * 2 * steps) << name << ", rank " << r;
    }
  }
  spec_.parallel.keep_gathered = 0;
}

// ZeRO-3's embedding call looks up the rows each rank's shard holds (zero3_lookup.cc) in
// place of gathering its tables, where that moves fewer bytes: the model trains as under ZeRO-2
// (whole parameters) within fp32 rounding - losses, and the gradient norm that clipping feeds back
// into every update - the first step's loss is bit for bit ZeRO-2's (the rows are the table's
// values), and no table is gathered for the call. A vocabulary of 203 puts a shard edge inside
// row 101 ('e', read on every step) at dp = 2 and dp = 4. GPT-2 and Gemma tie the table to the
// head, whose gradient reaches the same shard first. With 128 tokens a rank GPT-2's two tables
// are cheaper gathered (LooksUpShards), and are.
TEST_F(TrainerTest, Zero3LooksUpItsEmbeddingRowsWithoutGatheringTheTables) {
  spec_.train.global_batch = 8;
  spec_.train.grad_clip = 0.05;
  const int steps = 5;
  struct Case {
    const char* family;
    int dp, micro_batch;
    bool looked_up;
  };
  for (const Case& c :
       {Case{"gpt2", 2, 1, true}, Case{"llama", 2, 2, true}, Case{"gemma", 4, 0, true}, Case{"gpt2", 2, 0, false}}) {
    const std::string name =
        std::string(c.family) + " dp " + std::to_string(c.dp) + " micro-batch " + std::to_string(c.micro_batch);
    spec_.model = TinyModel(c.family, 2);
    spec_.model.vocab = 203;
    spec_.parallel.micro_batch = c.micro_batch;
    SetMesh(c.dp, 1, 1, /*zero=*/2);
    std::vector<double> whole_norm(static_cast<size_t>(c.dp)), norm(whole_norm.size());
    const auto whole = Train(steps, [&](uint32_t r, Trainer& t) { whole_norm[r] = t.last_grad_norm(); });
    SetMesh(c.dp, 1, 1, /*zero=*/3);
    spec_.parallel.keep_gathered = 0;
    std::vector<int64_t> gathers(whole_norm.size());
    const auto sharded = Train(steps, [&](uint32_t r, Trainer& t) {
      gathers[r] = t.unit_gathers();
      norm[r] = t.last_grad_norm();
    });
    // Per micro-batch: each block forward and again backward, and the head's units forward only
    // (the last call keeps them): with a tied table the final norm and the table, else one unit.
    // Gathered, each embedding table too, forward and backward.
    const int64_t micro_batches = c.micro_batch == 0 ? 1 : spec_.train.global_batch / c.dp / c.micro_batch;
    const int64_t head_units = spec_.model.tied() ? 2 : 1, tables = spec_.model.family == Family::kGpt2 ? 2 : 1;
    const int64_t per_micro_batch = 2 * spec_.model.layers + head_units + (c.looked_up ? 0 : 2 * tables);
    for (size_t r = 0; r < sharded.size(); ++r) {
      ASSERT_EQ(sharded[r].size(), static_cast<size_t>(steps)) << name;
      EXPECT_EQ(sharded[r][0], whole[r][0]) << name << ", rank " << r << ": the first forward";
      for (int s = 1; s < steps; ++s)
        EXPECT_NEAR(sharded[r][s], whole[r][s], 1e-5 * whole[r][s]) << name << ", step " << s + 1;
      EXPECT_GT(whole_norm[r], spec_.train.grad_clip) << name << ": clipping is on";
      EXPECT_NEAR(norm[r], whole_norm[r], 1e-5 * whole_norm[r])
          << name << ", rank " << r << ": the last step's gradient norm";
      EXPECT_EQ(gathers[r], steps * micro_batches * per_micro_batch) << name << ", rank " << r;
    }
  }
}

TEST_F(TrainerTest, ZeroStagesShardStateAndTrainTheSameModel) {
  SetMesh(2, 1, 1);
  std::vector<std::vector<float>> reference_params;
  int64_t total = 0;
  Train(6, [&](uint32_t r, Trainer& t) {
    if (r != 0) return;
    for (auto& [name, p] : t.parameters()) {
      auto flat = p.reshape({-1}).contiguous();
      reference_params.emplace_back(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
      total += flat.numel();
    }
  });
  for (int64_t stage : {1, 2, 3}) {
    SetMesh(2, 1, 1, stage);
    std::vector<int64_t> state(2, 0);
    double max_diff = 0;
    Train(6, [&](uint32_t r, Trainer& t) {
      state[r] = t.optimizer_state_elements();
      if (r != 0 || stage == 3) return;  // ZeRO-3 holds no whole parameter
      size_t i = 0;
      for (auto& [name, p] : t.parameters()) {
        auto flat = p.reshape({-1}).contiguous();
        for (int64_t j = 0; j < flat.numel(); ++j) {
          max_diff = std::max(max_diff, double(std::abs(flat.data_ptr<float>()[j] - reference_params[i][j])));
        }
        ++i;
      }
    });
    // Each rank holds half of the AdamW moments.
    EXPECT_EQ(state[0] + state[1], total) << "zero " << stage;
    EXPECT_LE(std::abs(state[0] - state[1]), 8) << "zero " << stage;
    EXPECT_LT(max_diff, 1e-5) << "zero " << stage << ": parameters drifted from stage 0";
  }
}

// Every rank's `steps` losses of `got` equal `want`'s bit for bit, and the run learned.
void ExpectSameLossesBitForBit(const std::vector<std::vector<double>>& got,
                               const std::vector<std::vector<double>>& want, size_t steps) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].size(), steps);
    for (size_t s = 0; s < steps; ++s) EXPECT_EQ(got[r][s], want[r][s]) << "rank " << r << " step " << s + 1;
  }
  EXPECT_LT(got[0].back(), got[0].front());
}

// parallel.offload = "optimizer": m and v in host memory, each unit's gradient and parameters
// copied there and back, the host AdamW (kernels::AdamWHost, threaded) doing the update - the
// on-device optimizer's arithmetic, so the losses are the same bit for bit on every ZeRO stage
// and with 8-bit moments; a checkpoint written with the state on the host resumes with it there
// and on the device alike.
TEST_F(TrainerTest, OffloadedOptimizerGivesTheOnDeviceLossesBitForBit) {
  spec_.train.global_batch = 8;
  spec_.worker.threads = 3;  // the host AdamW splits larger units over threads
  // ZeRO-3 with and without recompute: the gathered path and the streamed one (stage_model.h).
  for (const auto& [dp, pp, zero, recompute, optimizer] :
       {std::tuple{1, 1, 0, false, Optimizer::kAdamW}, std::tuple{2, 1, 1, false, Optimizer::kAdamW},
        std::tuple{2, 1, 2, false, Optimizer::kAdamW}, std::tuple{2, 1, 3, true, Optimizer::kAdamW},
        std::tuple{2, 1, 3, false, Optimizer::kAdamW}, std::tuple{1, 2, 0, false, Optimizer::kAdamW},
        std::tuple{2, 1, 1, false, Optimizer::kAdamW8bit}}) {
    SCOPED_TRACE(std::string(Name(optimizer)) + " dp " + std::to_string(dp) + " pp " + std::to_string(pp) + " zero " +
                 std::to_string(zero) + (recompute ? " recompute" : ""));
    SetMesh(dp, pp, 1, zero, recompute);
    spec_.train.optimizer = optimizer;
    spec_.parallel.offload = Offload::kNone;
    const auto on_device = Train(8);
    spec_.parallel.offload = Offload::kOptimizer;
    const auto offloaded = Train(8);
    ExpectSameLossesBitForBit(offloaded, on_device, 8);
  }
  // Tensor parallel with sequence parallelism: the norms' gradients are summed over the tp ranks
  // in the backward - before the unit's early download (dp = 1), or before its dp sum starts
  // beside the backward (dp = 2, on the device) - or after it (dp = 2, offloaded): the same sums.
  for (const int64_t dp : {1, 2}) {
    SCOPED_TRACE("tp 2, dp " + std::to_string(dp));
    SetMesh(dp, 1, 2, 1);
    spec_.parallel.offload = Offload::kNone;
    const auto on_device = Train(8);
    spec_.parallel.offload = Offload::kOptimizer;
    const auto offloaded = Train(8);
    ExpectSameLossesBitForBit(offloaded, on_device, 8);
  }
  SetMesh(2, 1, 1, 1);
  spec_.train.optimizer = Optimizer::kAdamW;
  spec_.parallel.offload = Offload::kNone;
  const auto straight = Train(10);
  spec_.parallel.offload = Offload::kOptimizer;
  resume_ = CheckpointAt(6, "offload-");
  for (const Offload where : {Offload::kOptimizer, Offload::kNone}) {
    spec_.parallel.offload = where;
    const auto resumed = Train(10);
    ASSERT_EQ(resumed[0].size(), 4u);
    for (int s = 0; s < 4; ++s)
      EXPECT_EQ(resumed[0][s], straight[0][s + 6]) << "resumed with offload " << Name(where) << ", step " << s + 7;
  }
}

// parallel.offload = "optimizer+params": the parameters live in host memory with the optimizer
// state, every layer is uploaded as streamed ZeRO-3 gathers it, and each use's gradient is summed
// on the host in the device's order - so the losses are streamed ZeRO-3's bit for bit: one rank
// with two micro-batches (two gradients per unit to sum, GPT-2's tied embedding three), two data-
// parallel ranks, a pipeline (the tied embedding summed over stages), 8-bit moments, and clipping
// by the global norm taken on the host. A checkpoint written with the parameters on the host
// resumes with them on the device, and the other way round.
TEST_F(TrainerTest, HostStreamedParametersGiveStreamedZero3LossesBitForBit) {
  spec_.train.global_batch = 8;
  spec_.worker.threads = 3;
  spec_.train.grad_clip = 0.05;
  for (const auto& [dp, pp, micro_batch, optimizer] :
       {std::tuple{1, 1, 4, Optimizer::kAdamW}, std::tuple{2, 1, 0, Optimizer::kAdamW},
        std::tuple{1, 2, 2, Optimizer::kAdamW}, std::tuple{2, 1, 2, Optimizer::kAdamW8bit}}) {
    SCOPED_TRACE(std::string(Name(optimizer)) + " dp " + std::to_string(dp) + " pp " + std::to_string(pp) +
                 " micro-batch " + std::to_string(micro_batch));
    SetMesh(dp, pp, 1, /*zero=*/3);
    spec_.parallel.micro_batch = micro_batch;
    spec_.train.optimizer = optimizer;
    spec_.parallel.offload = Offload::kNone;
    const auto on_device = Train(8);
    spec_.parallel.offload = Offload::kOptimizerAndParams;
    const auto streamed = Train(8);
    ExpectSameLossesBitForBit(streamed, on_device, 8);
  }
  SetMesh(2, 1, 1, 3);
  spec_.parallel.micro_batch = 0;
  spec_.train.optimizer = Optimizer::kAdamW;
  spec_.parallel.offload = Offload::kNone;
  const auto straight = Train(10);
  spec_.parallel.offload = Offload::kOptimizerAndParams;
  resume_ = CheckpointAt(6, "streamed-");
  for (const Offload where : {Offload::kOptimizerAndParams, Offload::kNone}) {
    spec_.parallel.offload = where;
    const auto resumed = Train(10);
    ASSERT_EQ(resumed[0].size(), 4u);
    for (int s = 0; s < 4; ++s)
      EXPECT_EQ(resumed[0][s], straight[0][s + 6]) << "resumed with offload " << Name(where) << ", step " << s + 7;
  }
  spec_.parallel.offload = Offload::kNone;
  resume_ = CheckpointAt(6, "streamed-from-device-");
  spec_.parallel.offload = Offload::kOptimizerAndParams;
  const auto onto_host = Train(10);
  ASSERT_EQ(onto_host[0].size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(onto_host[0][s], straight[0][s + 6]) << "resumed onto the host, step " << s + 7;
}

// Data parallelism is gradient accumulation spread over ranks: dp = 2 with 4 rows a rank and
// dp = 1 with two micro-batches of 4 add the same halves of the same per-micro-batch gradients,
// so their losses are equal bit for bit (GPT-2's tied embedding included), for every ZeRO stage.
// Runs that shrink or grow their dp (a lost worker, taken back) rely on it.
// The dp ranks' sums start in the backward, a unit at a time (optimizer.h): here the blocks, the
// position table and the final norm - every unit but the tied embedding, whose two uses keep it
// out of the gradient sink.
TEST_F(TrainerTest, DataParallelEqualsGradientAccumulationBitForBit) {
  spec_.train.global_batch = 8;
  spec_.parallel.micro_batch = 4;
  const auto one = Train(30)[0];
  for (int64_t zero : {0, 1, 2}) {
    SetMesh(2, 1, 1, zero);
    std::vector<int64_t> in_backward(2, -1);
    const auto two = Train(30, [&](uint32_t r, Trainer& t) { in_backward[r] = t.units_reduced_in_backward(); });
    for (int s = 0; s < 30; ++s) EXPECT_EQ(two[0][s], one[s]) << "zero " << zero << " step " << s + 1;
    for (int64_t n : in_backward)
      EXPECT_EQ(n, spec_.model.layers + 2) << "zero " << zero << ": units reduced in the backward";
  }
}

// Both families: 6 steps under pp=2, checkpoint pieces into two stores; then resume under dp=2
// ZeRO-3 and under tp=2 (with recompute): steps 7-10 give the uninterrupted run's losses.
TEST_P(MeshResumeTest, ResumeUnderAnotherMeshContinuesTheSameRun) {
  spec_.model = TinyModel(GetParam());
  spec_.train.global_batch = 8;
  spec_.parallel.micro_batch = 2;
  auto straight = Train(10)[0];
  SetMesh(1, 2, 1);
  resume_ = CheckpointAt(6, "resume-store");
  for (const auto& [dp, tp, zero, recompute] : {std::tuple{2, 1, 3, false}, std::tuple{1, 2, 0, true}}) {
    SetMesh(dp, 1, tp, zero, recompute);
    auto resumed = Train(10);
    for (auto& losses : resumed) {
      ASSERT_EQ(losses.size(), 4u);
      for (int s = 0; s < 4; ++s) {
        EXPECT_NEAR(losses[s], straight[s + 6], 1e-5 * straight[s + 6])
            << "dp " << dp << " tp " << tp << " step " << s + 7;
      }
    }
  }
}

// Vocab-parallel where tp divides the vocabulary, whole where it does not (GPT-2's 50257 over 2):
// 258 rows split over tp = 2 (129 a rank) and stay whole over tp = 4. Both train the one worker's
// run, and a checkpoint of either resumes under the other (split -> whole and whole -> split).
TEST_F(TrainerTest, VocabularySplitWhereTpDividesItAndWholeWhereNot) {
  spec_.model = TinyModel("gpt2");
  spec_.model.vocab = 258;
  spec_.train.global_batch = 8;
  spec_.parallel.micro_batch = 2;
  const int steps = 8;
  auto straight = Train(steps)[0];
  for (int64_t tp : {2, 4}) {
    SetMesh(1, 1, tp);
    std::map<uint32_t, int64_t> rows;
    auto losses = Train(steps, [&](uint32_t r, Trainer& t) {
      for (auto& [name, p] : t.parameters()) {
        if (name == "wte.weight") rows[r] = p.size(0);
      }
    });
    for (uint32_t r = 0; r < static_cast<uint32_t>(tp); ++r) {
      EXPECT_EQ(rows[r], tp == 2 ? 129 : 258) << "tp " << tp << " rank " << r;
      ASSERT_EQ(losses[r].size(), static_cast<size_t>(steps));
      for (int s = 0; s < steps; ++s)
        EXPECT_NEAR(losses[r][s], straight[s], 1e-5 * straight[s]) << "tp " << tp << " step " << s + 1;
    }
  }
  for (const auto& [from, to] : {std::pair<int64_t, int64_t>{2, 4}, std::pair<int64_t, int64_t>{4, 2}}) {
    resume_ = ResumePoint{};
    SetMesh(1, 1, from);
    resume_ = CheckpointAt(5, "vocab-tp" + std::to_string(from) + "-");
    SetMesh(1, 1, to);
    auto resumed = Train(steps);
    for (auto& losses : resumed) {
      ASSERT_EQ(losses.size(), 3u) << "tp " << from << " -> " << to;
      for (int s = 0; s < 3; ++s) {
        EXPECT_NEAR(losses[s], straight[s + 5], 1e-5 * straight[s + 5])
            << "tp " << from << " -> " << to << " step " << s + 6;
      }
    }
  }
  resume_ = ResumePoint{};
}

// Sequence parallelism (stage_model.h) is on wherever tp divides model.sequence: the tp meshes of
// MeshTest run it. Here: it trains the one worker's run as the whole-sequence form does (switched
// off, and off by itself where tp does not divide the sequence), and the parameters each rank
// reads with its own tokens only - norms, the biases after a row-parallel matmul - come out of
// every step bit-identical on every rank (their gradients summed over the ranks).
TEST_F(TrainerTest, SequenceParallelTrainsTheSameRunAndKeepsReplicatedWeightsAlike) {
  // qwen3: its per-head q/k norm weights are read with each rank's heads only, so they stay alike
  // only when their gradients are summed over the ranks, with or without sequence parallelism.
  // olmo2: the norms on the sublayers' outputs, under sequence parallelism too.
  for (const std::string family : {"llama", "gpt2", "qwen3", "olmo2"}) {
    for (const int64_t sequence : {32, 31}) {
      spec_.model = TinyModel(family);
      spec_.model.sequence = sequence;
      spec_.train.global_batch = 8;
      spec_.parallel.micro_batch = 2;
      SetMesh(1, 1, 1);
      const int steps = 6;
      auto straight = Train(steps)[0];
      for (const bool on : {true, false}) {
        SetMesh(1, 1, 2);
        spec_.parallel.sequence_parallel = on;
        const std::string name =
            family + ", sequence " + std::to_string(sequence) + (on ? "" : ", sequence_parallel = false");
        EXPECT_EQ(shard::SequenceParallel(spec_, 2), on && sequence == 32) << name;
        std::map<uint32_t, std::map<std::string, torch::Tensor>> replicated;
        auto losses = Train(steps, [&](uint32_t r, Trainer& t) {
          for (auto& [param, value] : t.parameters()) {
            auto ends = [&](const std::string& suffix) {
              return param.size() >= suffix.size() &&
                     param.compare(param.size() - suffix.size(), suffix.size(), suffix) == 0;
            };
            // OLMo 2's q/k norms split with their projections' rows: each rank holds its own.
            const bool split = family == "olmo2" && (ends("q_norm.weight") || ends("k_norm.weight"));
            const bool norm =
                !split && (param.find("norm") != std::string::npos || param.find("ln_") != std::string::npos);
            const bool row_bias =
                ends("o_proj.bias") || ends("attn_proj.bias") || ends("mlp_proj.bias") || ends("down_proj.bias");
            if (norm || row_bias) replicated[r][param] = value.detach().clone();
          }
        });
        ASSERT_FALSE(replicated[0].empty()) << name;
        for (auto& [param, value] : replicated[0]) {
          ASSERT_TRUE(replicated[1].count(param)) << name << ": " << param;
          EXPECT_TRUE(torch::equal(value, replicated[1][param]))
              << name << ": " << param << " differs between the tp ranks";
        }
        for (auto& rank : losses) {
          ASSERT_EQ(rank.size(), static_cast<size_t>(steps)) << name;
          for (int s = 0; s < steps; ++s)
            EXPECT_NEAR(rank[s], straight[s], 1e-5 * straight[s]) << name << ", step " << s + 1;
        }
      }
      spec_.parallel.sequence_parallel = true;
    }
  }
}

// parallel.tp_comm_overlap (stage_model.h): f's backward sums dx over the tensor-parallel ranks
// beside the weight gradients of the matmuls that read f's output, put off until then; forward,
// f's gather runs beside the first projection's own rows and g's sum in chunks beside the next
// chunk's matmul. The same bytes as without it - losses and every parameter of every rank
// bit-identical with it off - and the overlap ran on every rank: with and without sequence
// parallelism, alone and under dp = 2 ZeRO-1 (whose sums start in the backward as the units
// complete). On CPU workers every collective runs at once, in turn; what this checks is which
// gradients are put off, that each is written once and in its order, and that the forward's row
// blocks and chunks (a wrong offset would move another rank's rows) give the whole matmul's sums.
TEST_F(TrainerTest, TensorParallelOverlapTrainsBitForBitAsWithoutIt) {
  for (const std::string family : {"llama", "gpt2"}) {
    spec_.model = TinyModel(family);
    spec_.train.global_batch = 8;
    spec_.parallel.micro_batch = 2;
    for (const bool sequence_parallel : {true, false}) {
      for (const int64_t dp : {1, 2}) {
        SetMesh(dp, 1, 2, dp == 1 ? 0 : 1);
        spec_.parallel.sequence_parallel = sequence_parallel;
        const std::string name =
            family + (sequence_parallel ? ", sequence parallel" : "") + ", dp " + std::to_string(dp);
        const int steps = 4;
        std::map<bool, std::map<uint32_t, std::map<std::string, torch::Tensor>>> params;
        std::map<bool, std::map<uint32_t, TensorParallelOverlapCounts>> counts;
        std::map<bool, std::vector<std::vector<double>>> losses;
        for (const bool overlap : {false, true}) {
          spec_.parallel.tp_comm_overlap = overlap;
          losses[overlap] = Train(steps, [&](uint32_t r, Trainer& t) {
            counts[overlap][r] = t.tp_overlap_counts();
            for (auto& [param, value] : t.parameters()) params[overlap][r][param] = value.detach().clone();
          });
        }
        EXPECT_EQ(losses[true], losses[false]) << name;
        ASSERT_EQ(params[true].size(), static_cast<size_t>(2 * dp)) << name;
        for (auto& [rank, values] : params[false]) {
          // Per step and micro-batch (8 / dp / 2 of them), each block's two f's (attention, MLP) run
          // beside at least one weight gradient each; forward, its two g's sum in two chunks each,
          // and under sequence parallelism its two f's gather beside a matmul, as its g's do backward.
          const int64_t block_passes = steps * (8 / dp / 2) * spec_.model.layers;
          EXPECT_GE(counts[true][rank].weight_gradients_deferred, 2 * block_passes) << name << ", rank " << rank;
          EXPECT_EQ(counts[true][rank].collectives_beside_matmuls, (sequence_parallel ? 8 : 4) * block_passes)
              << name << ", rank " << rank;
          EXPECT_EQ(counts[false][rank].weight_gradients_deferred, 0) << name << ", rank " << rank;
          EXPECT_EQ(counts[false][rank].collectives_beside_matmuls, 0) << name << ", rank " << rank;
          for (auto& [param, value] : values) {
            EXPECT_TRUE(torch::equal(value, params[true][rank][param])) << name << ", rank " << rank << ": " << param;
          }
        }
      }
    }
  }
  spec_.parallel.tp_comm_overlap = true;
  spec_.parallel.sequence_parallel = true;
}

// Issue #20: a checkpoint written under any mesh resumes under any other and continues the
// single worker's run (tp 2 -> 1 used to train on never-written halves of every split tensor).
// Every pair of seven meshes - one worker, dp=2 ZeRO-3, pp=2, tp=2, dp2 x tp2 ZeRO-1, dp2 x pp2 x
// tp2 ZeRO-2, dp=4 ZeRO-3 - for both families: checkpoint at step 3, resume, steps 4-5 within 1e-5.
TEST_P(MeshResumeTest, EveryCheckpointMeshResumesUnderEveryOther) {
  spec_.model = TinyModel(GetParam());
  spec_.model.layers = 4;
  spec_.train.global_batch = 8;
  spec_.parallel.micro_batch = 2;
  const auto straight = Train(5)[0];
  const std::vector<MeshCase> meshes = {{1, 1, 1, 0, false}, {2, 1, 1, 3, false}, {1, 2, 1, 0, false},
                                        {1, 1, 2, 0, false}, {2, 1, 2, 1, false}, {2, 2, 2, 2, false},
                                        {4, 1, 1, 3, false}};
  std::vector<std::pair<std::string, ResumePoint>> checkpoints;
  for (const MeshCase& written : meshes) {
    SetMesh(written.dp, written.pp, written.tp, written.zero, written.recompute);
    const std::string prefix = dir_ + "/every-" + written.Name() + "-r";
    stores_.clear();
    for (int64_t r = 0; r < spec_.parallel.workers(); ++r) {
      auto store = storage::ShardStore::Open(prefix + std::to_string(r));
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      stores_.push_back(std::move(store).value());
    }
    ResumePoint checkpoint{"run", 3, {}};
    checkpoint.shards.resize(static_cast<size_t>(spec_.parallel.workers()));
    Train(3, [&](uint32_t r, Trainer& t) {
      auto saved = t.SaveCheckpointShard();
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
      checkpoint.shards[r].store_path = prefix + std::to_string(r);
      for (auto& info : saved->tensors) checkpoint.shards[r].tensors.push_back(info.name);
    });
    checkpoints.emplace_back(written.Name(), checkpoint);
  }
  stores_.clear();  // the resumed ranks open them read-only
  for (const auto& [written, checkpoint] : checkpoints) {
    for (const MeshCase& resumed : meshes) {
      SetMesh(resumed.dp, resumed.pp, resumed.tp, resumed.zero, resumed.recompute);
      resume_ = checkpoint;
      auto losses = Train(5);
      for (auto& rank : losses) {
        ASSERT_EQ(rank.size(), 2u) << written << " -> " << resumed.Name();
        for (int s = 0; s < 2; ++s) {
          EXPECT_NEAR(rank[s], straight[s + 3], 1e-5 * straight[s + 3])
              << "written under " << written << ", resumed under " << resumed.Name() << ", step " << s + 4;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::worker
