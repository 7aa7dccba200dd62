// Trainer tests in one process: real LibTorch, real RocksDB store, real ZeroMQ communicator
// (ranks as threads over ipc sockets).
#include "worker/trainer.h"

#include "worker/hf_format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <thread>

namespace strata::worker {
namespace {

class NullReporter : public TaskReporter {
 public:
  void ReportStep(int64_t, double, double) override {}
  void ReportCheckpoint(int64_t, const std::vector<storage::CheckpointTensorInfo>&) override {}
  void ReportChunk(const storage::ActivationChunkInfo&, bool) override {}
  void ReportNotice(const std::string&, const std::string&) override {}
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char tmpl[] = "/tmp/strata-trainer-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream out(dir_ + "/corpus.txt");
    for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog. pack my box with five dozen jugs. ";
    out.close();
    spec_.name = "t";
    spec_.model = {"gpt2", 2, 32, 4, 256, 32, 4, 128, 10000.0, 1e-5};
    spec_.data.path = dir_ + "/corpus.txt";
    spec_.train.global_batch = 4;
    spec_.train.lr = 3e-3;
    spec_.train.weight_decay = 0.1;
  }

  // Trains `steps` steps on `world` ranks (threads); returns every rank's losses.
  std::vector<std::vector<double>> Train(uint32_t world, int steps, std::vector<int64_t>* state_elements = nullptr,
                                         std::vector<std::vector<float>>* final_params = nullptr) {
    std::vector<std::string> addresses;
    for (uint32_t r = 0; r < world; ++r) addresses.push_back("ipc://" + dir_ + "/w" + std::to_string(world) + "r" + std::to_string(r));
    std::vector<std::vector<double>> losses(world);
    zmq::context_t zmq_context;
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto comm = CreateZmqCommunicator(zmq_context, {r, addresses, 5, 30000});
        ASSERT_TRUE(comm.ok());
        TaskContext context;
        context.run_id = "run";
        context.spec = spec_;
        context.rank = r;
        context.world_size = world;
        context.communicator = comm->get();
        auto data = TokenData::Load(spec_.data, 256);
        ASSERT_TRUE(data.ok());
        Trainer trainer(context, std::move(data).value(), torch::kCPU);
        for (int s = 0; s < steps; ++s) {
          auto loss = trainer.Step();
          ASSERT_TRUE(loss.ok()) << loss.status().ToString();
          losses[r].push_back(*loss);
        }
        if (state_elements) (*state_elements)[r] = trainer.optimizer_state_elements();
        if (final_params && r == 0) {
          for (auto& [name, p] : trainer.parameters()) {
            auto flat = p.detach().reshape({-1}).contiguous();
            final_params->emplace_back(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    return losses;
  }

  std::string dir_;
  RunSpec spec_;
};

TEST_F(TrainerTest, LossFallsOnRealText) {
  auto losses = Train(1, 40)[0];
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);  // starts near uniform over bytes
  EXPECT_LT(losses.back(), losses.front() * 0.6);
}

TEST_F(TrainerTest, DataParallelMatchesOneWorkerStepForStep) {
  const int steps = 8;
  auto one = Train(1, steps)[0];
  auto two = Train(2, steps);
  ASSERT_EQ(two[0].size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(two[0][s], one[s], 1e-5 * std::abs(one[s])) << "step " << s + 1;
    EXPECT_EQ(two[0][s], two[1][s]) << "ranks disagree at step " << s + 1;
  }
}

TEST_F(TrainerTest, MicroBatchesAccumulateToTheSameSteps) {
  spec_.train.global_batch = 8;
  auto whole = Train(1, 6)[0];
  spec_.parallel.micro_batch = 2;  // 4 micro-batches per step
  auto accumulated = Train(1, 6)[0];
  spec_.parallel.micro_batch = 1;  // and with 2 ranks: 4 micro-batches of 1 on each
  auto two_ranks = Train(2, 6)[0];
  for (int s = 0; s < 6; ++s) {
    EXPECT_NEAR(accumulated[s], whole[s], 1e-5 * whole[s]) << "step " << s + 1;
    EXPECT_NEAR(two_ranks[s], whole[s], 1e-5 * whole[s]) << "step " << s + 1;
  }
}

TEST_F(TrainerTest, ZeroStagesShardOptimizerStateAndTrainTheSameModel) {
  spec_.train.grad_clip = 0.5;  // exercises the sharded global norm
  std::vector<std::vector<float>> reference_params;
  auto reference = Train(2, 6, nullptr, &reference_params)[0];
  int64_t total = 0;
  for (auto& p : reference_params) total += static_cast<int64_t>(p.size());
  for (int64_t stage : {1, 2}) {
    spec_.parallel.zero = stage;
    std::vector<int64_t> state(2, 0);
    std::vector<std::vector<float>> params;
    auto losses = Train(2, 6, &state, &params)[0];
    for (int s = 0; s < 6; ++s) EXPECT_NEAR(losses[s], reference[s], 1e-5 * reference[s]) << "zero " << stage << " step " << s + 1;
    // Each rank holds half of the AdamW moments.
    EXPECT_EQ(state[0] + state[1], total) << "zero " << stage;
    EXPECT_LE(std::abs(state[0] - state[1]), 1) << "zero " << stage;
    double max_diff = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t j = 0; j < params[i].size(); ++j) max_diff = std::max(max_diff, double(std::abs(params[i][j] - reference_params[i][j])));
    }
    EXPECT_LT(max_diff, 1e-5) << "zero " << stage << ": parameters drifted from stage 0";
  }
}

TEST_F(TrainerTest, CosineScheduleChangesTheTrajectory) {
  auto constant = Train(1, 5)[0];
  spec_.train.lr_schedule = "cosine";
  spec_.train.warmup_steps = 3;
  spec_.train.steps = 5;
  auto scheduled = Train(1, 5)[0];
  EXPECT_DOUBLE_EQ(scheduled[0], constant[0]);  // same weights before the first update
  EXPECT_NE(scheduled[1], constant[1]);         // a third of the lr in the first update
}

TEST_F(TrainerTest, InitFromAHuggingFaceDirectoryStartsFromThoseWeights) {
  spec_.train.seed = 21;
  auto reference = Train(1, 3)[0];
  // The same initial weights, exported, then loaded by a trainer seeded differently.
  torch::manual_seed(21);
  auto model = CreateCausalLm(spec_.model);
  ASSERT_TRUE(ExportHuggingFace(*model, spec_.model, dir_ + "/init").ok());
  spec_.train.seed = 999;
  auto other_seed = Train(1, 1)[0];
  EXPECT_NE(other_seed[0], reference[0]);
  spec_.model.init_from = dir_ + "/init";
  // Same data order as the reference needs the same data seed: only the weights come from disk.
  spec_.train.seed = 21;
  auto loaded = Train(1, 3)[0];
  for (int s = 0; s < 3; ++s) EXPECT_EQ(loaded[s], reference[s]) << "step " << s + 1;
}

TEST_F(TrainerTest, LlamaWithGroupedQueryAttentionLearnsAndMatchesAcrossRanks) {
  spec_.model.family = "llama";
  spec_.model.kv_heads = 2;
  spec_.model.ffn = 96;
  spec_.model.norm_eps = 1e-6;
  auto one = Train(1, 30)[0];
  EXPECT_NEAR(one.front(), std::log(256.0), 0.3);
  EXPECT_LT(one.back(), one.front() * 0.6);
  auto two = Train(2, 6);
  for (int s = 0; s < 6; ++s) EXPECT_NEAR(two[0][s], one[s], 1e-5 * one[s]) << "step " << s + 1;
}

TEST_F(TrainerTest, LlamaParametersCarryHuggingFaceNamesAndShapes) {
  spec_.model = {"llama", 2, 64, 8, 256, 32, 2, 160, 10000.0, 1e-6};
  torch::manual_seed(0);
  auto model = CreateCausalLm(spec_.model);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& p : model->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  EXPECT_EQ(shapes.size(), 3u + 2u * 9u);  // embed, norm, lm_head + per layer 2 norms, 4 attention, 3 MLP
  EXPECT_EQ(shapes["embed_tokens.weight"], (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(shapes["layers.1.self_attn.q_proj.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["layers.1.self_attn.k_proj.weight"], (std::vector<int64_t>{16, 64}));  // 2 kv heads x 8
  EXPECT_EQ(shapes["layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{160, 64}));
  EXPECT_EQ(shapes["layers.0.mlp.down_proj.weight"], (std::vector<int64_t>{64, 160}));
  EXPECT_EQ(shapes["layers.0.input_layernorm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(shapes["norm.weight"], (std::vector<int64_t>{64}));
}

TEST_F(TrainerTest, LlamaAttentionIsCausal) {
  spec_.model = {"llama", 1, 32, 4, 256, 16, 2, 64, 10000.0, 1e-6};
  torch::manual_seed(1);
  auto model = CreateCausalLm(spec_.model);
  torch::NoGradGuard no_grad;
  auto a = torch::randint(0, 256, {1, 16}, torch::kLong);
  auto b = a.clone();
  b.index_put_({0, 10}, (a.index({0, 10}).item<int64_t>() + 1) % 256);  // change token 10 only
  auto la = model->Logits(a), lb = model->Logits(b);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 10), lb.narrow(1, 0, 10)));  // the past is untouched
  EXPECT_FALSE(torch::allclose(la.narrow(1, 10, 6), lb.narrow(1, 10, 6)));
}

TEST_F(TrainerTest, CheckpointShardReadsBackBitIdenticalToTheLiveParameters) {
  auto store = storage::ShardStore::Open(dir_ + "/store");
  ASSERT_TRUE(store.ok());
  zmq::context_t zmq_context;
  auto comm = CreateZmqCommunicator(zmq_context, {0, {"ipc://" + dir_ + "/solo"}, 1, 1000});
  ASSERT_TRUE(comm.ok());
  TaskContext context;
  context.run_id = "ckpt-run";
  context.spec = spec_;
  context.communicator = comm->get();
  context.store = store->get();
  auto data = TokenData::Load(spec_.data, 256);
  ASSERT_TRUE(data.ok());
  Trainer trainer(context, std::move(data).value(), torch::kCPU);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(trainer.Step().ok());
  auto saved = trainer.SaveCheckpointShard();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->size(), trainer.parameters().size() * 3);  // param + two AdamW moments each
  for (const auto& [name, p] : trainer.parameters()) {
    auto stored = (*store)->ReadCheckpointTensor("ckpt-run", 3, "param/" + name);
    ASSERT_TRUE(stored.ok()) << name << ": " << stored.status().ToString();
    auto live = p.detach().contiguous();
    ASSERT_EQ(stored->bytes.size(), static_cast<size_t>(live.numel() * live.element_size())) << name;
    EXPECT_EQ(0, std::memcmp(stored->bytes.data(), live.data_ptr(), stored->bytes.size())) << name;
    EXPECT_EQ(stored->shape, std::vector<int64_t>(live.sizes().begin(), live.sizes().end())) << name;
  }
}

}  // namespace
}  // namespace strata::worker
