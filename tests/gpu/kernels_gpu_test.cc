// The CUDA kernels against their CPU references (kernels/kernels.h) on the same inputs, on the
// GPU: aligned and unaligned (a ZeRO shard starting mid-vector) pointers, a length that is not
// a multiple of the vector width, and the reduction accumulating into a device scalar; 8-bit
// AdamW's kernel bit for bit against its reference.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "quant/nf4.h"

namespace strata::kernels {
namespace {

class KernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available() || !HasCuda()) GTEST_SKIP() << "no CUDA device (or a build without CUDA kernels)";
    place_.cuda = true;
    place_.stream = nullptr;  // the default stream, where LibTorch's copies here run too
  }
  Place place_;
};

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.cpu() - b.cpu()).abs().max() / b.cpu().abs().max().clamp_min(1e-30)).item<double>();
}

// Every operation rounded on its own on both sides (adamw_scalars.h): the GPU's update equals the
// CPU's bit for bit - what lets an offloaded optimizer give the losses of the on-GPU one.
TEST_F(KernelsGpuTest, AdamWEqualsTheReferenceBitForBitAlignedAndNot) {
  torch::manual_seed(5);
  for (int64_t offset : {0, 1, 3}) {
    const int64_t n = 1'000'003;
    auto host = [&] { return torch::randn({n + offset}); };
    auto p = host(), m = host().abs() * 0.1, v = host().abs() * 0.01;
    auto pd = p.cuda(), md = m.cuda(), vd = v.cuda();
    auto working = torch::empty({n + offset}, pd.options().dtype(torch::kBFloat16));
    for (int64_t step = 1; step <= 5; ++step) {
      AdamWArgs a{1e-3, 0.9, 0.95, 1e-8, 0.1, step, step == 3 ? 0.5 : 1.0};
      if (step == 2) a.weight_decay = 0;  // a span of norms
      auto g = torch::randn({n + offset});
      auto gd = g.cuda();
      AdamWReference(a, p.data_ptr<float>() + offset, g.data_ptr<float>() + offset, m.data_ptr<float>() + offset,
                     v.data_ptr<float>() + offset, n);
      // Odd steps also write the bf16 working copy (the kernel's other variant; same fp32 update).
      AdamW(place_, a, pd.data_ptr<float>() + offset, gd.data_ptr<float>() + offset, md.data_ptr<float>() + offset,
            vd.data_ptr<float>() + offset, n,
            step % 2 ? reinterpret_cast<uint16_t*>(working.data_ptr()) + offset : nullptr);
    }
    EXPECT_TRUE(torch::equal(working.narrow(0, offset, n).cpu(), pd.narrow(0, offset, n).cpu().to(torch::kBFloat16)))
        << "offset " << offset << ": the working copy is the cast of the last update";
    EXPECT_TRUE(torch::equal(pd.cpu(), p)) << "offset " << offset << ", max relative " << MaxRelative(pd, p);
    EXPECT_TRUE(torch::equal(md.cpu(), m)) << "offset " << offset;
    EXPECT_TRUE(torch::equal(vd.cpu(), v)) << "offset " << offset;
  }
}

TEST_F(KernelsGpuTest, SquareSumEqualsTheReferenceAndIsDeterministic) {
  torch::manual_seed(6);
  const int64_t n = 12'345'679;
  auto g = torch::randn({n});
  float expected = 1.0f;
  SquareSumReference(g.data_ptr<float>(), n, &expected);
  auto gd = g.cuda();
  auto scratch = torch::empty({SquareSumScratch()}, gd.options());
  std::vector<float> results;
  for (int run = 0; run < 3; ++run) {
    auto out = torch::ones({1}, gd.options());
    SquareSum(place_, gd.data_ptr<float>(), n, out.data_ptr<float>(), scratch.data_ptr<float>());
    results.push_back(out.item<float>());
  }
  EXPECT_NEAR(results[0], expected, 1e-5 * expected);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[1], results[2]);
}

TEST_F(KernelsGpuTest, CrossEntropyEqualsTheReferenceVectorizedAndNot) {
  torch::manual_seed(9);
  // GPT-2's vocabulary padded to 64 (vector path) and unpadded (odd stride: element path).
  for (int64_t stride : {50304, 50257}) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const int64_t rows = 129, vocab = 50257;
      auto logits = (torch::randn({rows, stride}) * 3).to(dtype);
      auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
      const DType d = dtype == torch::kFloat ? DType::kFloat32 : DType::kBFloat16;
      auto ref = logits.clone();
      auto ref_loss = torch::empty({rows});
      CrossEntropyGradInPlaceReference(d, ref.data_ptr(), rows, vocab, stride, targets.data_ptr<int64_t>(), 0.5f,
                                       ref_loss.data_ptr<float>());
      auto gpu = logits.cuda();
      auto gpu_targets = targets.cuda();
      auto gpu_loss = torch::empty({rows}, gpu.options().dtype(torch::kFloat));
      CrossEntropyGradInPlace(place_, d, gpu.data_ptr(), rows, vocab, stride, gpu_targets.data_ptr<int64_t>(), 0.5f,
                              gpu_loss.data_ptr<float>());
      EXPECT_LE(MaxRelative(gpu_loss, ref_loss), 1e-6) << "stride " << stride << " " << dtype;
      auto diff = (gpu.cpu().to(torch::kFloat) - ref.to(torch::kFloat)).abs();
      // fp32: exp's rounding; bf16: at most one ulp where the fp32 values straddle a boundary.
      const double bound = dtype == torch::kFloat ? 4e-6 : 1.0 / 128;
      EXPECT_LE((diff - ref.to(torch::kFloat).abs() * bound).max().item<double>(), 1e-9)
          << "stride " << stride << " " << dtype;
    }
  }
}

DType Of(torch::ScalarType t) { return t == torch::kFloat ? DType::kFloat32 : DType::kBFloat16; }

