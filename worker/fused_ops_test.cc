// The fused block pieces (fused_ops.h, kernels/'s CPU references underneath) against the plain
// LibTorch ops they replace: values and gradients, fp32 and bf16 storage.
#include "worker/fused_ops.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/run_spec.h"
#include "model/parameters.h"
#include "worker/model_family.h"
#include "worker/torch_compat.h"

namespace strata::worker {
namespace {

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max() / b.to(torch::kFloat).abs().max().clamp_min(1e-30)).item<double>();
}

// Values and input gradients of `fused` and `plain` on the same inputs and output gradient.
struct Compared {
  double value = 0;
  std::vector<double> grads;
};
template <typename Fused, typename Plain>
Compared Compare(const std::vector<torch::Tensor>& inputs, Fused fused, Plain plain) {
  std::vector<torch::Tensor> a, b;
  for (const auto& t : inputs) {
    a.push_back(t.clone().requires_grad_(true));
    b.push_back(t.clone().requires_grad_(true));
  }
  const auto ya = fused(a), yb = plain(b);
  const auto dy = torch::randn(ya.sizes()).to(ya.scalar_type());
  ya.backward(dy);
  yb.backward(dy.to(yb.scalar_type()));
  Compared out;
  out.value = MaxRelative(ya, yb);
  for (size_t i = 0; i < a.size(); ++i) out.grads.push_back(MaxRelative(a[i].grad(), b[i].grad()));
  return out;
}

torch::Tensor PlainRmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto x32 = x.to(torch::kFloat);
  return w * (x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + eps));
}

TEST(FusedOpsTest, RmsNormEqualsThePlainOpsAndItsGradients) {
  torch::manual_seed(1);
  const auto x = torch::randn({3, 5, 96}), w = torch::randn({96});
  const auto fp32 = Compare({x, w}, [](auto& v) { return FusedRmsNorm(v[0], v[1], 1e-6, torch::kFloat); },
                            [](auto& v) { return PlainRmsNorm(v[0], v[1], 1e-6); });
  EXPECT_LE(fp32.value, 1e-6);
  EXPECT_LE(fp32.grads[0], 1e-5);
  EXPECT_LE(fp32.grads[1], 1e-5);
  // bf16 output (what autocast's matmuls read): the fp32 result rounded once.
  const auto xd = x.clone();
  auto y = FusedRmsNorm(xd, w, 1e-6, torch::kBFloat16);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LE(MaxRelative(y, PlainRmsNorm(x, w, 1e-6).to(torch::kBFloat16)), 1.0 / 128);
}

TEST(FusedOpsTest, LayerNormEqualsLibTorchsAndItsGradients) {
  torch::manual_seed(4);
  const auto x = torch::randn({3, 5, 96}) * 2 + 0.5, w = torch::randn({96}), b = torch::randn({96});
  const auto r = Compare({x, w, b}, [](auto& v) { return FusedLayerNorm(v[0], v[1], v[2], 1e-5, torch::kFloat); },
                         [](auto& v) { return torch::layer_norm(v[0], {96}, v[1], v[2], 1e-5); });
  EXPECT_LE(r.value, 1e-6);
  for (double g : r.grads) EXPECT_LE(g, 1e-5);
  auto y = FusedLayerNorm(x, w, b, 1e-5, torch::kBFloat16);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LE(MaxRelative(y, torch::layer_norm(x, {96}, w, b, 1e-5)), 1.0 / 128);
}

TEST(FusedOpsTest, SwiGluEqualsSiluTimesUpAndItsGradients) {
  torch::manual_seed(2);
  const auto g = torch::randn({4, 7, 33}) * 3, u = torch::randn({4, 7, 33});
  const auto r = Compare({g, u}, [](auto& v) { return FusedSwiGlu(v[0], v[1]); }, [](auto& v) { return torch::silu(v[0]) * v[1]; });
  EXPECT_LE(r.value, 1e-6);  // LibTorch's vectorised exp rounds differently in the last bit
  EXPECT_LE(r.grads[0], 1e-6);
  EXPECT_LE(r.grads[1], 1e-6);
  const auto rb = Compare({g.to(torch::kBFloat16), u.to(torch::kBFloat16)}, [](auto& v) { return FusedSwiGlu(v[0], v[1]); },
                          [](auto& v) { return (torch::silu(v[0].to(torch::kFloat)) * v[1].to(torch::kFloat)).to(torch::kBFloat16); });
  EXPECT_LE(rb.value, 1.0 / 128);
  EXPECT_LE(rb.grads[0], 2.0 / 128);
  EXPECT_LE(rb.grads[1], 2.0 / 128);
}

