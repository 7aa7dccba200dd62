// LoRA training (stage_model.h, run_spec.h LoraSpec): the adapters train, the base stays as it
// was loaded, and every mesh LoRA runs on gives the single worker's losses.
#include <ATen/Parallel.h>

#include <cmath>
#include <tuple>

#include "quant/nf4.h"
#include "worker/nn/lora.h"
#include "worker/nn/model_family.h"
#include "worker/nn/nf4_linear.h"
#include "worker/train/trainer_test_fixture.h"

namespace strata::worker {
namespace {

class LoraTrainerTest : public TrainerTest {
 protected:
  void UseLora(const std::string& family, std::vector<std::string> modules, int64_t rank = 4) {
    spec_.model = TinyModel(family, 4);
    spec_.lora.enabled = true;
    spec_.lora.rank = rank;
    spec_.lora.alpha = 8.0;
    spec_.lora.target_modules = std::move(modules);
    spec_.train.lr = 1e-2;  // adapters start at B = 0: a larger step moves the loss within a few steps
  }
};

TEST_F(LoraTrainerTest, StepOneLossIsTheBaseModelsAndOnlyTheAdaptersChange) {
  UseLora("llama", LoraTargetModules(Family::kLlama));
  RunSpec full = spec_;
  full.lora.enabled = false;
  const RunSpec lora = spec_;
  spec_ = full;
  const std::vector<double> base = Train(1)[0];
  spec_ = lora;
  std::map<std::string, torch::Tensor> adapters, frozen;
  int64_t state_elements = 0;
  const std::vector<double> losses = Train(4, [&](uint32_t, Trainer& t) {
    for (auto& [name, p] : t.parameters()) adapters.emplace(name, p.clone());
    for (auto& [name, p] : t.frozen_parameters()) frozen.emplace(name, p.clone());
    state_elements = t.optimizer_state_elements();
  })[0];
  // B starts at zero: the adapted model is the base model until the first update.
  EXPECT_EQ(losses[0], base[0]);
  EXPECT_LT(losses[3], losses[0]);

  // The units are the adapters, and only they have optimizer state.
  const std::vector<model::Parameter> table = model::LoraParameters(spec_.model, spec_.lora);
  ASSERT_EQ(adapters.size(), table.size());
  EXPECT_EQ(state_elements, model::LoraParameterCount(spec_.model, spec_.lora));  // per moment
  const std::map<std::string, torch::Tensor> initial = InitialLoraAdapters(spec_.model, spec_.lora, spec_.train.seed);
  for (const model::Parameter& p : table) {
    const torch::Tensor& now = adapters.at(p.name);
    EXPECT_FALSE(torch::equal(now, initial.at(p.name))) << p.name << " did not train";
  }
  // The base is bit for bit the model the seed draws.
  auto drawn = BuildCausalLm(spec_.model, spec_.train.seed);
  ASSERT_TRUE(drawn.ok());
  int64_t compared = 0;
  for (const auto& item : (*drawn)->named_parameters()) {
    ASSERT_TRUE(frozen.count(item.key())) << item.key() << " is not in the frozen base";
    EXPECT_TRUE(torch::equal(frozen.at(item.key()), item.value())) << item.key() << " changed";
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(frozen.size()));
}

TEST_F(LoraTrainerTest, InitialAdaptersArePeftsAndTheSameForEverySeedUse) {
  UseLora("llama", {"q_proj", "down_proj"}, 8);
  const auto a = InitialLoraAdapters(spec_.model, spec_.lora, 7), b = InitialLoraAdapters(spec_.model, spec_.lora, 7);
  const auto c = InitialLoraAdapters(spec_.model, spec_.lora, 8);
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(t.abs().max().item<float>(), 0.0f) << name;
      continue;
    }
    const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
    EXPECT_LE(t.abs().max().item<double>(), bound) << name;
    EXPECT_GT(t.abs().max().item<double>(), 0.9 * bound) << name;  // uniform over the whole range
    EXPECT_FALSE(torch::equal(t, c.at(name))) << name;
  }
}