// The vocab-parallel halves (a rank's slice of Llama 3's vocabulary under tp = 2, and an odd
// stride) against their references; targets both inside and outside the slice.
TEST_F(KernelsGpuTest, CrossEntropyRowStatsAndGradFromLseEqualTheReference) {
  torch::manual_seed(19);
  for (int64_t stride : {64128, 64127}) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const int64_t rows = 131, vocab = 64127;
      auto logits = (torch::randn({rows, stride}) * 3).to(dtype);
      auto targets = torch::randint(-vocab, 2 * vocab, {rows}, torch::kLong);
      auto lse = torch::randn({rows}) + 12;  // the merged lse of every rank's slice
      auto ref_lse = torch::empty({rows}), ref_target = torch::empty({rows});
      CrossEntropyRowStatsReference(Of(dtype), logits.data_ptr(), rows, vocab, stride, targets.data_ptr<int64_t>(),
                                    ref_lse.data_ptr<float>(), ref_target.data_ptr<float>());
      auto ref = logits.clone();
      CrossEntropyGradFromLseReference(Of(dtype), ref.data_ptr(), rows, vocab, stride, targets.data_ptr<int64_t>(),
                                       lse.data_ptr<float>(), 0.25f);
      auto gpu = logits.cuda();
      auto gpu_targets = targets.cuda(), gpu_lse = lse.cuda();
      auto out_lse = torch::empty({rows}, gpu.options().dtype(torch::kFloat)), out_target = torch::empty_like(out_lse);
      CrossEntropyRowStats(place_, Of(dtype), gpu.data_ptr(), rows, vocab, stride, gpu_targets.data_ptr<int64_t>(),
                           out_lse.data_ptr<float>(), out_target.data_ptr<float>());
      EXPECT_LE(MaxRelative(out_lse, ref_lse), 1e-6) << "stride " << stride << " " << dtype;
      EXPECT_TRUE(torch::equal(out_target.cpu(), ref_target)) << "the target's logit is read, not computed";
      CrossEntropyGradFromLse(place_, Of(dtype), gpu.data_ptr(), rows, vocab, stride, gpu_targets.data_ptr<int64_t>(),
                              gpu_lse.data_ptr<float>(), 0.25f);
      auto diff = (gpu.cpu().to(torch::kFloat) - ref.to(torch::kFloat)).abs();
      const double bound = dtype == torch::kFloat ? 4e-6 : 1.0 / 128;
      EXPECT_LE((diff - ref.to(torch::kFloat).abs() * bound).max().item<double>(), 1e-9)
          << "stride " << stride << " " << dtype;
    }
  }
}
// fp32: a few ulps of reordered sums and exp; bf16: one rounding step apart at most.
double Bound(torch::ScalarType t) { return t == torch::kFloat ? 1e-5 : 1.0 / 64; }

TEST_F(KernelsGpuTest, RmsNormForwardAndBackwardEqualTheReference) {
  torch::manual_seed(10);
  const int64_t rows = 300, cols = 2048;
  for (auto xt : {torch::kFloat, torch::kBFloat16}) {
    for (auto yt : {torch::kFloat, torch::kBFloat16}) {
      auto x = torch::randn({rows, cols}).to(xt), w = torch::randn({cols}), dy = torch::randn({rows, cols}).to(yt);
      auto y = torch::empty({rows, cols}, torch::TensorOptions().dtype(yt)), rstd = torch::empty({rows});
      auto dx = torch::empty_like(x), dw = torch::empty({cols});
      RmsNormForwardReference(Of(xt), x.data_ptr(), w.data_ptr<float>(), Of(yt), y.data_ptr(), rstd.data_ptr<float>(),
                              rows, cols, 1e-5f);
      RmsNormBackwardReference(Of(xt), x.data_ptr(), w.data_ptr<float>(), rstd.data_ptr<float>(), Of(yt), dy.data_ptr(),
                               dx.data_ptr(), dw.data_ptr<float>(), rows, cols);
      auto xd = x.cuda(), wd = w.cuda(), dyd = dy.cuda();
      auto yd = torch::empty({rows, cols}, wd.options().dtype(yt)), rstdd = torch::empty({rows}, wd.options()),
           dxd = torch::empty_like(xd);
      auto partials = torch::empty({NormWeightPartialRows(place_, rows), cols}, wd.options());
      RmsNormForward(place_, Of(xt), xd.data_ptr(), wd.data_ptr<float>(), Of(yt), yd.data_ptr(),
                     rstdd.data_ptr<float>(), rows, cols, 1e-5f);
      RmsNormBackward(place_, Of(xt), xd.data_ptr(), wd.data_ptr<float>(), rstdd.data_ptr<float>(), Of(yt),
                      dyd.data_ptr(), dxd.data_ptr(), partials.data_ptr<float>(), rows, cols);
      EXPECT_LE(MaxRelative(rstdd, rstd), 1e-6) << xt << " " << yt;
      EXPECT_LE(MaxRelative(yd.to(torch::kFloat), y.to(torch::kFloat)), Bound(yt)) << xt << " " << yt;
      EXPECT_LE(MaxRelative(dxd.to(torch::kFloat), dx.to(torch::kFloat)), Bound(xt)) << xt << " " << yt;
      EXPECT_LE(MaxRelative(partials.sum(0), dw), 1e-5) << xt << " " << yt;
    }
  }
}

TEST_F(KernelsGpuTest, LayerNormForwardAndBackwardEqualTheReference) {
  torch::manual_seed(12);
  const int64_t rows = 300, cols = 768;
  for (auto xt : {torch::kFloat, torch::kBFloat16}) {
    auto x = (torch::randn({rows, cols}) + 0.3).to(xt), w = torch::randn({cols}), b = torch::randn({cols});
    auto dy = torch::randn({rows, cols}).to(torch::kBFloat16);
    auto y = torch::empty({rows, cols}, torch::kBFloat16), mean = torch::empty({rows}), rstd = torch::empty({rows});
    auto dx = torch::empty_like(x), dw = torch::empty({cols}), db = torch::empty({cols});
    LayerNormForwardReference(Of(xt), x.data_ptr(), w.data_ptr<float>(), b.data_ptr<float>(), DType::kBFloat16,
                              y.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols, 1e-5f);
    LayerNormBackwardReference(Of(xt), x.data_ptr(), w.data_ptr<float>(), mean.data_ptr<float>(),
                               rstd.data_ptr<float>(), DType::kBFloat16, dy.data_ptr(), dx.data_ptr(),
                               dw.data_ptr<float>(), db.data_ptr<float>(), rows, cols);
    auto xd = x.cuda(), wd = w.cuda(), bd = b.cuda(), dyd = dy.cuda();
    auto yd = torch::empty({rows, cols}, wd.options().dtype(torch::kBFloat16)),
         meand = torch::empty({rows}, wd.options());
    auto rstdd = torch::empty_like(meand), dxd = torch::empty_like(xd);
    auto dwp = torch::empty({NormWeightPartialRows(place_, rows), cols}, wd.options()), dbp = torch::empty_like(dwp);
    LayerNormForward(place_, Of(xt), xd.data_ptr(), wd.data_ptr<float>(), bd.data_ptr<float>(), DType::kBFloat16,
                     yd.data_ptr(), meand.data_ptr<float>(), rstdd.data_ptr<float>(), rows, cols, 1e-5f);
    LayerNormBackward(place_, Of(xt), xd.data_ptr(), wd.data_ptr<float>(), meand.data_ptr<float>(),
                      rstdd.data_ptr<float>(), DType::kBFloat16, dyd.data_ptr(), dxd.data_ptr(), dwp.data_ptr<float>(),
                      dbp.data_ptr<float>(), rows, cols);
    EXPECT_LE(MaxRelative(rstdd, rstd), 1e-5) << xt;
    EXPECT_LE(MaxRelative(yd.to(torch::kFloat), y.to(torch::kFloat)), Bound(torch::kBFloat16)) << xt;
    EXPECT_LE(MaxRelative(dxd.to(torch::kFloat), dx.to(torch::kFloat)), Bound(xt)) << xt;
    EXPECT_LE(MaxRelative(dwp.sum(0), dw), 1e-5) << xt;
    EXPECT_LE(MaxRelative(dbp.sum(0), db), 1e-5) << xt;
  }
}

