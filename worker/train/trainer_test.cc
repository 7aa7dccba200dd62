// Trainer tests in one process: real LibTorch, real RocksDB store, real ZeroMQ communicator
// (ranks as threads over ipc sockets; trainer_test_fixture.h). The sharded meshes' tests are in
// trainer_sharding_test.cc.
#include "worker/train/trainer_test_fixture.h"

namespace strata::worker {
namespace {

TEST_F(TrainerTest, LossFallsOnRealText) {
  auto losses = Train(40)[0];
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);  // starts near uniform over bytes
  EXPECT_LT(losses.back(), losses.front() * 0.6);
}

TEST_F(TrainerTest, MicroBatchesAccumulateToTheSameSteps) {
  spec_.train.global_batch = 8;
  auto whole = Train(6)[0];
  spec_.parallel.micro_batch = 2;  // 4 micro-batches per step
  auto accumulated = Train(6)[0];
  spec_.parallel.micro_batch = 1;  // and with 2 ranks: 4 micro-batches of 1 on each
  SetMesh(2, 1, 1);
  auto two_ranks = Train(6)[0];
  for (int s = 0; s < 6; ++s) {
    EXPECT_NEAR(accumulated[s], whole[s], 1e-5 * whole[s]) << "step " << s + 1;
    EXPECT_NEAR(two_ranks[s], whole[s], 1e-5 * whole[s]) << "step " << s + 1;
  }
}

// train.optimizer = "adamw8bit": the 8-bit moments track fp32 AdamW's run, and a checkpoint
// (which stores the moments as their fp32 values) resumes with exactly the same 8-bit state:
// under the mesh that wrote it the losses continue bit for bit. Under other data-parallel and
// pipeline meshes the quantization blocks start from other shard boundaries, so the moments are
// requantized, and the losses stay within 1e-5.
TEST_F(TrainerTest, EightBitAdamWTracksAdamWAndResumesItsStateExactly) {
  spec_.train.global_batch = 8;
  const auto fp32 = Train(10)[0];
  spec_.train.optimizer = Optimizer::kAdamW8bit;
  SetMesh(2, 1, 1, /*zero=*/1);
  const auto straight = Train(10);
  for (int s = 0; s < 10; ++s) {
    EXPECT_NEAR(straight[0][s], fp32[s], 2e-2 * fp32[s]) << "step " << s + 1;
    EXPECT_EQ(straight[1][s], straight[0][s]) << "step " << s + 1;
  }
  EXPECT_LT(straight[0].back(), straight[0].front() * 0.9);
  resume_ = CheckpointAt(6, "store8-");
  auto same = Train(10);
  ASSERT_EQ(same[0].size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(same[0][s], straight[0][s + 6]) << "same mesh, step " << s + 7;
  for (const auto& [dp, pp, zero] : {std::tuple{1, 1, 0}, std::tuple{1, 2, 0}, std::tuple{2, 1, 2}}) {
    SetMesh(dp, pp, 1, zero);
    auto resumed = Train(10);
    for (auto& losses : resumed) {
      ASSERT_EQ(losses.size(), 4u);
      for (int s = 0; s < 4; ++s) {
        // Another dp sums the gradient in another order (fp32 rounding), and a moment near an
        // 8-bit code's boundary then takes the neighbouring code: a few 1e-5 over four steps.
        EXPECT_NEAR(losses[s], straight[0][s + 6], 3e-5 * straight[0][s + 6])
            << "dp " << dp << " pp " << pp << " step " << s + 7;
      }
    }
  }
}

TEST_F(TrainerTest, CosineScheduleChangesTheTrajectory) {
  auto constant = Train(5)[0];
  spec_.train.lr_schedule = LrSchedule::kCosine;
  spec_.train.warmup_steps = 3;
  spec_.train.steps = 5;
  auto scheduled = Train(5)[0];
  EXPECT_DOUBLE_EQ(scheduled[0], constant[0]);  // same weights before the first update
  EXPECT_NE(scheduled[1], constant[1]);         // a third of the lr in the first update
}

// AdamW's eps is train.eps: a spec without it runs 1e-8 (PyTorch's default); another eps changes
// the trajectory from the second step on (the first loss is before any update).
TEST_F(TrainerTest, AdamEpsIsTheSpecFieldAndDefaultsTo1e8) {
  auto parsed = ParseRunSpec(
      "name = \"e\"\n[model]\nfamily = \"gpt2\"\nlayers = 1\nhidden = 8\nheads = 2\nvocab = 256\n"
      "sequence = 8\n[data]\npath = \"x\"\n[train]\nsteps = 1\n",
      "", /*check_files=*/false);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->train.eps, 1e-8);
  spec_.train.eps = parsed->train.eps;
  auto defaults = Train(5)[0];
  ASSERT_EQ(defaults.size(), 5u);
  spec_.train.eps = 1e-3;  // near the size of sqrt(v): the steps shrink
  auto larger = Train(5)[0];
  EXPECT_EQ(larger[0], defaults[0]);  // same weights before the first update
  for (size_t i = 1; i < larger.size(); ++i) EXPECT_NE(larger[i], defaults[i]) << "step " << i + 1;
  EXPECT_GT(larger[4], defaults[4]);  // smaller steps: less progress by step 5
}

TEST_F(TrainerTest, InitFromAHuggingFaceDirectoryStartsFromThoseWeights) {
  spec_.train.seed = 21;
  auto reference = Train(3)[0];
  // The same initial weights, exported, then loaded by a trainer seeded differently.
  torch::manual_seed(21);
  auto model = CreateCausalLm(spec_.model, 21);
  ASSERT_TRUE(ExportHuggingFace(model->named_parameters(), spec_.model, dir_ + "/init").ok());
  spec_.train.seed = 999;
  auto other_seed = Train(1)[0];
  EXPECT_NE(other_seed[0], reference[0]);
  spec_.model.init_from = dir_ + "/init";
  // Same data order as the reference needs the same data seed: only the weights come from disk.
  spec_.train.seed = 21;
  auto loaded = Train(3)[0];
  for (int s = 0; s < 3; ++s) EXPECT_EQ(loaded[s], reference[s]) << "step " << s + 1;
}

TEST_F(TrainerTest, LlamaWithGroupedQueryAttentionLearnsAndMatchesAcrossRanks) {
  spec_.model.family = Family::kLlama;
  spec_.model.kv_heads = 2;
  spec_.model.ffn = 96;
  spec_.model.norm_eps = 1e-6;
  auto one = Train(30)[0];
  EXPECT_NEAR(one.front(), std::log(256.0), 0.3);
  EXPECT_LT(one.back(), one.front() * 0.6);
}

TEST_F(TrainerTest, LlamaParametersCarryHuggingFaceNamesAndShapes) {
  spec_.model = LlamaModel(2, 64, 8, 32, 2, 160);
  torch::manual_seed(0);
  auto model = CreateCausalLm(spec_.model, 0);
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
  spec_.model = LlamaModel(1, 32, 4, 16, 2, 64);
  torch::manual_seed(1);
  auto model = CreateCausalLm(spec_.model, 1);
  torch::NoGradGuard no_grad;
  auto a = torch::randint(0, 256, {1, 16}, torch::kLong);
  auto b = a.clone();
  b.index_put_({0, 10}, (a.index({0, 10}).item<int64_t>() + 1) % 256);  // change token 10 only
  auto la = model->Logits(a), lb = model->Logits(b);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 10), lb.narrow(1, 0, 10)));  // the past is untouched
  EXPECT_FALSE(torch::allclose(la.narrow(1, 10, 6), lb.narrow(1, 10, 6)));
}

