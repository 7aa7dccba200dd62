// The fused block pieces (fused_ops.h, kernels/'s CPU references underneath) against the plain
// LibTorch ops they replace: values and gradients, fp32 and bf16 storage.
#include "worker/fused_ops.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace strata::worker
