// Each kernel's CPU reference against a plain LibTorch implementation of the same maths (the
// op-by-op AdamW the trainer ran before kernels/). The bound: fp32 rounding of the update - the
// reference computes each element's expression once, LibTorch's vectorized ops may fuse a
// multiply-add; both hold every intermediate in fp32.
#include "kernels/kernels.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace strata::kernels {
namespace {

struct AdamState {
  torch::Tensor p, m, v;
};

// What worker/train/trainer.cc did per unit before the fused kernel.
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

// AdamW over [0, n) as the optimizer calls it: the decayed span [0, decayed) with
// a.weight_decay, the rest with none.
template <typename Update>
void OverSpans(const AdamWArgs& a, int64_t decayed, int64_t n, Update update) {
  update(a, 0, decayed);
  AdamWArgs none = a;
  none.weight_decay = 0;
  update(none, decayed, n - decayed);
}

TEST(KernelsTest, AdamWReferenceEqualsLibTorchOpByOpOverManySteps) {
  torch::manual_seed(3);
  const int64_t n = 10007, decayed = 6001;  // odd: no vector-width remainder hides
  auto decay = torch::cat({torch::ones({decayed}), torch::zeros({n - decayed})});
  AdamState ours{torch::randn({n}), torch::zeros({n}), torch::zeros({n})};
  AdamState theirs{ours.p.clone(), ours.m.clone(), ours.v.clone()};
  for (int64_t step = 1; step <= 50; ++step) {
    const AdamWArgs a{3e-3, 0.9, 0.95, 1e-8, 0.1, step, step % 3 == 0 ? 0.37 : 1.0};
    auto g = torch::randn({n}) * (step % 7 == 0 ? 1e-4 : 1.0);
    OverSpans(a, decayed, n, [&](const AdamWArgs& args, int64_t at, int64_t len) {
      AdamWReference(args, ours.p.data_ptr<float>() + at, g.data_ptr<float>() + at, ours.m.data_ptr<float>() + at,
                     ours.v.data_ptr<float>() + at, len);
    });
    LibTorchAdamW(a, theirs, g, decay);
  }
  EXPECT_LE(MaxRelative(ours.p, theirs.p), 1e-6);
  EXPECT_LE(MaxRelative(ours.m, theirs.m), 1e-6);
  EXPECT_LE(MaxRelative(ours.v, theirs.v), 1e-6);
  EXPECT_GT((ours.p - theirs.p).abs().max().item<double>(), -1.0);  // shapes and values are real
}

TEST(KernelsTest, AdamWWithoutDecayLeavesUndecayedWeightsToTheMomentsAlone) {
  // weight_decay 0 multiplies by exactly 1: one step from zero moments moves every weight by
  // lr * sign(g) (Adam's first step).
  torch::manual_seed(7);
  const int64_t n = 64;
  auto p = torch::randn({n}), g = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  const auto before = p.clone();
  AdamWReference({1e-2, 0.9, 0.999, 1e-12, 0.0, 1, 1.0}, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                 v.data_ptr<float>(), n);
  // Within fp32 rounding of p itself: |p| < 8 here, whose ulp is 9.5e-7.
  EXPECT_LE(((before - p) - 1e-2 * g.sign()).abs().max().item<double>(), 1e-6);
  EXPECT_GT((before - p).abs().min().item<double>(), 0.9e-2);  // every weight moved by lr
}

// The host AdamW that CPU workers and offloaded optimizers run: vectorised and threaded, equal to
// the reference bit for bit - over spans of odd lengths and offsets (no vector-width remainder or
// alignment hides), across thread counts, with gradients spanning 1e-30..1e4, zeros, and
// clipping's scale, over many steps.
TEST(KernelsTest, HostAdamWEqualsTheReferenceBitForBit) {
  torch::manual_seed(11);
  const int64_t n = (3 << 20) + 7;  // over the threading threshold: several threads really run
  for (const int threads : {1, 3, 8}) {
    const auto p0 = torch::randn({n});
    AdamState ref{p0.clone(), torch::zeros({n}), torch::zeros({n})},
        host{p0.clone(), torch::zeros({n}), torch::zeros({n})};
    for (int64_t step = 1; step <= 6; ++step) {
      auto g = torch::randn({n}) * torch::pow(10.0, torch::randint(-30, 5, {n}).to(torch::kFloat));
      g.narrow(0, 100, 50).zero_();
      const AdamWArgs a{1e-3, 0.9, 0.95, 1e-8, 0.1, step, step == 3 ? 0.25 : 1.0};
      for (auto [at, len] : {std::pair<int64_t, int64_t>{0, 1}, {1, 1000003}, {1000004, n - 1000004}}) {
        AdamWArgs args = a;
        if (at == 1) args.weight_decay = 0;  // a span of norms and biases
        AdamWReference(args, ref.p.data_ptr<float>() + at, g.data_ptr<float>() + at, ref.m.data_ptr<float>() + at,
                       ref.v.data_ptr<float>() + at, len);
        AdamWHost(args, host.p.data_ptr<float>() + at, g.data_ptr<float>() + at, host.m.data_ptr<float>() + at,
                  host.v.data_ptr<float>() + at, len, threads);
      }
    }
    EXPECT_TRUE(torch::equal(host.p, ref.p)) << threads << " threads";
    EXPECT_TRUE(torch::equal(host.m, ref.m)) << threads << " threads";
    EXPECT_TRUE(torch::equal(host.v, ref.v)) << threads << " threads";
    EXPECT_FALSE(torch::equal(host.p, p0));  // the parameters moved
  }
}

// The bf16 working copy written in the update's pass equals LibTorch's cast of the updated fp32
// weights bit for bit (round to nearest even), and the fp32 update is the one without it.
TEST(KernelsTest, AdamWWritesTheBf16WorkingCopyAsLibTorchCastsIt) {
  torch::manual_seed(12);
  const int64_t n = 4099;
  auto p = torch::randn({n}) * torch::pow(10.0, torch::randint(-6, 6, {n}).to(torch::kFloat));
  auto g = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  auto working = torch::empty({n}, torch::kBFloat16);
  const AdamWArgs a{1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
  AdamW(Place{}, a, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n,
        reinterpret_cast<uint16_t*>(working.data_ptr()));
  AdamWReference(a, p2.data_ptr<float>(), g.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(), n);
  EXPECT_TRUE(torch::equal(p, p2));
  EXPECT_TRUE(torch::equal(working, p.to(torch::kBFloat16)));
}

TEST(KernelsTest, SquareSumEqualsLibTorchAndAccumulates) {
  torch::manual_seed(4);
  const int64_t n = 100003;
  auto g = torch::randn({n});
  float out = 2.5f;  // accumulates: spans of a step add into one scalar
  SquareSumReference(g.data_ptr<float>(), n, &out);
  const double expected = 2.5 + g.pow(2).sum().item<double>();
  EXPECT_NEAR(out, expected, 1e-6 * expected);
  // Place{cuda=false} runs the reference.
  float again = 2.5f;
  float scratch[1];
  SquareSum(Place{}, g.data_ptr<float>(), n, &again, scratch);
  EXPECT_EQ(again, out);
}

// The host's threaded sum (in double, over fixed chunks): the same bits for any thread count, and
// LibTorch's sum within fp32 rounding, across chunk boundaries and a partial last chunk.
TEST(KernelsTest, SquareSumHostIsThreadCountFreeAndEqualsLibTorch) {
  torch::manual_seed(5);
  const int64_t n = 5 * (int64_t{1} << 20) + 12345;
  auto g = torch::randn({n});
  const double one = SquareSumHost(g.data_ptr<float>(), n, 1);
  EXPECT_EQ(SquareSumHost(g.data_ptr<float>(), n, 3), one);
  EXPECT_EQ(SquareSumHost(g.data_ptr<float>(), n, 64), one);
  const double expected = g.to(torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(one, expected, 1e-10 * expected);
  EXPECT_EQ(SquareSumHost(g.data_ptr<float>(), 0, 4), 0.0);
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
    CrossEntropyGradInPlace(Place{}, dtype == torch::kFloat ? DType::kFloat32 : DType::kBFloat16, ours.data_ptr(), rows,
                            vocab, stride, targets.data_ptr<int64_t>(), scale, loss.data_ptr<float>());
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
    EXPECT_EQ(ours.narrow(1, vocab, stride - vocab).abs().max().item<double>(), 0.0)
        << "padding columns get gradient 0";
  }
}

DType Of(torch::ScalarType t) { return t == torch::kFloat ? DType::kFloat32 : DType::kBFloat16; }

// Vocab-parallel: the vocabulary cut into slices (as tensor-parallel ranks hold it), each
// slice's row statistics merged as fused_loss.cc merges the ranks', then each slice's gradient
// from the merged lse, against LibTorch's loss and gradient over the whole row.
TEST(KernelsTest, CrossEntropyInVocabSlicesEqualsLibTorchOverTheWholeRow) {
  torch::manual_seed(18);
  const int64_t rows = 29, slices = 3, slice_vocab = 335, stride = 384;  // each slice padded to 384
  const int64_t vocab = slices * slice_vocab;
  auto whole = torch::randn({rows, vocab}) * 4;
  auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
  targets[0] = vocab - 1, targets[1] = 0, targets[2] = slice_vocab;  // the edges of slices
  const float scale = 1.0f / rows;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto stored = whole.to(dtype).contiguous();
    torch::Tensor expected_loss, expected_grad;
    LibTorchCrossEntropy(stored, vocab, targets, scale, &expected_loss, &expected_grad);
    std::vector<torch::Tensor> parts, local_targets;
    auto lse = torch::empty({slices, rows}), target_logit = torch::empty({slices, rows});
    for (int64_t r = 0; r < slices; ++r) {
      auto part = torch::full({rows, stride}, 100.0).to(dtype);  // padding must not count
      part.narrow(1, 0, slice_vocab).copy_(stored.narrow(1, r * slice_vocab, slice_vocab));
      parts.push_back(part);
      local_targets.push_back((targets - r * slice_vocab).contiguous());  // outside [0, slice) on other slices
      CrossEntropyRowStats(Place{}, Of(dtype), part.data_ptr(), rows, slice_vocab, stride,
                           local_targets[r].data_ptr<int64_t>(), lse[r].data_ptr<float>(),
                           target_logit[r].data_ptr<float>());
    }
    auto merged = torch::logsumexp(lse, 0).contiguous();
    auto loss = merged - target_logit.sum(0);
    EXPECT_LE(MaxRelative(loss, expected_loss), 2e-6) << dtype;
    for (int64_t r = 0; r < slices; ++r) {
      CrossEntropyGradFromLse(Place{}, Of(dtype), parts[r].data_ptr(), rows, slice_vocab, stride,
                              local_targets[r].data_ptr<int64_t>(), merged.data_ptr<float>(), scale);
      EXPECT_EQ(parts[r].narrow(1, slice_vocab, stride - slice_vocab).abs().max().item<double>(), 0.0)
          << "padding gets gradient 0";
      auto ours = parts[r].narrow(1, 0, slice_vocab).to(torch::kFloat);
      auto theirs = expected_grad.narrow(1, r * slice_vocab, slice_vocab);
      if (dtype == torch::kFloat) {
        EXPECT_LE((ours - theirs).abs().max().item<double>(), 2e-6 * scale) << "fp32 gradient, slice " << r;
      } else {  // one bf16 ulp where the fp32 values straddle a rounding boundary
        auto rounded = theirs.to(torch::kBFloat16).to(torch::kFloat);
        EXPECT_LE(((ours - rounded).abs() - rounded.abs() * (1.0 / 128)).max().item<double>(), 1e-12)
            << "bf16 gradient, slice " << r;
      }
    }
  }
}

// The norm of a residual add (AddRmsNorm, AddLayerNorm) and the backward with a residual
// gradient, against LibTorch's autograd of the op-by-op form: s = x + a, y = norm(s); the
// gradient reaching s is d_residual (s's other use) plus the norm's. fp32 storage here: the
// bound is fp32 rounding of the norm's sums; the add itself must be exact.
struct AddNormCase {
  bool centered;
  torch::Tensor x, a, w, b, d_residual, dy;
};

AddNormCase MakeAddNormCase(bool centered, torch::ScalarType a_type) {
  torch::manual_seed(centered ? 13 : 12);
  const int64_t rows = 37, cols = 160;
  return {centered,
          torch::randn({rows, cols}) + 0.3,
          torch::randn({rows, cols}).to(a_type),
          torch::randn({cols}),
          torch::randn({cols}),
          torch::randn({rows, cols}),
          torch::randn({rows, cols})};
}

TEST(KernelsTest, AddNormForwardEqualsTheAddThenTheNormAndLibTorch) {
  for (bool centered : {false, true}) {
    for (auto a_type : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(std::string(centered ? "LayerNorm" : "RmsNorm") +
                   (a_type == torch::kFloat ? " fp32 addend" : " bf16 addend"));
      AddNormCase c = MakeAddNormCase(centered, a_type);
      const int64_t rows = c.x.size(0), cols = c.x.size(1);
      auto sum = torch::empty_like(c.x), y = torch::empty_like(c.x), mean = torch::empty({rows}),
           rstd = torch::empty({rows});
      // Through the Place-dispatching call (the CPU runs the reference).
      if (centered) {
        AddLayerNormForward(Place{}, DType::kFloat32, c.x.data_ptr(), Of(a_type), c.a.data_ptr(), sum.data_ptr(),
                            c.w.data_ptr<float>(), c.b.data_ptr<float>(), DType::kFloat32, y.data_ptr(),
                            mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols, 1e-5f);
      } else {
        AddRmsNormForward(Place{}, DType::kFloat32, c.x.data_ptr(), Of(a_type), c.a.data_ptr(), sum.data_ptr(),
                          c.w.data_ptr<float>(), DType::kFloat32, y.data_ptr(), rstd.data_ptr<float>(), rows, cols,
                          1e-5f);
      }
      const auto expected_sum = c.x + c.a;  // LibTorch's promotion: fp32
      EXPECT_TRUE(torch::equal(sum, expected_sum)) << "the sum is LibTorch's x + a bit for bit";
      // The norm part equals the plain norm of the stored sum bit for bit...
      auto y2 = torch::empty_like(c.x), mean2 = torch::empty({rows}), rstd2 = torch::empty({rows});
      if (centered) {
        LayerNormForwardReference(DType::kFloat32, sum.data_ptr(), c.w.data_ptr<float>(), c.b.data_ptr<float>(),
                                  DType::kFloat32, y2.data_ptr(), mean2.data_ptr<float>(), rstd2.data_ptr<float>(),
                                  rows, cols, 1e-5f);
        EXPECT_TRUE(torch::equal(mean, mean2));
      } else {
        RmsNormForwardReference(DType::kFloat32, sum.data_ptr(), c.w.data_ptr<float>(), DType::kFloat32, y2.data_ptr(),
                                rstd2.data_ptr<float>(), rows, cols, 1e-5f);
      }
      EXPECT_TRUE(torch::equal(y, y2));
      EXPECT_TRUE(torch::equal(rstd, rstd2));
      // ...and LibTorch's.
      const auto expected = centered ? torch::layer_norm(expected_sum, {cols}, c.w, c.b, 1e-5)
                                     : c.w * (expected_sum * torch::rsqrt(expected_sum.pow(2).mean(-1, true) + 1e-5));
      EXPECT_LE(MaxRelative(y, expected), 1e-6);
    }
  }
}

TEST(KernelsTest, NormBackwardWithAResidualGradientEqualsLibTorchsAutograd) {
  for (bool centered : {false, true}) {
    SCOPED_TRACE(centered ? "LayerNorm" : "RmsNorm");
    AddNormCase c = MakeAddNormCase(centered, torch::kFloat);
    const int64_t rows = c.x.size(0), cols = c.x.size(1);
    // LibTorch: s used twice (the residual path, whose gradient is d_residual, and the norm).
    auto s = (c.x + c.a).requires_grad_(true);
    auto w = c.w.clone().requires_grad_(true), b = c.b.clone().requires_grad_(true);
    auto y =
        centered ? torch::layer_norm(s, {cols}, w, b, 1e-5) : w * (s * torch::rsqrt(s.pow(2).mean(-1, true) + 1e-5));
    torch::autograd::backward({s, y}, {c.d_residual, c.dy});
    // The kernels: forward for mean and rstd, then the backward with the residual gradient and a
    // bf16 copy of ds (a bf16 sublayer output's gradient).
    const auto sd = s.detach().contiguous();
    auto yk = torch::empty_like(sd), mean = torch::empty({rows}), rstd = torch::empty({rows});
    auto ds = torch::empty_like(sd), ds_bf16 = torch::empty(sd.sizes(), torch::kBFloat16), dw = torch::empty({cols}),
         db = torch::empty({cols});
    auto plain_dx = torch::empty_like(sd), plain_dw = torch::empty({cols}), plain_db = torch::empty({cols});
    const NormResidualGrad residual{c.d_residual.data_ptr(), ds_bf16.data_ptr(), DType::kBFloat16};
    if (centered) {
      LayerNormForwardReference(DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), c.b.data_ptr<float>(),
                                DType::kFloat32, yk.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows,
                                cols, 1e-5f);
      LayerNormBackward(Place{}, DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), mean.data_ptr<float>(),
                        rstd.data_ptr<float>(), DType::kFloat32, c.dy.data_ptr(), ds.data_ptr(), dw.data_ptr<float>(),
                        db.data_ptr<float>(), rows, cols, residual);
      LayerNormBackwardReference(DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), mean.data_ptr<float>(),
                                 rstd.data_ptr<float>(), DType::kFloat32, c.dy.data_ptr(), plain_dx.data_ptr(),
                                 plain_dw.data_ptr<float>(), plain_db.data_ptr<float>(), rows, cols);
      EXPECT_LE(MaxRelative(db, b.grad()), 1e-5);
      EXPECT_TRUE(torch::equal(db, plain_db));
    } else {
      RmsNormForwardReference(DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), DType::kFloat32, yk.data_ptr(),
                              rstd.data_ptr<float>(), rows, cols, 1e-5f);
      RmsNormBackward(Place{}, DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), rstd.data_ptr<float>(),
                      DType::kFloat32, c.dy.data_ptr(), ds.data_ptr(), dw.data_ptr<float>(), rows, cols, residual);
      RmsNormBackwardReference(DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), rstd.data_ptr<float>(),
                               DType::kFloat32, c.dy.data_ptr(), plain_dx.data_ptr(), plain_dw.data_ptr<float>(), rows,
                               cols);
    }
    EXPECT_LE(MaxRelative(ds, s.grad()), 1e-5) << "ds = d_residual + the norm's dx";
    EXPECT_LE(MaxRelative(dw, w.grad()), 1e-5);
    // Exactly the unfused form: the plain backward's dx, then one fp32 add.
    EXPECT_TRUE(torch::equal(ds, plain_dx + c.d_residual));
    EXPECT_TRUE(torch::equal(dw, plain_dw)) << "the weight's gradient does not see the residual";
    EXPECT_TRUE(torch::equal(ds_bf16, ds.to(torch::kBFloat16))) << "the copy is ds rounded once to bf16";
    // The copy alone (no residual gradient): the plain dx, again in bf16.
    auto dx_only = torch::empty_like(sd), copy_only = torch::empty(sd.sizes(), torch::kBFloat16);
    const NormResidualGrad copy{nullptr, copy_only.data_ptr(), DType::kBFloat16};
    if (centered) {
      LayerNormBackwardReference(DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), mean.data_ptr<float>(),
                                 rstd.data_ptr<float>(), DType::kFloat32, c.dy.data_ptr(), dx_only.data_ptr(),
                                 dw.data_ptr<float>(), db.data_ptr<float>(), rows, cols, copy);
    } else {
      RmsNormBackwardReference(DType::kFloat32, sd.data_ptr(), c.w.data_ptr<float>(), rstd.data_ptr<float>(),
                               DType::kFloat32, c.dy.data_ptr(), dx_only.data_ptr(), dw.data_ptr<float>(), rows, cols,
                               copy);
    }
    EXPECT_TRUE(torch::equal(dx_only, plain_dx));
    EXPECT_TRUE(torch::equal(copy_only, plain_dx.to(torch::kBFloat16)));
  }
}