// dp=2 x tp=2 with ZeRO-1: each rank writes its pieces into its own store; the pieces of all
// four stores assemble into whole tensors whose slices are bit-identical to every rank's live
// parameters.
TEST_F(TrainerTest, CheckpointPiecesAssembleIntoTheLiveParameters) {
  SetMesh(2, 1, 2, 1);
  for (int r = 0; r < 4; ++r) {
    auto store = storage::ShardStore::Open(dir_ + "/store" + std::to_string(r));
    ASSERT_TRUE(store.ok());
    stores_.push_back(std::move(store).value());
  }
  std::map<uint32_t, std::vector<std::pair<std::string, torch::Tensor>>> live;
  std::map<uint32_t, shard::MeshPosition> positions;
  Train(3, [&](uint32_t r, Trainer& t) {
    auto saved = t.SaveCheckpointShard();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    for (auto& [name, p] : t.parameters()) live[r].emplace_back(name, p.clone());
    positions[r] = t.position();
  });
  shard::TensorAssembler params(spec_.model);
  for (auto& store : stores_) {
    auto list = store->ListCheckpoints("run");
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    for (const auto& info : list->front().tensors) {
      auto piece = shard::ParsePiece(info.name);
      ASSERT_TRUE(piece.ok()) << piece.status().ToString();
      if (piece->kind != "param") continue;
      auto stored = store->ReadCheckpointTensor("run", 3, info.name);
      ASSERT_TRUE(stored.ok());
      ASSERT_TRUE(params.Add(*piece, sizeof(float), stored->bytes.data()).ok());
    }
  }
  torch::manual_seed(0);
  auto model = CreateCausalLm(spec_.model, 0);
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const std::vector<int64_t> full_shape = item.value().sizes().vec();
    auto full = params.Take(name);
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    const auto split = shard::TensorParallelSplit(spec_.model, name, full_shape, 2);
    int holders = 0;
    for (auto& [r, tensors] : live) {
      for (auto& [held, slice] : tensors) {
        if (held != name) continue;
        ++holders;
        // Vocab-parallel: tp = 2 divides the vocabulary (256), so each rank holds half the table.
        if (name == model::TokenEmbeddingName(spec_.model)) {
          EXPECT_EQ(slice.size(0), spec_.model.vocab / 2) << name << " on rank " << r;
        }
        std::vector<uint8_t> expected(static_cast<size_t>(slice.numel()) * sizeof(float));
        shard::CopySlice(split, full_shape, 2, positions[r].tp_rank, sizeof(float), full->data(), expected.data());
        auto got = slice.contiguous();
        EXPECT_EQ(0, std::memcmp(expected.data(), got.data_ptr(), expected.size())) << name << " on rank " << r;
      }
    }
    EXPECT_EQ(holders, 4) << name;
  }
  EXPECT_TRUE(params.names().empty()) << "a parameter was written but not taken: " << params.names().front();
}