// The norms of a residual add (AddRmsNorm, AddLayerNorm) and the backwards with a residual
// gradient and a copy of dx, on the GPU against the CPU references and against the unfused
// kernels on the GPU (which they must equal bit for bit in fp32: the same sums in the same
// order), at GPT-2's width (the warp-per-row backward) and Llama's (block per row).
TEST_F(KernelsGpuTest, AddNormsAndResidualGradientsEqualTheReferenceAndTheUnfusedKernels) {
  torch::manual_seed(13);
  const int64_t rows = 300;
  for (int64_t cols : {768, 2048}) {
    for (bool centered : {false, true}) {
      for (auto xt : {torch::kFloat, torch::kBFloat16}) {
        for (auto at : {torch::kFloat, torch::kBFloat16}) {
          const std::string what = std::string(centered ? "LayerNorm " : "RmsNorm ") + std::to_string(cols) + " x " +
                                   c10::toString(xt) + " a " + c10::toString(at);
          const auto yt = torch::kBFloat16;  // the norm's output, as under autocast
          auto x = (torch::randn({rows, cols}) + 0.3).to(xt), a = torch::randn({rows, cols}).to(at);
          auto w = torch::randn({cols}), b = torch::randn({cols});
          auto dy = torch::randn({rows, cols}).to(yt), dres = torch::randn({rows, cols}).to(xt);
          // The CPU reference.
          auto s = torch::empty_like(x), y = torch::empty({rows, cols}, yt), mean = torch::empty({rows}),
               rstd = torch::empty({rows});
          auto ds = torch::empty_like(x), copy = torch::empty({rows, cols}, at), dw = torch::empty({cols}),
               db = torch::empty({cols});
          const NormResidualGrad residual{dres.data_ptr(), copy.data_ptr(), Of(at)};
          if (centered) {
            AddLayerNormForwardReference(Of(xt), x.data_ptr(), Of(at), a.data_ptr(), s.data_ptr(), w.data_ptr<float>(),
                                         b.data_ptr<float>(), Of(yt), y.data_ptr(), mean.data_ptr<float>(),
                                         rstd.data_ptr<float>(), rows, cols, 1e-5f);
            LayerNormBackwardReference(Of(xt), s.data_ptr(), w.data_ptr<float>(), mean.data_ptr<float>(),
                                       rstd.data_ptr<float>(), Of(yt), dy.data_ptr(), ds.data_ptr(),
                                       dw.data_ptr<float>(), db.data_ptr<float>(), rows, cols, residual);
          } else {
            AddRmsNormForwardReference(Of(xt), x.data_ptr(), Of(at), a.data_ptr(), s.data_ptr(), w.data_ptr<float>(),
                                       Of(yt), y.data_ptr(), rstd.data_ptr<float>(), rows, cols, 1e-5f);
            RmsNormBackwardReference(Of(xt), s.data_ptr(), w.data_ptr<float>(), rstd.data_ptr<float>(), Of(yt),
                                     dy.data_ptr(), ds.data_ptr(), dw.data_ptr<float>(), rows, cols, residual);
          }
          // The CUDA kernels: fused, then the unfused ones on the fused sum.
          auto xd = x.cuda(), ad = a.cuda(), wd = w.cuda(), bd = b.cuda(), dyd = dy.cuda(), dresd = dres.cuda();
          auto sd = torch::empty_like(xd), yd = torch::empty({rows, cols}, wd.options().dtype(yt)),
               meand = torch::empty({rows}, wd.options());
          auto rstdd = torch::empty_like(meand), dsd = torch::empty_like(xd),
               copyd = torch::empty({rows, cols}, wd.options().dtype(at));
          auto dwp = torch::empty({NormWeightPartialRows(place_, rows), cols}, wd.options()),
               dbp = torch::empty_like(dwp);
          auto y2 = torch::empty_like(yd), mean2 = torch::empty_like(meand), rstd2 = torch::empty_like(meand),
               dx2 = torch::empty_like(xd);
          auto dwp2 = torch::empty_like(dwp), dbp2 = torch::empty_like(dwp);
          const NormResidualGrad residual_d{dresd.data_ptr(), copyd.data_ptr(), Of(at)};
          if (centered) {
            AddLayerNormForward(place_, Of(xt), xd.data_ptr(), Of(at), ad.data_ptr(), sd.data_ptr(),
                                wd.data_ptr<float>(), bd.data_ptr<float>(), Of(yt), yd.data_ptr(),
                                meand.data_ptr<float>(), rstdd.data_ptr<float>(), rows, cols, 1e-5f);
            LayerNormBackward(place_, Of(xt), sd.data_ptr(), wd.data_ptr<float>(), meand.data_ptr<float>(),
                              rstdd.data_ptr<float>(), Of(yt), dyd.data_ptr(), dsd.data_ptr(), dwp.data_ptr<float>(),
                              dbp.data_ptr<float>(), rows, cols, residual_d);
            LayerNormForward(place_, Of(xt), sd.data_ptr(), wd.data_ptr<float>(), bd.data_ptr<float>(), Of(yt),
                             y2.data_ptr(), mean2.data_ptr<float>(), rstd2.data_ptr<float>(), rows, cols, 1e-5f);
            LayerNormBackward(place_, Of(xt), sd.data_ptr(), wd.data_ptr<float>(), mean2.data_ptr<float>(),
                              rstd2.data_ptr<float>(), Of(yt), dyd.data_ptr(), dx2.data_ptr(), dwp2.data_ptr<float>(),
                              dbp2.data_ptr<float>(), rows, cols);
          } else {
            AddRmsNormForward(place_, Of(xt), xd.data_ptr(), Of(at), ad.data_ptr(), sd.data_ptr(), wd.data_ptr<float>(),
                              Of(yt), yd.data_ptr(), rstdd.data_ptr<float>(), rows, cols, 1e-5f);
            RmsNormBackward(place_, Of(xt), sd.data_ptr(), wd.data_ptr<float>(), rstdd.data_ptr<float>(), Of(yt),
                            dyd.data_ptr(), dsd.data_ptr(), dwp.data_ptr<float>(), rows, cols, residual_d);
            RmsNormForward(place_, Of(xt), sd.data_ptr(), wd.data_ptr<float>(), Of(yt), y2.data_ptr(),
                           rstd2.data_ptr<float>(), rows, cols, 1e-5f);
            RmsNormBackward(place_, Of(xt), sd.data_ptr(), wd.data_ptr<float>(), rstd2.data_ptr<float>(), Of(yt),
                            dyd.data_ptr(), dx2.data_ptr(), dwp2.data_ptr<float>(), rows, cols);
          }
          // Against the reference: the sum exactly (one fp32 add, one rounding), the rest as the norms'.
          EXPECT_TRUE(torch::equal(sd.cpu(), s)) << what;
          EXPECT_LE(MaxRelative(rstdd, rstd), 1e-5) << what;
          EXPECT_LE(MaxRelative(yd.to(torch::kFloat), y.to(torch::kFloat)), Bound(yt)) << what;
          EXPECT_LE(MaxRelative(dsd.to(torch::kFloat), ds.to(torch::kFloat)), Bound(xt)) << what;
          EXPECT_LE(MaxRelative(copyd.to(torch::kFloat), copy.to(torch::kFloat)), Bound(at)) << what;
          EXPECT_LE(MaxRelative(dwp.sum(0), dw), 1e-5) << what;
          if (centered) {
            EXPECT_LE(MaxRelative(dbp.sum(0), db), 1e-5) << what;
            EXPECT_TRUE(torch::equal(dbp, dbp2)) << what;
          }
          // Against the unfused kernels: the norm of the stored sum, and the norm's dx plus the
          // residual gradient added afterwards (in fp32, then rounded to x's dtype).
          EXPECT_TRUE(torch::equal(yd, y2)) << what;
          EXPECT_TRUE(torch::equal(rstdd, rstd2)) << what;
          EXPECT_TRUE(torch::equal(dwp, dwp2)) << what;
          const auto unfused_ds = (dx2.to(torch::kFloat) + dresd.to(torch::kFloat)).to(xt);
          if (xt == torch::kFloat) {
            EXPECT_TRUE(torch::equal(dsd, unfused_ds)) << what;
          } else {
            EXPECT_LE(MaxRelative(dsd.to(torch::kFloat), unfused_ds.to(torch::kFloat)), Bound(xt))
                << what;  // dx2 was rounded once more
          }
          // The copy and dx are one fp32 value rounded to each's dtype: equal in the narrower.
          const auto narrower = xt == torch::kBFloat16 ? xt : at;
          EXPECT_TRUE(torch::equal(copyd.to(narrower), dsd.to(narrower))) << what << ": the copy is ds in a's dtype";
        }
      }
    }
  }
  // Without a residual gradient the backward with a copy is the plain one, plus the copy.
  const int64_t cols = 2048;
  auto s = torch::randn({rows, cols}, torch::kCUDA), w = torch::randn({cols}, torch::kCUDA),
       rstd = torch::empty({rows}, torch::kCUDA);
  auto y = torch::empty({rows, cols}, s.options().dtype(torch::kBFloat16)),
       dy = torch::randn({rows, cols}, y.options());
  RmsNormForward(place_, DType::kFloat32, s.data_ptr(), w.data_ptr<float>(), DType::kBFloat16, y.data_ptr(),
                 rstd.data_ptr<float>(), rows, cols, 1e-5f);
  auto dx = torch::empty_like(s), dx2 = torch::empty_like(s), copy = torch::empty_like(y);
  auto dwp = torch::empty({NormWeightPartialRows(place_, rows), cols}, s.options()), dwp2 = torch::empty_like(dwp);
  RmsNormBackward(place_, DType::kFloat32, s.data_ptr(), w.data_ptr<float>(), rstd.data_ptr<float>(), DType::kBFloat16,
                  dy.data_ptr(), dx.data_ptr(), dwp.data_ptr<float>(), rows, cols,
                  NormResidualGrad{nullptr, copy.data_ptr(), DType::kBFloat16});
  RmsNormBackward(place_, DType::kFloat32, s.data_ptr(), w.data_ptr<float>(), rstd.data_ptr<float>(), DType::kBFloat16,
                  dy.data_ptr(), dx2.data_ptr(), dwp2.data_ptr<float>(), rows, cols);
  EXPECT_TRUE(torch::equal(dx, dx2));
  EXPECT_TRUE(torch::equal(copy, dx2.to(torch::kBFloat16)));
}