TEST(KernelsTest, AddNormInBf16RoundsTheSumBeforeTheNormReadsIt) {
  // x and a both bf16 (a model run in bf16): s is stored in bf16, and the norm is of that
  // rounded s - what LibTorch's bf16 x + a followed by the norm computes.
  torch::manual_seed(14);
  const int64_t rows = 9, cols = 64;
  auto x = torch::randn({rows, cols}).to(torch::kBFloat16),
       a = (torch::randn({rows, cols}) * 1e-2).to(torch::kBFloat16);
  auto w = torch::randn({cols});
  auto sum = torch::empty_like(x), y = torch::empty({rows, cols}), rstd = torch::empty({rows});
  AddRmsNormForwardReference(DType::kBFloat16, x.data_ptr(), DType::kBFloat16, a.data_ptr(), sum.data_ptr(),
                             w.data_ptr<float>(), DType::kFloat32, y.data_ptr(), rstd.data_ptr<float>(), rows, cols,
                             1e-6f);
  const auto expected_sum = x + a;
  ASSERT_EQ(expected_sum.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(sum, expected_sum));
  const auto s32 = expected_sum.to(torch::kFloat);
  EXPECT_LE(MaxRelative(y, w * (s32 * torch::rsqrt(s32.pow(2).mean(-1, true) + 1e-6))), 1e-6);
  // The norm of the unrounded fp32 sum is far outside that bound: the test tells the two apart.
  const auto unrounded = x.to(torch::kFloat) + a.to(torch::kFloat);
  EXPECT_GT(MaxRelative(y, w * (unrounded * torch::rsqrt(unrounded.pow(2).mean(-1, true) + 1e-6))), 1e-4);
}