TEST_F(LoraTrainerTest, LogitsEqualTheBaseWithTheAdaptersMergedIn) {
  for (const std::string family : {"gpt2", "llama"}) {
    UseLora(family, LoraTargetModules(ParseChoice<Family>(family).value()));
    spec_.lora.use_rslora = family == "llama";
    const torch::Tensor tokens = torch::randint(0, spec_.model.vocab, {2, spec_.model.sequence}, torch::kLong);
    torch::Tensor adapted;
    std::map<std::string, torch::Tensor> adapters;
    Train(3, [&](uint32_t, Trainer& t) {
      adapted = t.Logits(tokens);
      for (auto& [name, p] : t.parameters()) adapters.emplace(name, p.clone());
    });
    // What `strata export --merge` writes (and PEFT's merge_and_unload computes): W + scale * B A.
    auto merged = BuildCausalLm(spec_.model, spec_.train.seed);
    ASSERT_TRUE(merged.ok());
    {
      torch::NoGradGuard no_grad;
      for (auto& item : (*merged)->named_parameters()) {
        const std::string stem = item.key().substr(0, item.key().size() - std::string(".weight").size());
        auto a = adapters.find(stem + ".lora_A.weight");
        if (a == adapters.end()) continue;
        item.value().add_(torch::matmul(adapters.at(stem + ".lora_B.weight"), a->second) * spec_.lora.scale());
      }
    }
    const torch::Tensor reference = (*merged)->Logits(tokens);
    const double gap = (adapted - reference).abs().max().item<double>();
    EXPECT_LT(gap, 1e-4) << family;
    // The adapters did change the model (so the comparison above can fail).
    auto base = BuildCausalLm(spec_.model, spec_.train.seed);
    ASSERT_TRUE(base.ok());
    EXPECT_GT((adapted - (*base)->Logits(tokens)).abs().max().item<double>(), 100 * gap) << family;
  }
}

TEST(Nf4LinearTest, DequantizesAsTheReferenceAndSendsTheGradientToTheInputOnly) {
  torch::manual_seed(3);
  // Heavy-tailed, and not a multiple of 64 x 256 weights: a partial block and a partial nested block.
  const torch::Tensor w = torch::randn({37, 91}) * torch::randn({37, 91}).pow(3);
  auto q = QuantizeNf4Weight(w, torch::kCPU, torch::kFloat);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  auto reference = quant::QuantizeNf4(w.contiguous().data_ptr<float>(), {37, 91});
  ASSERT_TRUE(reference.ok());
  auto values = quant::DequantizeNf4(*reference);
  ASSERT_TRUE(values.ok());
  const torch::Tensor expected = torch::from_blob(values->data(), {37, 91}, torch::kFloat).clone();
  const torch::Tensor got = DequantizeNf4Weight(*q);
  EXPECT_TRUE(torch::equal(got, expected)) << (got - expected).abs().max().item<float>();
  EXPECT_LT(q->bytes(), w.numel());  // about half a byte a weight (and the 256-entry map)
  // In bf16 (a bf16 run's compute dtype): the fp32 values rounded to nearest even, as bnb's.
  auto q16 = QuantizeNf4Weight(w, torch::kCPU, torch::kBFloat16);
  ASSERT_TRUE(q16.ok());
  auto bf16 = quant::DequantizeNf4Bf16(*reference);
  ASSERT_TRUE(bf16.ok());
  const torch::Tensor got16 = DequantizeNf4Weight(*q16);
  ASSERT_EQ(got16.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(got16.view(torch::kInt16), torch::from_blob(bf16->data(), {37, 91}, torch::kInt16)));
  for (const auto& shape : std::vector<std::vector<int64_t>>{{64, 32}, {96, 32}, {3, 5}}) {
    const torch::Tensor small = torch::randn(shape) * 0.02;
    auto qs = QuantizeNf4Weight(small, torch::kCPU, torch::kFloat);
    ASSERT_TRUE(qs.ok());
    auto rs = quant::QuantizeNf4(small.contiguous().data_ptr<float>(), shape);
    auto vs = quant::DequantizeNf4(*rs);
    const torch::Tensor ref = torch::from_blob(vs->data(), shape, torch::kFloat).clone();
    EXPECT_TRUE(torch::equal(DequantizeNf4Weight(*qs), ref))
        << shape[0] << "x" << shape[1] << " " << (DequantizeNf4Weight(*qs) - ref).abs().max().item<float>()
        << " ref err " << (ref - small).abs().max().item<float>();
  }

  const torch::Tensor x = torch::randn({5, 91}).requires_grad_(true);
  const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  const torch::Tensor bias = torch::randn({37});
  const torch::Tensor y = Nf4Linear(x, *q, bias);
  const torch::Tensor y2 = torch::linear(x2, expected, bias);
  EXPECT_TRUE(torch::allclose(y, y2, 1e-6, 1e-6));
  const torch::Tensor dy = torch::randn({5, 37});
  y.backward(dy);
  y2.backward(dy);
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-6, 1e-6));
}