TEST_F(KernelsGpuTest, SwiGluAndRotaryEqualTheReference) {
  torch::manual_seed(11);
  for (auto t : {torch::kFloat, torch::kBFloat16}) {
    const int64_t n = 1'000'003;
    auto g = (torch::randn({n}) * 3).to(t), u = torch::randn({n}).to(t), dy = torch::randn({n}).to(t);
    auto y = torch::empty_like(g), dg = torch::empty_like(g), du = torch::empty_like(g);
    SwiGluForwardReference(Of(t), g.data_ptr(), u.data_ptr(), y.data_ptr(), n);
    SwiGluBackwardReference(Of(t), g.data_ptr(), u.data_ptr(), dy.data_ptr(), dg.data_ptr(), du.data_ptr(), n);
    auto gd = g.cuda(), ud = u.cuda(), dyd = dy.cuda();
    auto yd = torch::empty_like(gd), dgd = torch::empty_like(gd), dud = torch::empty_like(gd);
    SwiGluForward(place_, Of(t), gd.data_ptr(), ud.data_ptr(), yd.data_ptr(), n);
    SwiGluBackward(place_, Of(t), gd.data_ptr(), ud.data_ptr(), dyd.data_ptr(), dgd.data_ptr(), dud.data_ptr(), n);
    EXPECT_LE(MaxRelative(yd.to(torch::kFloat), y.to(torch::kFloat)), Bound(t)) << t;
    EXPECT_LE(MaxRelative(dgd.to(torch::kFloat), dg.to(torch::kFloat)), Bound(t)) << t;
    EXPECT_LE(MaxRelative(dud.to(torch::kFloat), du.to(torch::kFloat)), Bound(t)) << t;

    const RotaryShape shape{2, 37, 4, 64, 32};  // partial rotation: the rest passes through
    auto x = torch::randn({2, 37, 4, 64}).to(t);
    auto freqs = torch::outer(torch::arange(37).to(torch::kFloat), torch::rand({16}));
    auto cos = freqs.cos().contiguous(), sin = freqs.sin().contiguous();
    for (bool inverse : {false, true}) {
      auto ry = torch::empty_like(x);
      RotaryReference(shape, Of(t), x.data_ptr(), Of(t), ry.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                      inverse);
      auto xd = x.cuda(), cd = cos.cuda(), sd = sin.cuda();
      auto yd2 = torch::empty_like(xd);
      Rotary(place_, shape, Of(t), xd.data_ptr(), Of(t), yd2.data_ptr(), cd.data_ptr<float>(), sd.data_ptr<float>(),
             inverse);
      EXPECT_LE(MaxRelative(yd2.to(torch::kFloat), ry.to(torch::kFloat)), Bound(t)) << t << " inverse " << inverse;
    }
  }
}

