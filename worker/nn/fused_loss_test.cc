#include "worker/nn/fused_loss.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

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

// An all-gather among threads (each a tensor-parallel rank): the seam the worker fills with its
// tensor-parallel communicator. Every rank gets the ranks' tensors concatenated in rank order.
class ThreadGather {
 public:
  explicit ThreadGather(int ranks) : slots_(static_cast<size_t>(ranks)) {}
  torch::Tensor Gather(int rank, const torch::Tensor& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    slots_[static_cast<size_t>(rank)] = mine.clone();
    if (++arrived_ == static_cast<int>(slots_.size())) {
      result_ = torch::cat(slots_);
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return generation_ != generation; });
    }
    return result_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<torch::Tensor> slots_;
  torch::Tensor result_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

// Vocab-parallel: each of 2 or 3 ranks holds a slice of the head's rows; every rank's loss is the
// whole loss, its dW the whole dW's rows, and the ranks' dx summed the whole dx - in chunks too.
TEST(LinearCrossEntropyTest, VocabSlicesOnEveryRankGiveTheWholeLossAndGradients) {
  torch::manual_seed(17);
  const int64_t rows = 41, hidden = 16, vocab = 96;
  const auto x0 = torch::randn({rows, hidden}), w0 = torch::randn({vocab, hidden}) * 0.3;
  const auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
  auto x_ref = x0.clone().requires_grad_(true), w_ref = w0.clone().requires_grad_(true);
  const auto reference = PlainLoss(x_ref, w_ref, vocab, targets);
  reference.backward();
  for (int ranks : {2, 3}) {
    for (int64_t chunk : {int64_t{5}, int64_t{0}}) {
      const int64_t slice_rows = vocab / ranks;
      ThreadGather gather(ranks);
      std::vector<torch::Tensor> losses(ranks), dx(ranks), dw(ranks);
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          VocabSlice slice{r * slice_rows, [&gather, r](const torch::Tensor& t) { return gather.Gather(r, t); }};
          auto x = x0.clone().requires_grad_(true);
          auto w = w0.narrow(0, r * slice_rows, slice_rows).clone().requires_grad_(true);
          losses[r] = LinearCrossEntropy(x, w, slice_rows, targets, torch::kFloat, chunk, &slice);
          losses[r].backward();
          dx[r] = x.grad(), dw[r] = w.grad();
        });
      }
      for (auto& t : threads) t.join();
      auto dx_sum = torch::zeros_like(x0);
      for (int r = 0; r < ranks; ++r) {
        EXPECT_NEAR(losses[r].item<double>(), reference.item<double>(), 1e-6 * reference.item<double>())
            << ranks << " ranks, rank " << r;
        EXPECT_EQ(losses[r].item<double>(), losses[0].item<double>()) << "every rank computes the same loss";
        EXPECT_LT(MaxRelative(dw[r], w_ref.grad().narrow(0, r * slice_rows, slice_rows)), 1e-5)
            << ranks << " ranks, rank " << r;
        dx_sum += dx[r];
      }
      EXPECT_LT(MaxRelative(dx_sum, x_ref.grad()), 1e-5) << ranks << " ranks, chunk " << chunk;
    }
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

// A sink that records what the head's backward writes, as StageModel's do: the step's first
// gradient written, the later ones added, into an fp32 buffer of the parameter's shape.
class RecordingSink final : public GradientSink {
 public:
  explicit RecordingSink(torch::Tensor buffer) : buffer_(std::move(buffer)) {}
  torch::Tensor Use(const torch::Tensor& /*param*/, const torch::Tensor& value) override {
    ++uses;
    return value;
  }
  void CountUse() override { ++uses; }
  void Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) override {
    write(buffer_, writes++ == 0);
  }
  const torch::Tensor& buffer() const { return buffer_; }
  int uses = 0, writes = 0;

 private:
  torch::Tensor buffer_;
};

// With a sink, dW goes into it in fp32 (its unpadded rows, scaled by the incoming gradient), and
// not through autograd: the second use adds to the first. From a bf16 weight (computing in fp32)
// the sink holds autograd's fp32 dW of the same values bit for bit, where autograd's own dW comes
// back in the weight's dtype, bf16; dx is the same either way.
TEST(LinearCrossEntropyTest, TheHeadsGradientGoesIntoItsSinkInFp32) {
  torch::manual_seed(5);
  const int64_t rows = 40, hidden = 16, vocab = 61, padded = 64;
  const auto x0 = torch::randn({rows, hidden});
  const auto w_bf16 = (torch::randn({vocab, hidden}) * 0.3).to(torch::kBFloat16);
  const auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
  auto padded_weight = [&](const torch::Tensor& w) { return torch::constant_pad_nd(w, {0, 0, 0, padded - vocab}); };

  auto w_ref = w_bf16.to(torch::kFloat).requires_grad_(true);  // the same values, in fp32
  std::vector<torch::Tensor> dx_ref;
  for (double scale : {3.0, 0.5}) {  // two uses, each scaled
    auto x = x0.clone().requires_grad_(true);
    (LinearCrossEntropy(x, padded_weight(w_ref), vocab, targets, torch::kFloat, 16) * scale).backward();
    dx_ref.push_back(x.grad());
  }
  auto w_autograd = w_bf16.clone().requires_grad_(true);
  (LinearCrossEntropy(x0, padded_weight(w_autograd), vocab, targets, torch::kFloat, 16) * 3.0).backward();
  EXPECT_EQ(w_autograd.grad().scalar_type(), torch::kBFloat16) << "without a sink dW comes back in the weight's dtype";

  const auto param = w_bf16.to(torch::kFloat).requires_grad_(true);
  RecordingSink sink(torch::full({vocab, hidden}, 7.0f));  // garbage the first write overwrites
  int i = 0;
  for (double scale : {3.0, 0.5}) {
    auto x = x0.clone().requires_grad_(true);
    sink.CountUse();
    const HeadGradient into{&sink, param, vocab};
    (LinearCrossEntropy(x, padded_weight(w_bf16), vocab, targets, torch::kFloat, 16, nullptr, &into) * scale)
        .backward();
    EXPECT_TRUE(torch::equal(x.grad(), dx_ref[static_cast<size_t>(i++)])) << "dx";
  }
  EXPECT_EQ(sink.writes, 2);
  EXPECT_EQ(sink.uses, 2);
  EXPECT_EQ(sink.buffer().scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(sink.buffer(), w_ref.grad()))
      << "largest difference " << (sink.buffer() - w_ref.grad()).abs().max().item<float>();
  EXPECT_FALSE(param.grad().defined()) << "the sink's parameter takes no gradient through autograd";
  // Without grad mode nothing is written (the loss only).
  torch::NoGradGuard no_grad;
  const HeadGradient into{&sink, param, vocab};
  LinearCrossEntropy(x0, padded_weight(w_bf16), vocab, targets, torch::kFloat, 16, nullptr, &into);
  EXPECT_EQ(sink.writes, 2);
}

}  // namespace
}  // namespace strata::worker
