// ParameterDraw (causal_lm.h): a seed-drawn model one parameter at a time - what a rank holding a
// pipeline stage or streaming a frozen base draws - is the whole model's weights, whatever the
// host's thread count.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "model/parameters.h"
#include "worker/nn/causal_lm.h"

namespace strata::worker {
namespace {

ModelSpec SmallLlama() {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 2, m.ffn = 160, m.vocab = 256, m.sequence = 32;
  EXPECT_TRUE(ValidateModelSpec(m, "").ok());
  return m;
}

TEST(ParameterDraw, EachParameterDrawnAloneIsTheWholeModelsAndOthersDoNotShiftIt) {
  const ModelSpec spec = SmallLlama();
  auto model = CreateCausalLm(spec, 7);
  std::map<std::string, torch::Tensor> whole;
  for (const auto& item : model->named_parameters()) whole.emplace(item.key(), item.value().detach());
  const std::vector<model::Parameter> table = model::Parameters(spec);
  ASSERT_EQ(whole.size(), table.size());
  // In reverse order, as a last pipeline stage would draw its own first.
  const ParameterDraw draw(spec, 7);
  for (auto p = table.rbegin(); p != table.rend(); ++p) {
    SCOPED_TRACE(p->name);
    EXPECT_TRUE(torch::equal(draw(*p), whole.at(p->name)));
  }
  // Another seed, another model; two matrices of one shape differ.
  const ParameterDraw other(spec, 8);
  const model::Parameter q{"layers.0.self_attn.q_proj.weight", {64, 64}};
  EXPECT_FALSE(torch::equal(other(q), whole.at(q.name)));
  EXPECT_FALSE(
      torch::equal(whole.at("layers.0.self_attn.q_proj.weight"), whole.at("layers.1.self_attn.q_proj.weight")));
}

TEST(ParameterDraw, ALargeTensorIsTheSameOnOneThreadAndOnManyAndASliceDrawnAloneIsItsPart) {
  const ModelSpec spec = SmallLlama();
  const model::Parameter big{"layers.0.mlp.up_proj.weight", {1536, 2048}};  // three threads' worth
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const torch::Tensor one = ParameterDraw(spec, 3)(big);
  at::set_num_threads(std::max(threads, 4));
  const torch::Tensor many = ParameterDraw(spec, 3)(big);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
  // The generator is counter-based: elements [k, k + n) drawn alone are the tensor's, and
  // neighbouring stretches are unrelated.
  const torch::Tensor flat = one.view({-1});
  const uint64_t stream = 0x1234;
  torch::Tensor whole = torch::empty({5000}), tail = torch::empty({1000});
  kernels::DrawNormalHost(stream, 0, 0.0f, 1.0f, whole.data_ptr<float>(), 5000, 3);
  kernels::DrawNormalHost(stream, 4000, 0.0f, 1.0f, tail.data_ptr<float>(), 1000, 1);
  EXPECT_TRUE(torch::equal(whole.narrow(0, 4000, 1000), tail));
  EXPECT_FALSE(torch::equal(flat.narrow(0, 0, 1000), flat.narrow(0, 1000, 1000)));
  // The family's rule: std 0.02 for a linear's weight, ones for an RMSNorm's.
  EXPECT_NEAR(one.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(one.std().item<double>(), 0.02, 1e-4);
  const torch::Tensor norm = ParameterDraw(spec, 3)({"layers.0.input_layernorm.weight", {64}});
  EXPECT_TRUE(torch::equal(norm, torch::ones({64})));
}

TEST(ParameterDraw, ValuesAreTheDocumentedSumOfTwelveUniformsAndLookNormal) {
  // docs/run-spec.md, "Weights": the formula written out independently of normal_draw_math.h.
  auto splitmix = [](uint64_t stream, uint64_t c) {
    uint64_t x = stream + (c + 1) * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  const uint64_t stream = 99;
  const int64_t n = 1 << 20;
  torch::Tensor z = torch::empty({n});
  kernels::DrawNormalHost(stream, 0, 0.0f, 1.0f, z.data_ptr<float>(), n, 2);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{777}, n - 1}) {
    int64_t sum = 0;
    for (int k = 0; k < 3; ++k) {
      const uint64_t h = splitmix(stream, static_cast<uint64_t>(3 * i + k));
      for (int f = 0; f < 4; ++f) sum += static_cast<int64_t>((h >> (16 * f)) & 0xffff);
    }
    EXPECT_EQ(z[i].item<float>(), static_cast<float>(sum - 393210) / 65536.0f) << i;
  }
  // Moments of a standard normal (the Irwin-Hall sum's kurtosis is 3 - 1.2 / 12 = 2.9), |z| < 6.
  const double mean = z.mean().item<double>(), var = z.var().item<double>();
  const double kurtosis = ((z - mean).pow(4).mean() / (var * var)).item<double>();
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(var, 1.0, 5e-3);
  EXPECT_NEAR(kurtosis, 2.9, 0.02);
  EXPECT_LT(z.abs().max().item<float>(), 6.0f);
  // About 4.6% of a normal's mass lies beyond 2 sigma (the Irwin-Hall sum's: within 0.2% of it).
  EXPECT_NEAR((z.abs() > 2.0f).to(torch::kFloat).mean().item<double>(), 0.0455, 2e-3);
}

}  // namespace
}  // namespace strata::worker