// Vectorised (cols a multiple of the pack) and element paths, both GELU forms; the bias
// gradient's partial rows added up on the host.
TEST_F(KernelsGpuTest, BiasGeluForwardAndBackwardEqualTheReference) {
  torch::manual_seed(12);
  for (auto t : {torch::kFloat, torch::kBFloat16}) {
    for (const int64_t cols : {int64_t{3072}, int64_t{1001}}) {
      for (const Gelu kind : {Gelu::kTanh, Gelu::kErf}) {
        const int64_t rows = 2053;
        auto h = (torch::randn({rows, cols}) * 2).to(t), dy = torch::randn({rows, cols}).to(t);
        auto bias = torch::randn({cols});
        auto y = torch::empty_like(h), dh = torch::empty_like(h), db = torch::empty({cols});
        BiasGeluForwardReference(kind, Of(t), h.data_ptr(), bias.data_ptr<float>(), y.data_ptr(), rows, cols);
        BiasGeluBackwardReference(kind, Of(t), h.data_ptr(), bias.data_ptr<float>(), dy.data_ptr(), dh.data_ptr(),
                                  db.data_ptr<float>(), rows, cols);
        auto hd = h.cuda(), dyd = dy.cuda(), bd = bias.cuda();
        auto yd = torch::empty_like(hd), dhd = torch::empty_like(hd);
        auto partials = torch::empty({BiasPartialRows(place_, rows), cols}, bd.options());
        BiasGeluForward(place_, kind, Of(t), hd.data_ptr(), bd.data_ptr<float>(), yd.data_ptr(), rows, cols);
        BiasGeluBackward(place_, kind, Of(t), hd.data_ptr(), bd.data_ptr<float>(), dyd.data_ptr(), dhd.data_ptr(),
                         partials.data_ptr<float>(), rows, cols);
        const std::string what = std::string(t == torch::kFloat ? "fp32" : "bf16") + " cols " + std::to_string(cols) +
                                 (kind == Gelu::kTanh ? " tanh" : " erf");
        EXPECT_LE(MaxRelative(yd.to(torch::kFloat), y.to(torch::kFloat)), Bound(t)) << what;
        EXPECT_LE(MaxRelative(dhd.to(torch::kFloat), dh.to(torch::kFloat)), Bound(t)) << what;
        EXPECT_LE(MaxRelative(partials.sum(0), db), 1e-5) << what;  // fp32 sums in another order
      }
    }
  }
}

// AdamW8bit: the kernel and the reference compute every fp32 operation alike
// (kernels/adamw8bit_math.h: _rn intrinsics, no fused multiply-add), so codes, scales and
// parameters should be equal bit for bit. Checked twice: first the looser bound that would hold
// even if some operation rounded differently on the GPU - scales and parameters within 1e-6, and
// a code differing only by one, where the reference's m / S (or v / S) lies within 4 ulps of the
// midpoint of the two codes (a tie flipped by last-bit differences), in under 1e-4 of the
// elements - then equality. Each step starts the GPU from the reference's state, so that a
// difference cannot carry into the next step. Whole blocks, a partial last block, and pointers
// one element past an allocation (the kernel's one-element path: fp32 not 16-byte aligned,
// codes not 4-byte); a block without gradient (scale 0) and one huge value.

// A host tensor's values in a fresh device allocation, `offset` elements in.
torch::Tensor OnDevice(const torch::Tensor& host, int64_t offset) {
  auto device = torch::empty({host.numel() + offset}, host.options().device(torch::kCUDA));
  device.narrow(0, offset, host.numel()).copy_(host);
  return device.narrow(0, offset, host.numel());
}

struct AdamW8bitCase {
  int64_t n, offset;
};