// A LoRA linear (model_family.h ParamView::Linear), over a dense and an NF4 base, against the same
// maths in plain autograd: x W^T + scale (x A^T) B^T, its output and the gradients reaching x, A and B.
TEST(LoraLinearTest, OutputAndGradientsAreThePlainFormulas) {
  torch::manual_seed(8);
  const torch::Tensor w = torch::randn({24, 40}) * 0.1;
  auto q = QuantizeNf4Weight(w, torch::kCPU, torch::kFloat);
  ASSERT_TRUE(q.ok());
  auto nf4 = std::make_shared<Nf4Weight>(std::move(q).value());
  const torch::Tensor w_nf4 = DequantizeNf4Weight(*nf4);
  const LoraCompute lora{/*scale=*/2.5, /*dropout=*/0.0};
  for (const bool quantized : {false, true}) {
    SCOPED_TRACE(quantized ? "nf4 base" : "dense base");
    const torch::Tensor a = torch::randn({4, 40}).requires_grad_(true);
    const torch::Tensor b = torch::randn({24, 4}).requires_grad_(true);
    const torch::Tensor x = torch::randn({2, 3, 40}).requires_grad_(true);
    ParamView view({"q_proj.lora_A.weight", "q_proj.lora_B.weight"}, {a, b});
    view.AddFrozen(
        {"q_proj.weight"}, {quantized ? torch::Tensor() : w}, "",
        quantized ? std::vector<std::shared_ptr<Nf4Weight>>{nf4} : std::vector<std::shared_ptr<Nf4Weight>>{});
    view.SetLora(&lora);
    const torch::Tensor y = view.Linear(x, "q_proj.weight");
    const torch::Tensor a2 = a.detach().clone().requires_grad_(true), b2 = b.detach().clone().requires_grad_(true);
    const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
    const torch::Tensor y2 = torch::linear(x2, quantized ? w_nf4 : w) + torch::linear(torch::linear(x2, a2), b2) * 2.5;
    EXPECT_TRUE(torch::allclose(y, y2, 1e-5, 1e-5));
    const torch::Tensor dy = torch::randn_like(y2);
    y.backward(dy);
    y2.backward(dy);
    EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(a.grad(), a2.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(b.grad(), b2.grad(), 1e-5, 1e-5));
  }
}

// A matrix past one quantization run (2^20 weights) is quantized on every core: the same codes,
// block scales and mean as the one-thread reference, whatever the thread count.
TEST(Nf4LinearTest, ALargeMatrixQuantizedOnEveryCoreIsTheReferenceBitForBit) {
  torch::manual_seed(4);
  const torch::Tensor w = torch::randn({1201, 2001}) * torch::randn({1201, 2001}).pow(3);  // 2.4M, odd
  auto reference = quant::QuantizeNf4(w.contiguous().data_ptr<float>(), {1201, 2001});
  ASSERT_TRUE(reference.ok());
  const int threads = at::get_num_threads();
  for (int t : {1, std::max(threads, 4)}) {
    SCOPED_TRACE(t);
    at::set_num_threads(t);
    auto q = QuantizeNf4Weight(w, torch::kCPU, torch::kFloat);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    auto bytes = [](const torch::Tensor& v) {
      return std::vector<uint8_t>(v.data_ptr<uint8_t>(), v.data_ptr<uint8_t>() + v.numel());
    };
    EXPECT_TRUE(bytes(q->codes) == reference->codes);
    EXPECT_TRUE(bytes(q->absmax_codes) == reference->absmax_codes);
    EXPECT_TRUE(torch::equal(q->nested_absmax, torch::tensor(reference->nested_absmax)));
    EXPECT_EQ(q->offset, reference->offset);
  }
  at::set_num_threads(threads);
}