TEST(FusedOpsTest, BiasGeluEqualsGeluOfTheBiasedInputAndItsGradients) {
  torch::manual_seed(5);
  const auto h = torch::randn({4, 6, 40}) * 2, b = torch::randn({40});
  for (const bool tanh : {true, false}) {
    const auto r = Compare({h, b}, [&](auto& v) { return FusedBiasGelu(v[0], v[1], tanh); },
                           [&](auto& v) { return torch::gelu(v[0] + v[1], tanh ? "tanh" : "none"); });
    EXPECT_LE(r.value, 1e-6) << "tanh " << tanh;
    EXPECT_LE(r.grads[0], 1e-5) << "tanh " << tanh;
    EXPECT_LE(r.grads[1], 1e-5) << "tanh " << tanh;  // the bias: the column sums of dh
    // bf16 storage (autocast's matmul output): the fp32 result rounded once.
    const auto hb = h.to(torch::kBFloat16);
    const auto y = FusedBiasGelu(hb, b, tanh);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    EXPECT_LE(MaxRelative(y, torch::gelu(hb.to(torch::kFloat) + b, tanh ? "tanh" : "none")), 1.0 / 128);
  }
}

// transformers' rotate_half RoPE on [b, heads, t, hd] with duplicated-half cos, sin.
torch::Tensor PlainRotary(const torch::Tensor& x_bthd, const torch::Tensor& cos, const torch::Tensor& sin, int64_t rot) {
  auto x = x_bthd.transpose(1, 2);
  auto c = torch::cat({cos, cos}, -1), s = torch::cat({sin, sin}, -1);
  auto r = x.narrow(-1, 0, rot);
  auto halves = r.chunk(2, -1);
  auto rotated = r * c + torch::cat({-halves[1], halves[0]}, -1) * s;
  return torch::cat({rotated, x.narrow(-1, rot, x.size(-1) - rot)}, -1).transpose(1, 2);
}

TEST(FusedOpsTest, RotaryEqualsRotateHalfWithPartialDimsAndItsGradient) {
  torch::manual_seed(3);
  const int64_t b = 2, t = 9, heads = 3, hd = 16;
  for (int64_t rot : {hd, int64_t{8}}) {  // whole head (Llama) and a partial rotation (GPT-NeoX)
    auto freqs = torch::outer(torch::arange(t).to(torch::kFloat), torch::rand({rot / 2}));
    auto cos = freqs.cos().contiguous(), sin = freqs.sin().contiguous();
    const auto x = torch::randn({b, t, heads, hd});
    const auto r = Compare({x}, [&](auto& v) { return FusedRotary(v[0], cos, sin, rot, torch::kFloat); },
                           [&](auto& v) { return PlainRotary(v[0], cos, sin, rot); });
    EXPECT_LE(r.value, 1e-6) << rot;
    EXPECT_LE(r.grads[0], 1e-6) << rot;
  }
}

// A whole block of each family whose pieces are fused, against the same block written op by op
// in LibTorch (transformers' order of operations): the family's output and the gradients of its
// input and of every parameter. fp32 on the CPU, so the fused path is kernels/'s references.
struct BlockCase {
  ModelSpec spec;
  std::map<std::string, torch::Tensor> params;  // block-relative names
};

BlockCase MakeBlock(const std::string& family) {
  BlockCase c;
  c.spec.family = family;
  c.spec.layers = 1;
  c.spec.hidden = 32;
  c.spec.heads = 4;
  c.spec.vocab = 64;
  c.spec.sequence = 12;
  c.spec.ffn = family == "gpt2" ? 128 : 96;
  if (family == "llama") c.spec.kv_heads = 2;
  EXPECT_TRUE(ValidateModelSpec(c.spec, "").ok());
  torch::manual_seed(21);
  for (const model::Parameter& p : model::BlockParameters(c.spec)) {
    const bool norm = p.name.find("norm") != std::string::npos || p.name.find("ln_") != std::string::npos;
    auto t = torch::randn(p.shape) * (norm ? 0.1 : 0.2);
    if (norm && p.name.find("bias") == std::string::npos) t += 1.0;
    c.params[p.name] = t;
  }
  return c;
}