TEST_F(KernelsGpuTest, AdamW8bitEqualsTheReferenceBitForBit) {
  torch::manual_seed(15);
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
  const auto m_table = torch::from_blob(const_cast<float*>(AdamW8bitCodeTable(true)), {256}).clone();
  const auto v_table = torch::from_blob(const_cast<float*>(AdamW8bitCodeTable(false)), {256}).clone();
  for (const AdamW8bitCase c :
       {AdamW8bitCase{4096 * kAdamW8bitBlock, 0}, AdamW8bitCase{1'000'003, 0}, AdamW8bitCase{1'000'003, 1}}) {
    const int64_t n = c.n, blocks = AdamW8bitBlocks(n), zero_block = 7, huge_at = 11 * kAdamW8bitBlock + 5;
    auto block_size = torch::pow(10.0, torch::randn({blocks}) * 1.5);
    block_size[huge_at / kAdamW8bitBlock] = 1.0;
    auto p = torch::randn({n});
    auto m_codes = torch::empty({n}, u8), v_codes = torch::empty({n}, u8), m_scales = torch::empty({blocks}),
         v_scales = torch::empty({blocks});
    AdamW8bitInit(Place{}, m_codes.data_ptr<uint8_t>(), m_scales.data_ptr<float>(), v_codes.data_ptr<uint8_t>(),
                  v_scales.data_ptr<float>(), n);
    {
      auto mcd = OnDevice(torch::full({n}, 9, u8), c.offset), vcd = OnDevice(torch::full({n}, 9, u8), c.offset);
      auto msd = OnDevice(torch::full({blocks}, 9.0f), 0), vsd = OnDevice(torch::full({blocks}, 9.0f), 0);
      AdamW8bitInit(place_, mcd.data_ptr<uint8_t>(), msd.data_ptr<float>(), vcd.data_ptr<uint8_t>(),
                    vsd.data_ptr<float>(), n);
      EXPECT_TRUE(torch::equal(mcd.cpu(), m_codes) && torch::equal(vcd.cpu(), v_codes)) << "Init's codes, n " << n;
      EXPECT_TRUE(torch::equal(msd.cpu(), m_scales) && torch::equal(vsd.cpu(), v_scales)) << "Init's scales, n " << n;
    }
    for (int64_t step = 1; step <= 5; ++step) {
      const std::string what =
          "n " + std::to_string(n) + " offset " + std::to_string(c.offset) + " step " + std::to_string(step);
      AdamWArgs a{1e-3, 0.9, 0.95, 1e-8, 0.1, step, step == 3 ? 0.5 : 1.0};
      if (step == 2) a.weight_decay = 0;  // a span of norms
      auto g = torch::randn({n}) * block_size.repeat_interleave(kAdamW8bitBlock).narrow(0, 0, n);
      g.narrow(0, zero_block * kAdamW8bitBlock, kAdamW8bitBlock).zero_();
      g[huge_at] = 1e4;
      // The GPU from the reference's state.
      auto pd = OnDevice(p, c.offset), gd = OnDevice(g, c.offset);
      auto mcd = OnDevice(m_codes, c.offset), vcd = OnDevice(v_codes, c.offset), msd = OnDevice(m_scales, 0),
           vsd = OnDevice(v_scales, 0);
      AdamW8bit(place_, a, pd.data_ptr<float>(), gd.data_ptr<float>(), mcd.data_ptr<uint8_t>(), msd.data_ptr<float>(),
                vcd.data_ptr<uint8_t>(), vsd.data_ptr<float>(), n);
      // The fp32 moments before quantizing (fp32 AdamW on the dequantized state), to judge a
      // differing code by; then the reference's step.
      auto m = torch::empty({n}), v = torch::empty({n}), p32 = p.clone();
      Dequantize8bit(Place{}, true, m_codes.data_ptr<uint8_t>(), m_scales.data_ptr<float>(), m.data_ptr<float>(), n);
      Dequantize8bit(Place{}, false, v_codes.data_ptr<uint8_t>(), v_scales.data_ptr<float>(), v.data_ptr<float>(), n);
      AdamWReference(a, p32.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n);
      AdamW8bitReference(a, p.data_ptr<float>(), g.data_ptr<float>(), m_codes.data_ptr<uint8_t>(),
                         m_scales.data_ptr<float>(), v_codes.data_ptr<uint8_t>(), v_scales.data_ptr<float>(), n);
      const auto gpu_m_codes = mcd.cpu(), gpu_v_codes = vcd.cpu(), gpu_m_scales = msd.cpu(), gpu_v_scales = vsd.cpu(),
                 gpu_p = pd.cpu();
      EXPECT_LE(MaxRelative(gpu_m_scales, m_scales), 1e-6) << what;
      EXPECT_LE(MaxRelative(gpu_v_scales, v_scales), 1e-6) << what;
      EXPECT_LE(MaxRelative(gpu_p, p), 1e-6) << what;
      int64_t differing = 0;
      for (const bool is_m : {true, false}) {
        const auto& ours = is_m ? gpu_m_codes : gpu_v_codes;
        const auto& ref = is_m ? m_codes : v_codes;
        const auto at = ours.ne(ref).nonzero().squeeze(1);
        differing += at.numel();
        if (at.numel() == 0) continue;
        const auto& table = is_m ? m_table : v_table;
        const auto ci = ours.index({at}).to(torch::kLong), cr = ref.index({at}).to(torch::kLong);
        const auto unit =
            (is_m ? m : v).index({at}) / (is_m ? m_scales : v_scales).index({torch::div(at, kAdamW8bitBlock, "floor")});
        const auto midpoint = (table.index({ci}) + table.index({cr})) / 2;
        EXPECT_TRUE((ci - cr).abs().eq(1).all().item<bool>())
            << what << (is_m ? " m" : " v") << ": a differing code is a neighbour";
        EXPECT_LE(((unit - midpoint).abs() - midpoint.abs() * std::ldexp(1.0, -21)).max().item<double>(), 0.0)
            << what << (is_m ? " m" : " v") << ": a differing code is a tie within 4 ulps";
      }
      EXPECT_LE(differing, n / 10000) << what << ": ties are rare";
      // Bit for bit.
      EXPECT_EQ(differing, 0) << what;
      EXPECT_TRUE(torch::equal(gpu_m_scales, m_scales) && torch::equal(gpu_v_scales, v_scales)) << what;
      EXPECT_TRUE(torch::equal(gpu_p, p)) << what;
      // Deterministic: the same step twice from one state gives the same bits.
      auto again = [&] {
        std::vector<torch::Tensor> state = {OnDevice(gpu_p, c.offset), OnDevice(gpu_m_codes, c.offset),
                                            OnDevice(gpu_m_scales, 0), OnDevice(gpu_v_codes, c.offset),
                                            OnDevice(gpu_v_scales, 0)};
        AdamW8bit(place_, a, state[0].data_ptr<float>(), gd.data_ptr<float>(), state[1].data_ptr<uint8_t>(),
                  state[2].data_ptr<float>(), state[3].data_ptr<uint8_t>(), state[4].data_ptr<float>(), n);
        return state;
      };
      const auto first = again(), second = again();
      for (size_t k = 0; k < first.size(); ++k)
        EXPECT_TRUE(torch::equal(first[k], second[k])) << what << ": deterministic, tensor " << k;
    }
    EXPECT_EQ(m_scales[zero_block].item<float>(), 0.0f) << "a block without gradient keeps scale 0";
    EXPECT_EQ(m_table[int64_t{m_codes[huge_at].item<uint8_t>()}].item<float>(), 1.0f)
        << "the huge value is its block's largest m";
  }
}

// Quantize8bit and Dequantize8bit on the GPU as on the CPU, bit for bit (checkpoints written on
// one read on the other), aligned and one element past an allocation.
TEST_F(KernelsGpuTest, Quantize8bitAndDequantize8bitEqualTheReference) {
  torch::manual_seed(16);
  const int64_t n = 1'000'003;
  for (const int64_t offset : {0, 1}) {
    for (const bool is_signed : {true, false}) {
      const std::string what = std::string(is_signed ? "signed" : "unsigned") + " offset " + std::to_string(offset);
      auto x = torch::randn({n}) * torch::pow(10.0, torch::rand({n}) * 8 - 6);
      if (!is_signed) x = x.abs();
      x.narrow(0, 3 * kAdamW8bitBlock, kAdamW8bitBlock).zero_();
      auto codes = torch::empty({n}, torch::kUInt8), scales = torch::empty({AdamW8bitBlocks(n)}),
           back = torch::empty({n});
      Quantize8bit(Place{}, is_signed, x.data_ptr<float>(), codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), n);
      Dequantize8bit(Place{}, is_signed, codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), back.data_ptr<float>(),
                     n);
      auto xd = OnDevice(x, offset), codesd = OnDevice(torch::zeros({n}, torch::kUInt8), offset);
      auto scalesd = OnDevice(torch::zeros({AdamW8bitBlocks(n)}), 0), backd = OnDevice(torch::zeros({n}), offset);
      Quantize8bit(place_, is_signed, xd.data_ptr<float>(), codesd.data_ptr<uint8_t>(), scalesd.data_ptr<float>(), n);
      Dequantize8bit(place_, is_signed, codesd.data_ptr<uint8_t>(), scalesd.data_ptr<float>(), backd.data_ptr<float>(),
                     n);
      EXPECT_TRUE(torch::equal(codesd.cpu(), codes)) << what;
      EXPECT_TRUE(torch::equal(scalesd.cpu(), scales)) << what;
      EXPECT_TRUE(torch::equal(backd.cpu(), back)) << what;
    }
  }
}