// A shard whose edges cut rows (elements 50..301 of a 13 x 24 table): the gather is the table's
// rows with the elements outside the shard zero; the scatter-add is LibTorch's embedding backward
// of the whole table, restricted to the shard and added to what the gradient held - bit for bit
// (both sum each row's gradients in the ids' order). Repeated ids, an id outside the table.
TEST(KernelsTest, ShardRowsEqualLibTorchsEmbeddingAndItsBackwardOnTheShard) {
  torch::manual_seed(15);
  const int64_t rows = 13, cols = 24, begin = 50, end = 302;
  const auto table = torch::randn({rows, cols});
  const auto flat = table.view({-1});
  const auto shard = flat.narrow(0, begin, end - begin).clone();
  const auto ids = torch::tensor({3, 2, 7, 2, 12, 3, 2, 0, 9, 2, 40, 5}, torch::kLong);  // 40: outside the table
  const int64_t n = ids.numel();
  const ShardRowsShape shape{cols, begin, end};
  auto out = torch::full({n, cols}, 7.0f);
  ShardRowsGatherReference(shape, shard.data_ptr<float>(), ids.data_ptr<int64_t>(), n, out.data_ptr<float>());
  auto held = torch::zeros_like(flat);
  held.narrow(0, begin, end - begin).copy_(shard);
  const auto in_table = ids.clamp_max(rows - 1);
  auto expected = torch::embedding(held.view({rows, cols}), in_table).masked_fill_((ids >= rows).unsqueeze(1), 0.0f);
  EXPECT_TRUE(torch::equal(out, expected));
  EXPECT_GT(out.abs().sum().item<double>(), 0.0);
  ShardRowsGather(Place{}, shape, shard.data_ptr<float>(), ids.data_ptr<int64_t>(), n, out.data_ptr<float>());
  EXPECT_TRUE(torch::equal(out, expected));

  const auto dy = torch::randn({n, cols});
  const auto sorted = torch::sort(ids, /*stable=*/true, 0, false);
  const auto& sorted_ids = std::get<0>(sorted);
  const auto& order = std::get<1>(sorted);
  auto grad = torch::randn({end - begin});
  const auto before = grad.clone();
  ShardRowsScatterAddReference(shape, dy.data_ptr<float>(), sorted_ids.data_ptr<int64_t>(), order.data_ptr<int64_t>(),
                               n, grad.data_ptr<float>());
  const auto keep = ids < rows;  // LibTorch's backward takes no id outside the table
  const auto dense = at::embedding_dense_backward(dy.index({keep}), ids.index({keep}), rows, -1, false);
  EXPECT_TRUE(torch::equal(grad, before + dense.view({-1}).narrow(0, begin, end - begin)));
  EXPECT_FALSE(torch::equal(grad, before));
}