torch::Tensor PlainLlamaBlock(const ModelSpec& m, const std::map<std::string, torch::Tensor>& p, const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), hd = m.head_size(), heads = m.heads, kv = m.kv_heads;
  auto norm = [&](const torch::Tensor& v, const torch::Tensor& w) { return PlainRmsNorm(v, w, m.norm_eps); };
  auto inv_freq = 1.0 / torch::pow(m.rope_theta, torch::arange(0, hd, 2).to(torch::kFloat) / static_cast<double>(hd));
  auto freqs = torch::outer(torch::arange(t).to(torch::kFloat), inv_freq);
  auto cos = torch::cat({freqs, freqs}, -1).cos(), sin = torch::cat({freqs, freqs}, -1).sin();
  auto rope = [&](const torch::Tensor& r) {
    auto halves = r.chunk(2, -1);
    return r * cos + torch::cat({-halves[1], halves[0]}, -1) * sin;
  };
  auto a = norm(x, p.at("input_layernorm.weight"));
  auto q = rope(torch::linear(a, p.at("self_attn.q_proj.weight")).view({b, t, heads, hd}).transpose(1, 2));
  auto k = rope(torch::linear(a, p.at("self_attn.k_proj.weight")).view({b, t, kv, hd}).transpose(1, 2));
  auto v = torch::linear(a, p.at("self_attn.v_proj.weight")).view({b, t, kv, hd}).transpose(1, 2);
  k = k.repeat_interleave(heads / kv, 1);
  v = v.repeat_interleave(heads / kv, 1);
  auto y = compat::CausalAttention(q, k, v).transpose(1, 2).reshape({b, t, heads * hd});
  auto mid = x + torch::linear(y, p.at("self_attn.o_proj.weight"));
  auto n = norm(mid, p.at("post_attention_layernorm.weight"));
  auto hidden = torch::silu(torch::linear(n, p.at("mlp.gate_proj.weight"))) * torch::linear(n, p.at("mlp.up_proj.weight"));
  return mid + torch::linear(hidden, p.at("mlp.down_proj.weight"));
}

torch::Tensor PlainGpt2Block(const ModelSpec& m, const std::map<std::string, torch::Tensor>& p, const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), hd = m.head_size(), heads = m.heads;
  auto ln = [&](const torch::Tensor& v, const std::string& name) {
    return torch::layer_norm(v, {m.hidden}, p.at(name + ".weight"), p.at(name + ".bias"), m.norm_eps);
  };
  auto qkv = torch::linear(ln(x, "ln_1"), p.at("c_attn.weight"), p.at("c_attn.bias")).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
  auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape({b, t, heads * hd});
  auto mid = x + torch::linear(y, p.at("attn_proj.weight")) + p.at("attn_proj.bias");
  auto hidden = torch::gelu(torch::linear(ln(mid, "ln_2"), p.at("c_fc.weight"), p.at("c_fc.bias")), "tanh");
  return mid + torch::linear(hidden, p.at("mlp_proj.weight")) + p.at("mlp_proj.bias");
}

TEST(FusedOpsTest, FusedBlocksEqualTheOpByOpBlockAndItsGradients) {
  for (const std::string family : {"llama", "gpt2"}) {
    BlockCase c = MakeBlock(family);
    auto fused_family = CreateModelFamily(c.spec);
    const auto x0 = torch::randn({2, c.spec.sequence, c.spec.hidden});
    std::vector<std::string> names;
    std::vector<torch::Tensor> ours, theirs;
    std::map<std::string, torch::Tensor> plain_params;
    for (const auto& [name, t] : c.params) {
      names.push_back(name);
      ours.push_back(t.clone().requires_grad_(true));
      theirs.push_back(t.clone().requires_grad_(true));
      plain_params[name] = theirs.back();
    }
    auto x_ours = x0.clone().requires_grad_(true), x_theirs = x0.clone().requires_grad_(true);
    const auto y_ours = fused_family->Block(ParamView(names, ours), x_ours, TensorParallel{}).resid_post;
    const auto y_theirs = family == "llama" ? PlainLlamaBlock(c.spec, plain_params, x_theirs) : PlainGpt2Block(c.spec, plain_params, x_theirs);
    EXPECT_LE(MaxRelative(y_ours, y_theirs), 1e-5) << family;
    const auto dy = torch::randn(y_ours.sizes());
    y_ours.backward(dy);
    y_theirs.backward(dy);
    EXPECT_LE(MaxRelative(x_ours.grad(), x_theirs.grad()), 1e-5) << family << " input gradient";
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_LE(MaxRelative(ours[i].grad(), theirs[i].grad()), 1e-5) << family << " " << names[i];
    }
  }
}

}  // namespace
}  // namespace strata::worker
