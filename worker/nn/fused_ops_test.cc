// The fused block pieces (fused_ops.h, kernels/'s CPU references underneath) against the plain
// LibTorch ops they replace: values and gradients, fp32 and bf16 storage.
#include "worker/nn/fused_ops.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/parameters.h"
#include "spec/run_spec.h"
#include "worker/nn/buffer_sink_testing.h"
#include "worker/nn/model_family.h"
#include "worker/nn/torch_compat.h"

namespace strata::worker {
namespace {

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max() / b.to(torch::kFloat).abs().max().clamp_min(1e-30))
      .item<double>();
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
  const auto fp32 = Compare(
      {x, w}, [](auto& v) { return FusedRmsNorm(v[0], v[1], 1e-6, torch::kFloat); },
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
  const auto r = Compare(
      {x, w, b}, [](auto& v) { return FusedLayerNorm(v[0], v[1], v[2], 1e-5, torch::kFloat); },
      [](auto& v) { return torch::layer_norm(v[0], {96}, v[1], v[2], 1e-5); });
  EXPECT_LE(r.value, 1e-6);
  for (double g : r.grads) EXPECT_LE(g, 1e-5);
  auto y = FusedLayerNorm(x, w, b, 1e-5, torch::kBFloat16);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LE(MaxRelative(y, torch::layer_norm(x, {96}, w, b, 1e-5)), 1.0 / 128);
}

// The residual norms (FusedResidual*Norm, FusedAdd*Norm) against the op-by-op form, with each
// of their two outputs used or not: `use_residual` / `use_normed` say which outputs the loss
// reads, so an unused one's gradient reaches the op undefined.
struct ResidualCase {
  bool add, centered;
  torch::ScalarType y_type = torch::kFloat;
};

struct ResidualResult {
  torch::Tensor residual, normed;
  std::vector<torch::Tensor> grads;  // x, (y,) weight, (bias,)
};

ResidualResult RunResidualNorm(const ResidualCase& c, bool fused, bool use_residual, bool use_normed,
                               const torch::Tensor& x0, const torch::Tensor& y0, const torch::Tensor& w0,
                               const torch::Tensor& b0, const torch::Tensor& d_residual,
                               const torch::Tensor& d_normed) {
  auto x = x0.clone().requires_grad_(true), y = y0.clone().requires_grad_(true);
  auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  NormedResidual out;
  if (fused) {
    if (c.add) {
      out = c.centered ? FusedAddLayerNorm(x, y, w, b, 1e-5, torch::kFloat)
                       : FusedAddRmsNorm(x, y, w, 1e-6, torch::kFloat);
    } else {
      out = c.centered ? FusedResidualLayerNorm(x, w, b, 1e-5, torch::kFloat)
                       : FusedResidualRmsNorm(x, w, 1e-6, torch::kFloat);
    }
  } else {
    out.residual = c.add ? x + y : x;
    out.normed =
        c.centered ? torch::layer_norm(out.residual, {x.size(-1)}, w, b, 1e-5) : PlainRmsNorm(out.residual, w, 1e-6);
  }
  auto loss = torch::zeros({});
  if (use_residual) loss = loss + (out.residual.to(torch::kFloat) * d_residual).sum();
  if (use_normed) loss = loss + (out.normed * d_normed).sum();
  loss.backward();
  ResidualResult r{out.residual.detach(), out.normed.detach(), {x.grad()}};
  if (c.add) r.grads.push_back(y.grad());
  r.grads.push_back(w.grad());
  if (c.centered) r.grads.push_back(b.grad());
  return r;
}

TEST(FusedOpsTest, ResidualNormsEqualTheOpByOpFormWhicheverOutputsAreUsed) {
  const std::vector<ResidualCase> cases = {{false, false},
                                           {false, true},
                                           {true, false},
                                           {true, true},
                                           {true, false, torch::kBFloat16},
                                           {true, true, torch::kBFloat16}};
  for (const ResidualCase& c : cases) {
    for (auto [use_residual, use_normed] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      SCOPED_TRACE(std::string(c.add ? "FusedAdd" : "FusedResidual") + (c.centered ? "LayerNorm" : "RmsNorm") +
                   (c.y_type == torch::kBFloat16 ? " bf16 y" : "") + " residual " + (use_residual ? "used" : "unused") +
                   ", normed " + (use_normed ? "used" : "unused"));
      torch::manual_seed(31);
      const auto x = torch::randn({3, 5, 96}) + 0.2, y = torch::randn({3, 5, 96}).to(c.y_type);
      const auto w = torch::randn({96}) * 0.1 + 1, b = torch::randn({96}) * 0.1;
      const auto d_residual = torch::randn({3, 5, 96}), d_normed = torch::randn({3, 5, 96});
      const auto ours = RunResidualNorm(c, true, use_residual, use_normed, x, y, w, b, d_residual, d_normed);
      const auto theirs = RunResidualNorm(c, false, use_residual, use_normed, x, y, w, b, d_residual, d_normed);
      EXPECT_EQ(ours.residual.scalar_type(), theirs.residual.scalar_type());
      EXPECT_TRUE(torch::equal(ours.residual, theirs.residual)) << "the residual is x (+ y) exactly";
      EXPECT_LE(MaxRelative(ours.normed, theirs.normed), 1e-6);
      ASSERT_EQ(ours.grads.size(), theirs.grads.size());
      for (size_t i = 0; i < ours.grads.size(); ++i) {
        ASSERT_EQ(ours.grads[i].defined(), theirs.grads[i].defined()) << "gradient " << i;
        if (!theirs.grads[i].defined()) continue;  // the weight's, with the norm unused
        EXPECT_EQ(ours.grads[i].scalar_type(), theirs.grads[i].scalar_type()) << "gradient " << i;
        // bf16 y's gradient: the same fp32 value rounded once to bf16 (one ulp where the two
        // fp32 values straddle a rounding boundary).
        const bool bf16 = ours.grads[i].scalar_type() == torch::kBFloat16;
        EXPECT_LE(MaxRelative(ours.grads[i], theirs.grads[i]), bf16 ? 1.0 / 128 : 1e-5) << "gradient " << i;
      }
      if (!use_normed) {
        // No norm gradient: dx (and dy) is the residual's gradient alone, exactly.
        EXPECT_TRUE(torch::equal(ours.grads[0], d_residual));
      }
    }
  }
}

TEST(FusedOpsTest, FusedResidualNormGivesBackXItselfAndItsGradientMeetsTheNorms) {
  torch::manual_seed(32);
  const auto x0 = torch::randn({4, 7, 64}), w = torch::randn({64});
  auto x = x0.clone().requires_grad_(true);
  auto out = FusedResidualRmsNorm(x, w, 1e-6, torch::kFloat);
  // A view of x, not a copy: no memory traffic in the forward.
  EXPECT_EQ(out.residual.data_ptr(), x.data_ptr());
  EXPECT_TRUE(torch::equal(out.residual, x0));
  // Its gradient edge is the fused op's, so x's two gradients meet in the norm's kernel: x's
  // gradient comes from one node, not an autograd add of two.
  ASSERT_NE(out.residual.grad_fn(), nullptr);
  EXPECT_EQ(out.residual.grad_fn(), out.normed.grad_fn());
  // x that needs no gradient (a pipeline stage's detached input): the weight's is still right.
  auto wg = w.clone().requires_grad_(true), wp = w.clone().requires_grad_(true);
  auto dn = torch::randn({4, 7, 64});
  auto fused = FusedResidualRmsNorm(x0, wg, 1e-6, torch::kFloat);
  ((fused.residual * 2).sum() + (fused.normed * dn).sum()).backward();
  (PlainRmsNorm(x0, wp, 1e-6) * dn).sum().backward();
  EXPECT_LE(MaxRelative(wg.grad(), wp.grad()), 1e-5);
  // Without autograd (activation capture): the same values, nothing recorded.
  torch::NoGradGuard no_grad;
  auto again = FusedAddRmsNorm(x, x0, w, 1e-6, torch::kFloat);
  EXPECT_TRUE(torch::equal(again.residual, x0 + x0));
  EXPECT_EQ(again.normed.grad_fn(), nullptr);
  EXPECT_LE(MaxRelative(again.normed, PlainRmsNorm(x0 + x0, w, 1e-6)), 1e-6);
}

TEST(FusedOpsTest, FusedAddNormUnderAutocastTypesKeepsAnFp32ResidualAndBf16Outputs) {
  // What the trainer's autocast hands the block: an fp32 residual, a bf16 sublayer output, the
  // norm's output in bf16. The sum is fp32 (as LibTorch's), y's gradient bf16.
  torch::manual_seed(33);
  const auto x0 = torch::randn({2, 9, 128}), y0 = torch::randn({2, 9, 128}).to(torch::kBFloat16),
             w = torch::randn({128});
  auto x = x0.clone().requires_grad_(true), y = y0.clone().requires_grad_(true);
  auto out = FusedAddRmsNorm(x, y, w, 1e-6, torch::kBFloat16);
  EXPECT_EQ(out.residual.scalar_type(), torch::kFloat);
  EXPECT_EQ(out.normed.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(out.residual, x0 + y0));
  EXPECT_LE(MaxRelative(out.normed, PlainRmsNorm(x0 + y0, w, 1e-6)), 1.0 / 128);
  const auto d_residual = torch::randn({2, 9, 128});
  torch::autograd::backward({out.residual, out.normed}, {d_residual, torch::randn({2, 9, 128}).to(torch::kBFloat16)});
  EXPECT_EQ(x.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(y.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y.grad(), x.grad().to(torch::kBFloat16))) << "dy is dx rounded once";
}

TEST(FusedOpsTest, SwiGluEqualsSiluTimesUpAndItsGradients) {
  torch::manual_seed(2);
  const auto g = torch::randn({4, 7, 33}) * 3, u = torch::randn({4, 7, 33});
  const auto r = Compare(
      {g, u}, [](auto& v) { return FusedSwiGlu(v[0], v[1]); }, [](auto& v) { return torch::silu(v[0]) * v[1]; });
  EXPECT_LE(r.value, 1e-6);  // LibTorch's vectorised exp rounds differently in the last bit
  EXPECT_LE(r.grads[0], 1e-6);
  EXPECT_LE(r.grads[1], 1e-6);
  const auto rb = Compare(
      {g.to(torch::kBFloat16), u.to(torch::kBFloat16)}, [](auto& v) { return FusedSwiGlu(v[0], v[1]); },
      [](auto& v) { return (torch::silu(v[0].to(torch::kFloat)) * v[1].to(torch::kFloat)).to(torch::kBFloat16); });
  EXPECT_LE(rb.value, 1.0 / 128);
  EXPECT_LE(rb.grads[0], 2.0 / 128);
  EXPECT_LE(rb.grads[1], 2.0 / 128);
}

TEST(FusedOpsTest, BiasGeluEqualsGeluOfTheBiasedInputAndItsGradients) {
  torch::manual_seed(5);
  const auto h = torch::randn({4, 6, 40}) * 2, b = torch::randn({40});
  for (const bool tanh : {true, false}) {
    const auto r = Compare(
        {h, b}, [&](auto& v) { return FusedBiasGelu(v[0], v[1], tanh); },
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
torch::Tensor PlainRotary(const torch::Tensor& x_bthd, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rot) {
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
    const auto r = Compare(
        {x}, [&](auto& v) { return FusedRotary(v[0], cos, sin, rot, torch::kFloat); },
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
  c.spec.family = ParseChoice<Family>(family).value();
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

torch::Tensor PlainLlamaBlock(const ModelSpec& m, const std::map<std::string, torch::Tensor>& p,
                              const torch::Tensor& x) {
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
  auto hidden =
      torch::silu(torch::linear(n, p.at("mlp.gate_proj.weight"))) * torch::linear(n, p.at("mlp.up_proj.weight"));
  return mid + torch::linear(hidden, p.at("mlp.down_proj.weight"));
}

torch::Tensor PlainGpt2Block(const ModelSpec& m, const std::map<std::string, torch::Tensor>& p,
                             const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), hd = m.head_size(), heads = m.heads;
  auto ln = [&](const torch::Tensor& v, const std::string& name) {
    return torch::layer_norm(v, {m.hidden}, p.at(name + ".weight"), p.at(name + ".bias"), m.norm_eps);
  };
  auto qkv = torch::linear(ln(x, "ln_1"), p.at("c_attn.weight"), p.at("c_attn.bias"))
                 .view({b, t, 3, heads, hd})
                 .permute({2, 0, 3, 1, 4});
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
    const auto y_theirs = family == "llama" ? PlainLlamaBlock(c.spec, plain_params, x_theirs)
                                            : PlainGpt2Block(c.spec, plain_params, x_theirs);
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

// Fused (no patch) and op-by-op (a patch that leaves every site as it is) runs of one block: the
// captured sites, the output and every gradient agree - on the CPU in fp32 the residual norms
// compute the same sums in the same order, so within 1e-6 (in practice equal).
TEST(FusedOpsTest, PatchedBlocksTakeTheOpByOpPathWithTheSameSitesAndGradients) {
  for (const std::string family : {"llama", "gpt2", "gemma"}) {
    SCOPED_TRACE(family);
    BlockCase c = MakeBlock(family == "gemma" ? "llama" : family);
    c.spec.family = ParseChoice<Family>(family).value();
    auto model = CreateModelFamily(c.spec);
    const auto x0 = torch::randn({2, c.spec.sequence, c.spec.hidden});
    std::vector<std::string> names;
    for (const auto& [name, t] : c.params) names.push_back(name);
    int patch_calls = 0;
    BlockRequest identity;
    identity.patch = [&](const std::string&, const torch::Tensor& v) {
      ++patch_calls;
      return v;
    };
    struct Run {
      BlockOutputs out;
      torch::Tensor x;
      std::vector<torch::Tensor> params;
    };
    auto run = [&](const BlockRequest& request) {
      Run r;
      for (const auto& [name, t] : c.params) r.params.push_back(t.clone().requires_grad_(true));
      r.x = x0.clone().requires_grad_(true);
      r.out = model->Block(ParamView(names, r.params), r.x, TensorParallel{}, request);
      torch::manual_seed(5);
      r.out.resid_post.backward(torch::randn(r.out.resid_post.sizes()));
      return r;
    };
    const Run fused = run({}), plain = run(identity);
    EXPECT_EQ(patch_calls, 6) << "every patchable site offered to the patch";
    // The two runs took different paths: resid_mid from the fused op, or from LibTorch's add.
    auto made_by = [](const torch::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : std::string("(none)"); };
    const bool fused_norms = family != "gemma";  // Gemma's norm has no fused form
    EXPECT_EQ(made_by(fused.out.resid_mid).find("ResidualNormFunction") != std::string::npos, fused_norms)
        << made_by(fused.out.resid_mid);
    EXPECT_EQ(made_by(plain.out.resid_mid).find("ResidualNormFunction"), std::string::npos)
        << made_by(plain.out.resid_mid);
    for (const char* site : {"resid_pre", "attn_out", "resid_mid", "mlp_hidden", "mlp_out", "resid_post"}) {
      EXPECT_LE(MaxRelative(fused.out.Site(site), plain.out.Site(site)), 1e-6) << site;
    }
    EXPECT_LE(MaxRelative(fused.x.grad(), plain.x.grad()), 1e-6) << "input gradient";
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_LE(MaxRelative(fused.params[i].grad(), plain.params[i].grad()), 1e-6) << names[i];
  }
}

TEST(FusedOpsTest, LinearIntoGradientWritesThenAddsTheWeightGradientAndEqualsTorchLinear) {
  torch::manual_seed(11);
  const auto x = torch::randn({2, 5, 8}), w = torch::randn({6, 8}), b = torch::randn({6});
  const auto dy1 = torch::randn({2, 5, 6}), dy2 = torch::randn({2, 5, 6});
  // Two uses of one weight in a step, as a tied or reused matrix has; the buffer starts as garbage.
  BufferSink sink(torch::full({6, 8}, std::nan("")));
  const auto x_ours = x.clone().requires_grad_(true), b_ours = b.clone().requires_grad_(true);
  const auto param = w.clone().requires_grad_(true);
  const auto y1 = LinearIntoGradient(x_ours, param, param, b_ours, &sink);
  const auto y2 = LinearIntoGradient(x_ours * 2, param, param, torch::Tensor(), &sink);
  ((y1 * dy1).sum() + (y2 * dy2).sum()).backward();

  const auto x_ref = x.clone().requires_grad_(true), b_ref = b.clone().requires_grad_(true),
             w_ref = w.clone().requires_grad_(true);
  const auto r1 = torch::linear(x_ref, w_ref, b_ref), r2 = torch::linear(x_ref * 2, w_ref);
  ((r1 * dy1).sum() + (r2 * dy2).sum()).backward();

  EXPECT_EQ(sink.uses, 2);
  EXPECT_EQ(sink.received, 2);
  EXPECT_FALSE(param.grad().defined()) << "the weight's gradient went through autograd as well as the sink";
  EXPECT_TRUE(torch::equal(y1, r1));
  EXPECT_TRUE(torch::equal(y2, r2));
  EXPECT_LT(MaxRelative(sink.buffer, w_ref.grad()), 1e-6);
  EXPECT_LT(MaxRelative(x_ours.grad(), x_ref.grad()), 1e-6);
  EXPECT_TRUE(torch::equal(b_ours.grad(), b_ref.grad()));

  // Under no_grad it is torch::linear and counts no use.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(LinearIntoGradient(x, param, param, b, &sink), torch::linear(x, w, b)));
  EXPECT_EQ(sink.uses, 2);
}

// Put off (tensor parallel's overlap, fused_linear.h): the backward gives dx and db at once and
// queues dW; the sink sees nothing until the queue runs, then the same bytes as written at once,
// in the order the uses' backwards ran.
TEST(FusedOpsTest, DeferredWeightGradientsWaitForTheirQueueAndEqualTheImmediateOnes) {
  torch::manual_seed(12);
  const auto x = torch::randn({3, 4, 8}), w = torch::randn({6, 8});
  const auto dy1 = torch::randn({3, 4, 6}), dy2 = torch::randn({3, 4, 6});
  auto run = [&](DeferredWeightGradients* defer, BufferSink& sink) {
    const auto x_in = x.clone().requires_grad_(true);
    const auto param = w.clone().requires_grad_(true);
    const auto y1 = LinearIntoGradient(x_in, param, param, torch::Tensor(), &sink, defer);
    const auto y2 = LinearIntoGradient(x_in * 3, param, param, torch::Tensor(), &sink, defer);
    ((y1 * dy1).sum() + (y2 * dy2).sum()).backward();
    return x_in.grad();
  };
  BufferSink now(torch::full({6, 8}, std::nan(""))), later(torch::full({6, 8}, std::nan("")));
  const auto dx_now = run(nullptr, now);
  DeferredWeightGradients queue;
  const auto dx_later = run(&queue, later);
  EXPECT_TRUE(torch::equal(dx_now, dx_later)) << "dx must not wait for the queue";
  EXPECT_EQ(later.received, 0) << "a deferred weight gradient reached the sink before its queue ran";
  EXPECT_FALSE(queue.empty());
  EXPECT_EQ(queue.RunAll(), 2);
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(later.received, 2);
  EXPECT_TRUE(torch::equal(later.buffer, now.buffer));

  // A backward that failed part-way: its put-off writes are dropped, never run.
  BufferSink dropped(torch::full({6, 8}, std::nan("")));
  run(&queue, dropped);
  queue.Clear();
  EXPECT_EQ(queue.RunAll(), 0);
  EXPECT_EQ(dropped.received, 0);
}

// Tensor parallel's forward overlap (tensor_parallel.h): the rows named ahead are multiplied while
// the others are still being gathered - here they hold NaN until the wait writes them - and the
// result is torch::linear's of the whole input, with and without a bias, with and without grad.
TEST(FusedOpsTest, LinearRowsAheadReadTheOtherRowsOnlyAfterTheWait) {
  torch::manual_seed(13);
  const auto x = torch::randn({2, 6, 8}), w = torch::randn({5, 8}), bias = torch::randn({5});
  for (const bool with_bias : {false, true}) {
    for (const bool grad : {false, true}) {
      const std::string what = std::string(with_bias ? "bias" : "no bias") + (grad ? ", grad" : ", no grad");
      torch::Tensor arriving = torch::full({2, 6, 8}, std::nan(""));
      arriving.view({12, 8}).narrow(0, 4, 4).copy_(x.view({12, 8}).narrow(0, 4, 4));  // rows 4..7 are here
      int waits = 0;
      const RowsAhead ahead{4, 8, [&] {
                              ++waits;
                              arriving.copy_(x);
                            }};
      BufferSink sink(torch::zeros({5, 8}));
      torch::Tensor y;
      {
        const torch::AutoGradMode mode(grad);
        y = LinearIntoGradient(arriving, w, w, with_bias ? bias : torch::Tensor(), &sink, nullptr, &ahead);
      }
      EXPECT_EQ(waits, 1) << what;
      EXPECT_TRUE(torch::equal(y, torch::linear(x, w, with_bias ? bias : torch::Tensor()))) << what;
    }
  }
}

TEST(FusedOpsTest, ParamViewCountsOneSinkUsePerViewAccessAndOnePerLinear) {
  torch::manual_seed(12);
  const auto w = torch::randn({4, 3}).requires_grad_(true), bias = torch::randn({4}).requires_grad_(true);
  BufferSink w_sink(torch::zeros({4, 3})), b_sink(torch::zeros({4}));
  const ParamView p({"w", "b"}, {w, bias}, {SunkParameter{w, &w_sink}, SunkParameter{bias, &b_sink}});
  const auto x = torch::randn({5, 3});
  auto y = p.Linear(x, "w", "b") + p.Linear(x, "w");
  EXPECT_EQ(w_sink.uses, 2);
  EXPECT_EQ(b_sink.uses, 1);
  (void)p("b");  // the view's one use of the bias, made on its first access
  EXPECT_EQ(b_sink.uses, 1);
  EXPECT_EQ(w_sink.received, 0);
  y.sum().backward();
  EXPECT_EQ(w_sink.received, 2);
  EXPECT_TRUE(torch::allclose(w_sink.buffer, 2 * torch::ones({5, 4}).t().mm(x)));
}

}  // namespace
}  // namespace strata::worker