TEST_F(LoraTrainerTest, QloraTrainsAdaptersOverTheNf4BaseOnEveryMesh) {
  UseLora("llama", LoraTargetModules(Family::kLlama));
  spec_.lora.base = LoraBase::kNf4;
  const torch::Tensor tokens = torch::randint(0, spec_.model.vocab, {2, spec_.model.sequence}, torch::kLong);
  torch::Tensor before;
  std::map<std::string, torch::Tensor> frozen;
  Train(0, [&](uint32_t, Trainer& t) {
    before = t.Logits(tokens);
    for (auto& [name, p] : t.frozen_parameters()) frozen.emplace(name, p.clone());
  });
  // Before any update the model is the base with its block linears through NF4 and back.
  auto base = BuildCausalLm(spec_.model, spec_.train.seed);
  ASSERT_TRUE(base.ok());
  int64_t quantized = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : (*base)->named_parameters()) {
      const bool block_matrix = item.value().dim() == 2 && item.key().rfind("layers.", 0) == 0;
      if (!block_matrix) {
        EXPECT_TRUE(torch::equal(frozen.at(item.key()), item.value())) << item.key();
        continue;
      }
      auto q = QuantizeNf4Weight(item.value(), torch::kCPU, torch::kFloat);
      ASSERT_TRUE(q.ok());
      const torch::Tensor roundtrip = DequantizeNf4Weight(*q);
      EXPECT_TRUE(torch::equal(frozen.at(item.key()), roundtrip))
          << item.key() << " " << (frozen.at(item.key()) - roundtrip).abs().max().item<float>();
      EXPECT_FALSE(torch::equal(roundtrip, item.value())) << item.key() << " was not quantized";
      item.value().copy_(roundtrip);
      ++quantized;
    }
  }
  EXPECT_EQ(quantized, spec_.model.layers * 7);
  EXPECT_LT((before - (*base)->Logits(tokens)).abs().max().item<double>(), 1e-4);

  const std::vector<double> reference = Train(4)[0];
  EXPECT_LT(reference[3], reference[0]);
  for (const auto& [dp, pp, zero] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 1, 1}, {1, 2, 0}}) {
    SetMesh(dp, pp, 1, zero);
    const auto losses = Train(4);
    for (const auto& rank : losses) {
      for (size_t s = 0; s < reference.size(); ++s)
        EXPECT_NEAR(rank[s], reference[s], 1e-5 * reference[s]) << "dp " << dp << " pp " << pp << " step " << s + 1;
    }
  }
}

TEST_F(LoraTrainerTest, EveryMeshLoraRunsOnGivesTheSingleWorkersLosses) {
  for (const std::string family : {"gpt2", "llama", "gpt_neox"}) {
    UseLora(family, LoraTargetModules(ParseChoice<Family>(family).value()));
    SetMesh(1, 1, 1);
    const std::vector<double> reference = Train(3)[0];
    struct Mesh {
      int64_t dp, pp, zero;
      bool recompute;
    };
    for (const Mesh& mesh : {Mesh{2, 1, 0, false}, Mesh{1, 2, 0, false}, Mesh{2, 1, 1, false}, Mesh{2, 1, 2, true},
                             Mesh{2, 2, 2, false}}) {
      SetMesh(mesh.dp, mesh.pp, 1, mesh.zero, mesh.recompute);
      const auto losses = Train(3);
      for (size_t r = 0; r < losses.size(); ++r) {
        if (losses[r].empty()) continue;
        for (size_t s = 0; s < reference.size(); ++s) {
          EXPECT_NEAR(losses[r][s], reference[s], 1e-5 * reference[s])
              << family << " dp " << mesh.dp << " pp " << mesh.pp << " zero " << mesh.zero << " recompute "
              << mesh.recompute << " rank " << r << " step " << s + 1;
        }
      }
    }
  }
}

TEST_F(LoraTrainerTest, AResumeFromACheckpointOfAdaptersKeepsTheLosses) {
  UseLora("gpt2", {"c_attn", "c_proj", "c_fc"});
  const std::vector<double> straight = Train(5)[0];
  // The checkpoint holds the adapters and their optimizer state only: 3 fp32 values (the value,
  // AdamW's m and v) per adapter parameter, nothing of the base.
  auto store = storage::ShardStore::Open(dir_ + "/lora0");
  ASSERT_TRUE(store.ok());
  stores_.push_back(std::move(store).value());
  ResumePoint checkpoint{"run", 2, {}};
  uint64_t bytes = 0;
  Train(2, [&](uint32_t, Trainer& t) {
    auto saved = t.SaveCheckpointShard();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    ResumePoint::Shard shard{dir_ + "/lora0", {}, {}};
    for (auto& info : saved->tensors) {
      shard.tensors.push_back(info.name);
      bytes += info.size_bytes;
    }
    checkpoint.shards.push_back(shard);
  });
  stores_.clear();
  EXPECT_EQ(bytes, 3 * 4 * static_cast<uint64_t>(model::LoraParameterCount(spec_.model, spec_.lora)));
  // Resumed on another mesh: the base is read again, the adapters come from the checkpoint.
  resume_ = checkpoint;
  SetMesh(2, 1, 1, 1);
  const auto resumed = Train(5);
  for (const auto& rank : resumed) {
    ASSERT_EQ(rank.size(), 3u);
    for (size_t s = 0; s < rank.size(); ++s) EXPECT_NEAR(rank[s], straight[s + 2], 1e-5 * straight[s + 2]);
  }
}

}  // namespace
}  // namespace strata::worker
