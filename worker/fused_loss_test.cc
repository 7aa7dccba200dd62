#include "worker/fused_loss.h"

#include <gtest/gtest.h>

namespace strata::worker {
namespace {

// The plain LibTorch loss the fused one replaces: whole fp32 logits, then cross_entropy.
torch::Tensor PlainLoss(const torch::Tensor& x, const torch::Tensor& w, int64_t vocab, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(torch::linear(x, w).narrow(1, 0, vocab), targets);
}

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

TEST(LinearCrossEntropyTest, EqualsThePlainLossAndItsGradientsForAnyChunking) {
  torch::manual_seed(7);
  const int64_t rows = 50, hidden = 24, vocab = 61, padded = 64;  // padding rows never count
  const auto x0 = torch::randn({rows, hidden});
  const auto w0 = torch::randn({padded, hidden}) * 0.3;
  const auto targets = torch::randint(0, vocab, {rows}, torch::kLong);

  auto x_ref = x0.clone().requires_grad_(true), w_ref = w0.clone().requires_grad_(true);
  const auto reference = PlainLoss(x_ref, w_ref, vocab, targets);
  reference.backward();

  for (int64_t chunk : {int64_t{7}, int64_t{16}, rows, int64_t{0}}) {
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    const auto loss = LinearCrossEntropy(x, w, vocab, targets, torch::kFloat, chunk);
    loss.backward();
    // fp32: the same maths in another summation order (chunks, logsumexp vs log_softmax).
    EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-6 * reference.item<double>()) << "chunk " << chunk;
    EXPECT_LT(MaxRelative(x.grad(), x_ref.grad()), 1e-5) << "chunk " << chunk;
    EXPECT_LT(MaxRelative(w.grad(), w_ref.grad()), 1e-5) << "chunk " << chunk;
    EXPECT_EQ(w.grad().narrow(0, vocab, padded - vocab).abs().max().item<float>(), 0.0f) << "padding got a gradient";
  }
}

TEST(LinearCrossEntropyTest, ChunksHoldAFixedBudgetOfLogits) {
  EXPECT_EQ(LinearCrossEntropyChunkRows(100, 256, 4), 100);  // fits whole
  for (int64_t bytes : {2, 4}) {
    const int64_t gpt2 = LinearCrossEntropyChunkRows(8 * 1024, 50304, bytes);
    EXPECT_EQ(gpt2 % 64, 0);
    EXPECT_LE(gpt2 * 50304 * bytes, kChunkLogitBytes);
    EXPECT_GT((gpt2 + 64) * 50304 * bytes, kChunkLogitBytes);
  }
  EXPECT_EQ(LinearCrossEntropyChunkRows(1 << 20, int64_t{1} << 30, 2), 64);  // at least 64 rows
}

TEST(LinearCrossEntropyTest, GradientsOnlyWhereRequiredAndScaledByTheIncomingGradient) {
  torch::manual_seed(11);
  const int64_t rows = 33, hidden = 8, vocab = 64;
  const auto x0 = torch::randn({rows, hidden}), w0 = torch::randn({vocab, hidden});
  const auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
  auto x_ref = x0.clone().requires_grad_(true);
  (PlainLoss(x_ref, w0, vocab, targets) * 3.0).backward();
  auto x = x0.clone().requires_grad_(true);
  const auto w = w0.clone();  // frozen: no dW is made
  (LinearCrossEntropy(x, w, vocab, targets, torch::kFloat, 10) * 3.0).backward();
  EXPECT_LT(MaxRelative(x.grad(), x_ref.grad()), 1e-5);
  EXPECT_FALSE(w.grad().defined());
  // Without any gradient wanted it is just the loss.
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(LinearCrossEntropy(x0, w0, vocab, targets, torch::kFloat).item<double>(),
              PlainLoss(x0, w0, vocab, targets).item<double>(), 1e-5);
}

}  // namespace
}  // namespace strata::worker
