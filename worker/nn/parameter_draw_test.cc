// ParameterDraw (causal_lm.h): a seed-drawn model one parameter at a time - what a rank holding a
// pipeline stage or streaming a frozen base draws - is the whole model's weights, whatever the
// host's thread count.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

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

TEST(ParameterDraw, ALargeTensorIsTheSameOnOneThreadAndOnManyAndEachRunIsItsOwn) {
  const ModelSpec spec = SmallLlama();
  const model::Parameter big{"layers.0.mlp.up_proj.weight", {1536, 2048}};  // three runs of 2^20
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const torch::Tensor one = ParameterDraw(spec, 3)(big);
  at::set_num_threads(std::max(threads, 4));
  const torch::Tensor many = ParameterDraw(spec, 3)(big);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
  const torch::Tensor flat = one.view({-1});
  const int64_t run = ParameterDraw::kDrawRun;
  EXPECT_FALSE(torch::equal(flat.narrow(0, 0, 1000), flat.narrow(0, run, 1000)));
  EXPECT_FALSE(torch::equal(flat.narrow(0, run, 1000), flat.narrow(0, 2 * run, 1000)));
  // The family's rule: N(0, 0.02) for a linear's weight, ones for an RMSNorm's.
  EXPECT_NEAR(one.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(one.std().item<double>(), 0.02, 1e-4);
  const torch::Tensor norm = ParameterDraw(spec, 3)({"layers.0.input_layernorm.weight", {64}});
  EXPECT_TRUE(torch::equal(norm, torch::ones({64})));
}

}  // namespace
}  // namespace strata::worker
