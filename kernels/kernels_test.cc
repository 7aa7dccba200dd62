// Each kernel's CPU reference against a plain LibTorch implementation of the same maths (the
// op-by-op AdamW the trainer ran before kernels/). The bound: fp32 rounding of the update - the
// reference computes each element's expression once, LibTorch's vectorized ops may fuse a
// multiply-add; both hold every intermediate in fp32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

struct AdamState {
  torch::Tensor p, m, v;
};

// What worker/trainer.cc did per unit before the fused kernel.
void LibTorchAdamW(const AdamWArgs& a, AdamState& s, torch::Tensor g, const torch::Tensor& decay_mask) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step)), bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  if (a.grad_scale != 1.0) g = g * a.grad_scale;
  if (a.weight_decay > 0) s.p.mul_(decay_mask.mul(-a.lr * a.weight_decay).add_(1.0));
  s.m.mul_(a.beta1).add_(g, 1.0 - a.beta1);
  s.v.mul_(a.beta2).addcmul_(g, g, 1.0 - a.beta2);
  auto denom = (s.v.sqrt() / std::sqrt(bc2)).add_(a.eps);
  s.p.addcdiv_(s.m, denom, -a.lr / bc1);
}

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(KernelsTest, AdamWReferenceEqualsLibTorchOpByOpOverManySteps) {
  torch::manual_seed(3);
  const int64_t n = 10007;  // odd: no vector-width remainder hides
  auto decay = (torch::rand({n}) > 0.3).to(torch::kFloat);
  AdamState ours{torch::randn({n}), torch::zeros({n}), torch::zeros({n})};
  AdamState theirs{ours.p.clone(), ours.m.clone(), ours.v.clone()};
  for (int64_t step = 1; step <= 50; ++step) {
    const AdamWArgs a{3e-3, 0.9, 0.95, 1e-8, 0.1, step, step % 3 == 0 ? 0.37 : 1.0};
    auto g = torch::randn({n}) * (step % 7 == 0 ? 1e-4 : 1.0);
    AdamWReference(a, ours.p.data_ptr<float>(), g.data_ptr<float>(), ours.m.data_ptr<float>(), ours.v.data_ptr<float>(),
                   decay.data_ptr<float>(), n);
    LibTorchAdamW(a, theirs, g, decay);
  }
  EXPECT_LE(MaxRelative(ours.p, theirs.p), 1e-6);
  EXPECT_LE(MaxRelative(ours.m, theirs.m), 1e-6);
  EXPECT_LE(MaxRelative(ours.v, theirs.v), 1e-6);
  EXPECT_GT((ours.p - theirs.p).abs().max().item<double>(), -1.0);  // shapes and values are real
}

TEST(KernelsTest, AdamWWithoutDecayLeavesUndecayedWeightsToTheMomentsAlone) {
  // weight_decay 0 multiplies by exactly 1: one step from zero moments moves every weight by
  // lr * sign(g) (Adam's first step), whatever the mask says.
  torch::manual_seed(7);
  const int64_t n = 64;
  auto p = torch::randn({n}), g = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  auto mask = torch::ones({n});
  const auto before = p.clone();
  AdamWReference({1e-2, 0.9, 0.999, 1e-12, 0.0, 1, 1.0}, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                 v.data_ptr<float>(), mask.data_ptr<float>(), n);
  // Within fp32 rounding of p itself: |p| < 8 here, whose ulp is 9.5e-7.
  EXPECT_LE(((before - p) - 1e-2 * g.sign()).abs().max().item<double>(), 1e-6);
  EXPECT_GT((before - p).abs().min().item<double>(), 0.9e-2);  // every weight moved by lr
}

TEST(KernelsTest, MaskedSquareSumEqualsLibTorchAndAccumulates) {
  torch::manual_seed(4);
  const int64_t n = 100003;
  auto g = torch::randn({n}), mask = (torch::rand({n}) > 0.5).to(torch::kFloat);
  float out = 2.5f;  // accumulates: units of a step add into one scalar
  MaskedSquareSumReference(g.data_ptr<float>(), mask.data_ptr<float>(), n, &out);
  const double expected = 2.5 + (g * mask).pow(2).sum().item<double>();
  EXPECT_NEAR(out, expected, 1e-6 * expected);
  // Place{cuda=false} runs the reference.
  float again = 2.5f;
  float scratch[1];
  MaskedSquareSum(Place{}, g.data_ptr<float>(), mask.data_ptr<float>(), n, &again, scratch);
  EXPECT_EQ(again, out);
}

// The loss and gradient as LibTorch's own ops give them, in fp32 from the stored logits.
void LibTorchCrossEntropy(const torch::Tensor& logits, int64_t vocab, const torch::Tensor& targets, float scale,
                          torch::Tensor* row_loss, torch::Tensor* grad) {
  auto z = logits.to(torch::kFloat).narrow(1, 0, vocab).clone().requires_grad_(true);
  auto losses = torch::nn::functional::cross_entropy(
      z, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  (losses.sum() * scale).backward();
  *row_loss = losses.detach();
  *grad = torch::zeros({logits.size(0), logits.size(1)});
  grad->narrow(1, 0, vocab).copy_(z.grad());
}

TEST(KernelsTest, CrossEntropyReferenceEqualsLibTorchInFp32AndBf16) {
  torch::manual_seed(8);
  const int64_t rows = 37, vocab = 1003, stride = 1024;  // padding columns past the vocabulary
  auto logits = torch::randn({rows, stride}) * 4;
  logits.narrow(1, vocab, stride - vocab).fill_(100.0f);  // padding must not count
  auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
  targets[0] = vocab - 1;
  targets[1] = 0;
  const float scale = 1.0f / rows;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto stored = logits.to(dtype).contiguous();
    torch::Tensor expected_loss, expected_grad;
    LibTorchCrossEntropy(stored, vocab, targets, scale, &expected_loss, &expected_grad);
    auto ours = stored.clone();
    auto loss = torch::empty({rows});
    CrossEntropyGradInPlace(Place{}, dtype == torch::kFloat ? DType::kFloat32 : DType::kBFloat16, ours.data_ptr(), rows, vocab,
                            stride, targets.data_ptr<int64_t>(), scale, loss.data_ptr<float>());
    EXPECT_LE(MaxRelative(loss, expected_loss), 1e-6) << dtype;
    if (dtype == torch::kFloat) {
      EXPECT_LE((ours - expected_grad).abs().max().item<double>(), 1e-6 * scale) << "fp32 gradient";
    } else {
      // The same fp32 gradient rounded once to bf16: equal to LibTorch's gradient rounded to
      // bf16, except where the two fp32 values straddle a rounding boundary (one bf16 ulp).
      auto theirs = expected_grad.to(torch::kBFloat16).to(torch::kFloat);
      auto diff = (ours.to(torch::kFloat) - theirs).abs();
      EXPECT_LE((diff - theirs.abs() * (1.0 / 128)).max().item<double>(), 1e-12) << "bf16 gradient within one ulp";
      EXPECT_GT(diff.eq(0).to(torch::kFloat).mean().item<double>(), 0.99) << "bf16 gradient mostly bit-equal";
    }
    EXPECT_EQ(ours.narrow(1, vocab, stride - vocab).abs().max().item<double>(), 0.0) << "padding columns get gradient 0";
  }
}

}  // namespace
}  // namespace strata::kernels