// A run longer than a chunk of the sorted ids (kernels.h: its parts summed a chunk at a time, the
// parts then in order) is LibTorch's embedding backward within rounding: each element of either
// within (terms - 1) x 2^-24 of the sum of its terms' magnitudes of the exact sum (in double), the
// bound on any order's fp32 sum of that many terms. Runs inside one chunk stay bit for bit
// LibTorch's (the test above); a run that crosses a chunk's edge, however short, may not.
TEST(KernelsTest, ShardRowsScatterAddSumsRunsPastAChunkWithinRoundingOfLibTorch) {
  torch::manual_seed(17);
  const int64_t rows = 6, cols = 16, n = 3 * kShardRowsChunk + 40;
  auto ids = torch::randint(0, rows, {n}, torch::kLong);
  ids.narrow(0, 10, 2 * kShardRowsChunk + 5).fill_(2);  // row 2's run crosses two chunk edges
  const auto dy = torch::randn({n, cols}) * 100;
  const auto sorted = torch::sort(ids, /*stable=*/true, 0, false);
  auto grad = torch::zeros({rows * cols});
  ShardRowsScatterAddReference({cols, 0, rows * cols}, dy.data_ptr<float>(), std::get<0>(sorted).data_ptr<int64_t>(),
                               std::get<1>(sorted).data_ptr<int64_t>(), n, grad.data_ptr<float>());
  const auto libtorch = at::embedding_dense_backward(dy, ids, rows, -1, false).view({-1});
  const auto exact = at::embedding_dense_backward(dy.to(torch::kDouble), ids, rows, -1, false).view({-1});
  const auto magnitude = at::embedding_dense_backward(dy.abs().to(torch::kDouble), ids, rows, -1, false).view({-1});
  const auto terms =
      at::embedding_dense_backward(torch::ones({n, cols}, torch::kDouble), ids, rows, -1, false).view({-1});
  const auto bound = (terms - 1).clamp_min(0) * magnitude * std::ldexp(1.0, -24);
  EXPECT_TRUE(((grad.to(torch::kDouble) - exact).abs() <= bound).all().item<bool>());
  EXPECT_TRUE(((libtorch.to(torch::kDouble) - exact).abs() <= bound).all().item<bool>());
  // The chunked sums are not LibTorch's order: row 2's differ somewhere.
  EXPECT_FALSE(torch::equal(grad.narrow(0, 2 * cols, cols), libtorch.narrow(0, 2 * cols, cols)));
}

}  // namespace
}  // namespace strata::kernels