// A run that lost a worker may replay a step whose shard an earlier attempt committed in this
// store cut for another mesh. That shard stays; this one goes under a key of its own cut, is found
// again by the next save of the same cut, and resumes to the uninterrupted losses.
TEST_F(TrainerTest, ShardOfAStepCutForAnotherMeshGoesUnderAKeyOfItsOwn) {
  spec_.train.global_batch = 4;
  auto straight = Train(8)[0];
  const std::string store0 = dir_ + "/recut-store0";
  SetMesh(1, 2, 1);  // the earlier attempt: two stages
  for (int r = 0; r < 2; ++r) {
    auto store = storage::ShardStore::Open(dir_ + "/recut-store" + std::to_string(r));
    ASSERT_TRUE(store.ok());
    stores_.push_back(std::move(store).value());
  }
  std::vector<storage::CheckpointTensorInfo> first_cut;
  Train(4, [&](uint32_t r, Trainer& t) {
    auto saved = t.SaveCheckpointShard();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_EQ(saved->key_run, "run");
    if (r == 0) first_cut = saved->tensors;
  });
  stores_.resize(1);
  SetMesh(1, 1, 1);  // the replay on the survivor: the whole model on rank 0
  ResumePoint recut{"run", 4, {}};
  Train(4, [&](uint32_t, Trainer& t) {
    auto saved = t.SaveCheckpointShard();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_NE(saved->key_run, "run");
    EXPECT_GT(saved->tensors.size(), first_cut.size());
    auto again = t.SaveCheckpointShard();
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->key_run, saved->key_run);
    EXPECT_EQ(again->tensors.size(), saved->tensors.size());
    ResumePoint::Shard shard{store0, {}, {}};
    for (auto& info : saved->tensors) shard.tensors.push_back(info.name);
    shard.copies.push_back({store0, saved->key_run, "", ""});
    recut.shards.push_back(shard);
  });
  // The earlier attempt's shard is untouched.
  auto earlier = stores_[0]->ListCheckpoints("run");
  ASSERT_TRUE(earlier.ok());
  ASSERT_EQ(earlier->size(), 1u);
  EXPECT_EQ((*earlier)[0].tensors.size(), first_cut.size());
  stores_.clear();
  resume_ = recut;
  auto resumed = Train(8)[0];
  ASSERT_EQ(resumed.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_NEAR(resumed[s], straight[s + 4], 1e-5 * straight[s + 4]) << "step " << s + 5;
}

}  // namespace
}  // namespace strata::worker