// ZeRO-3's shard lookups (zero3_lookup.cc): the gather and the deterministic scatter-add
// bit for bit against the references, with ids repeated hundreds of times (a frequent token: runs
// over many chunks of the sorted ids), ids of rows the shard does not hold and ids outside the
// table; the scratch starts as NaN. Shapes:
//   packed (a row of 768, the shard starting at a multiple of 4), the long run inside the shard;
//   packed, the long run on the row the shard's end cuts 3 elements past a pack (packs, then
//     single elements, through the chunks' parts);
//   element by element (a row of 30, a shard cutting rows anywhere and reaching the table's end),
//     and packed over a whole table: a run of the last row to the sorted ids' end (no id past it).
TEST_F(KernelsGpuTest, ShardRowsGatherAndScatterAddEqualTheReferenceBitForBit) {
  torch::manual_seed(16);
  struct Shape {
    int64_t rows, cols, begin, end, long_row;
    bool id_past_table;  // an id >= rows (sorts last), else a second negative one
  };
  for (const Shape& shape_case :
       {Shape{1000, 768, 768 * 300 + 128, 768 * 700 - 256, 500, true},
        Shape{1000, 64, 64 * 100 + 8, 64 * 700 - 57, 699, true}, Shape{500, 30, 4001, 500 * 30, 300, false},
        Shape{300, 32, 0, 300 * 32, 150, false}}) {
    const auto [rows, cols, begin, end, long_row, id_past_table] = shape_case;
    const int64_t n = 4099;  // not a whole number of chunks
    auto ids = torch::randint(0, rows, {n}, torch::kLong);
    ids.narrow(0, 0, 600).fill_(long_row);    // a run of 600+
    ids.narrow(0, 602, 100).fill_(rows - 1);  // a run of 100+ of the table's last row
    ids[600] = -1;                            // outside the table: zeros, and no gradient
    ids[601] = id_past_table ? rows + 5 : -2;
    const auto shard = torch::randn({end - begin});
    const ShardRowsShape shape{cols, begin, end};
    auto out = torch::empty({n, cols});
    ShardRowsGatherReference(shape, shard.data_ptr<float>(), ids.data_ptr<int64_t>(), n, out.data_ptr<float>());
    const auto shard_d = shard.cuda(), ids_d = ids.cuda();
    auto out_d = torch::full({n, cols}, 3.0f, shard_d.options());
    ShardRowsGather(place_, shape, shard_d.data_ptr<float>(), ids_d.data_ptr<int64_t>(), n, out_d.data_ptr<float>());
    EXPECT_TRUE(torch::equal(out_d.cpu(), out)) << "cols " << cols;

    const auto dy = torch::randn({n, cols});
    const auto sorted = torch::sort(ids, /*stable=*/true, 0, false);
    auto grad = torch::randn({end - begin});
    auto grad_d = grad.cuda();
    ShardRowsScatterAddReference(shape, dy.data_ptr<float>(), std::get<0>(sorted).data_ptr<int64_t>(),
                                 std::get<1>(sorted).data_ptr<int64_t>(), n, grad.data_ptr<float>());
    const auto dy_d = dy.cuda();
    const auto sorted_d = torch::sort(ids_d, /*stable=*/true, 0, false);  // the worker sorts on the device
    auto scratch = torch::full({ShardRowsScatterAddScratch(n, cols)}, std::nanf(""), dy_d.options());
    ShardRowsScatterAdd(place_, shape, dy_d.data_ptr<float>(), std::get<0>(sorted_d).data_ptr<int64_t>(),
                        std::get<1>(sorted_d).data_ptr<int64_t>(), n, grad_d.data_ptr<float>(),
                        scratch.data_ptr<float>());
    EXPECT_TRUE(torch::equal(grad_d.cpu(), grad)) << "cols " << cols << ", max relative " << MaxRelative(grad_d, grad);
    // Without its scratch the call is refused, not run through a null pointer.
    EXPECT_THROW(ShardRowsScatterAdd(place_, shape, dy_d.data_ptr<float>(), std::get<0>(sorted_d).data_ptr<int64_t>(),
                                     std::get<1>(sorted_d).data_ptr<int64_t>(), n, grad_d.data_ptr<float>(), nullptr),
                 std::invalid_argument);
  }
}

// NF4 (QLoRA's base) on the device: quantizing there gives quant::QuantizeNf4's bytes - every
// packed code, block-scale code and nested scale, and the mean - and dequantizing gives
// quant::DequantizeNf4's values, in fp32 and bf16, aligned and not. Heavy-tailed values (so the
// 8-bit nesting meets scales over decades), all-zero blocks, values on the NF4 midpoints, a short
// last block, a partial nested group and an odd count (the zero pad nibble).
struct Nf4Case {
  int64_t n;
  bool bf16;
};

quant::Nf4Tensor Nf4Reference(const torch::Tensor& host) {
  auto q = host.scalar_type() == torch::kBFloat16
               ? quant::QuantizeNf4Bf16(reinterpret_cast<const uint16_t*>(host.data_ptr()), {host.numel()})
               : quant::QuantizeNf4(host.data_ptr<float>(), {host.numel()});
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return std::move(q).value();
}

std::vector<uint8_t> Bytes(const torch::Tensor& t) {
  const torch::Tensor h = t.cpu().contiguous();
  return std::vector<uint8_t>(h.data_ptr<uint8_t>(), h.data_ptr<uint8_t>() + h.numel());
}

TEST_F(KernelsGpuTest, Nf4QuantizeOnTheDeviceIsTheReferenceBitForBit) {
  torch::manual_seed(21);
  for (const Nf4Case c : {Nf4Case{37 * 91, false}, Nf4Case{4096 * 1024 + 77, false}, Nf4Case{2'400'001, true},
                          Nf4Case{64 * 256 * 3, true}, Nf4Case{5, false}}) {
    SCOPED_TRACE(std::to_string(c.n) + (c.bf16 ? " bf16" : " fp32"));
    torch::Tensor x = torch::randn({c.n}) * torch::randn({c.n}).pow(3);
    if (c.n > 64 * 40) {
      x.narrow(0, 64 * 7, 64).zero_();  // an all-zero block: codes 0
      // A block whose largest |w| is 1 and whose others sit on the midpoints: each takes the lower code.
      auto mids = torch::from_blob(const_cast<float*>(quant::Nf4Thresholds().data()), {15}).clone();
      x.narrow(0, 64 * 20, 64).fill_(0.25f);
      x[64 * 20] = 1.0f;
      x.narrow(0, 64 * 20 + 1, 15).copy_(mids);
    }
    if (c.bf16) x = x.to(torch::kBFloat16);
    const quant::Nf4Tensor expected = Nf4Reference(x);
    const int64_t blocks = expected.num_blocks();
    const auto xd = x.cuda();
    auto codes = torch::full({(c.n + 1) / 2}, 0xAB, xd.options().dtype(torch::kUInt8));
    auto absmax = torch::full({blocks}, 7.0f, xd.options().dtype(torch::kFloat));
    auto bad = torch::full({1}, c.n, xd.options().dtype(torch::kLong));
    Nf4QuantizeBlocks(place_, c.bf16 ? DType::kBFloat16 : DType::kFloat32, xd.data_ptr(), c.n,
                      codes.data_ptr<uint8_t>(), absmax.data_ptr<float>(), bad.data_ptr<int64_t>());
    EXPECT_EQ(bad.item<int64_t>(), c.n);
    EXPECT_EQ(Bytes(codes), expected.codes);
    const torch::Tensor host_absmax = absmax.cpu();
    double sum = 0;
    for (int64_t b = 0; b < blocks; ++b) sum += host_absmax.data_ptr<float>()[b];
    const float offset = static_cast<float>(sum / static_cast<double>(blocks));
    EXPECT_EQ(offset, expected.offset);
    auto absmax_codes = torch::full({blocks}, 0xCD, codes.options());
    auto nested = torch::full({static_cast<int64_t>(expected.nested_absmax.size())}, 7.0f, absmax.options());
    Nf4NestAbsmax(place_, absmax.data_ptr<float>(), blocks, offset, absmax_codes.data_ptr<uint8_t>(),
                  nested.data_ptr<float>());
    EXPECT_EQ(Bytes(absmax_codes), expected.absmax_codes);
    const torch::Tensor nested_host = nested.cpu();
    EXPECT_EQ(std::vector<float>(nested_host.data_ptr<float>(), nested_host.data_ptr<float>() + nested_host.numel()),
              expected.nested_absmax);
  }
}

TEST_F(KernelsGpuTest, Nf4QuantizeNamesTheFirstValueThatIsNotFinite) {
  torch::Tensor x = torch::randn({100'000});
  x[70'001] = std::numeric_limits<float>::infinity();
  x[90'000] = std::numeric_limits<float>::quiet_NaN();
  const auto xd = x.cuda();
  auto codes = torch::empty({50'000}, xd.options().dtype(torch::kUInt8));
  auto absmax = torch::empty({(100'000 + 63) / 64}, xd.options());
  auto bad = torch::full({1}, 100'000, xd.options().dtype(torch::kLong));
  Nf4QuantizeBlocks(place_, DType::kFloat32, xd.data_ptr(), 100'000, codes.data_ptr<uint8_t>(),
                    absmax.data_ptr<float>(), bad.data_ptr<int64_t>());
  EXPECT_EQ(bad.item<int64_t>(), 70'001);
}

TEST_F(KernelsGpuTest, Nf4DequantizeEqualsTheReferenceBitForBit) {
  torch::manual_seed(22);
  for (const int64_t n : {int64_t{37 * 91}, int64_t{4096 * 1024 + 77}, int64_t{15}}) {
    torch::Tensor x = torch::randn({n}) * torch::randn({n}).pow(3);
    const quant::Nf4Tensor q = Nf4Reference(x);
    auto values = quant::DequantizeNf4(q);
    auto bf16 = quant::DequantizeNf4Bf16(q);
    ASSERT_TRUE(values.ok() && bf16.ok());
    auto u8 = [](const std::vector<uint8_t>& v) {
      return torch::from_blob(const_cast<uint8_t*>(v.data()), {static_cast<int64_t>(v.size())}, torch::kUInt8)
          .clone()
          .cuda();
    };
    auto f32 = [](const std::vector<float>& v) {
      return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}).clone().cuda();
    };
    const auto codes = u8(q.codes), absmax_codes = u8(q.absmax_codes);
    const auto nested = f32(q.nested_absmax), map = f32(q.nested_quant_map);
    Nf4Parts parts{codes.data_ptr<uint8_t>(),
                   absmax_codes.data_ptr<uint8_t>(),
                   nested.data_ptr<float>(),
                   map.data_ptr<float>(),
                   q.offset,
                   n};
    const torch::Tensor expected32 = torch::from_blob(values->data(), {n}).clone();
    const torch::Tensor expected16 = torch::from_blob(bf16->data(), {n}, torch::kInt16).clone();
    for (const int64_t offset : {0, 1}) {  // one element past an allocation: the element-wise path
      SCOPED_TRACE(std::to_string(n) + " offset " + std::to_string(offset));
      auto out32 = OnDevice(torch::full({n}, 9.0f), offset);
      Nf4Dequantize(place_, parts, DType::kFloat32, out32.data_ptr());
      EXPECT_TRUE(torch::equal(out32.cpu(), expected32)) << MaxRelative(out32, expected32);
      auto out16 = OnDevice(torch::full({n}, 9, torch::kInt16), offset);
      Nf4Dequantize(place_, parts, DType::kBFloat16, out16.data_ptr());
      EXPECT_TRUE(torch::equal(out16.cpu(), expected16));
    }
  }
}

TEST_F(KernelsGpuTest, DrawNormalIsTheHostsBitForBitForAnySlice) {
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3 * 1024 * 1024 + 5}}) {
    for (const int64_t first : {int64_t{0}, int64_t{12'345}}) {
      SCOPED_TRACE(std::to_string(n) + " from " + std::to_string(first));
      torch::Tensor host = torch::empty({n});
      DrawNormalHost(0x5eedull, first, 0.25f, 0.02f, host.data_ptr<float>(), n, 4);
      auto device = OnDevice(torch::full({n}, 9.0f), 0);
      DrawNormal(place_, 0x5eedull, first, 0.25f, 0.02f, device.data_ptr<float>(), n);
      EXPECT_TRUE(torch::equal(device.cpu(), host)) << MaxRelative(device, host);
    }
  }
}

}  // namespace
}  // namespace strata::kernels
