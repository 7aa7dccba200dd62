// The CUDA kernels against their CPU references (kernels/kernels.h) on the same inputs, on the
// GPU: aligned and unaligned (a ZeRO shard starting mid-vector) pointers, a length that is not
// a multiple of the vector width, and the reduction accumulating into a device scalar.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/kernels.h"

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

TEST_F(KernelsGpuTest, AdamWEqualsTheReferenceAlignedAndNot) {
  torch::manual_seed(5);
  for (int64_t offset : {0, 1, 3}) {
    const int64_t n = 1'000'003;
    auto host = [&] { return torch::randn({n + offset}); };
    auto p = host(), m = host().abs() * 0.1, v = host().abs() * 0.01, mask = (torch::rand({n + offset}) > 0.4).to(torch::kFloat);
    auto pd = p.cuda(), md = m.cuda(), vd = v.cuda(), maskd = mask.cuda();
    for (int64_t step = 1; step <= 5; ++step) {
      const AdamWArgs a{1e-3, 0.9, 0.95, 1e-8, 0.1, step, step == 3 ? 0.5 : 1.0};
      auto g = torch::randn({n + offset});
      auto gd = g.cuda();
      AdamWReference(a, p.data_ptr<float>() + offset, g.data_ptr<float>() + offset, m.data_ptr<float>() + offset,
                     v.data_ptr<float>() + offset, mask.data_ptr<float>() + offset, n);
      AdamW(place_, a, pd.data_ptr<float>() + offset, gd.data_ptr<float>() + offset, md.data_ptr<float>() + offset,
            vd.data_ptr<float>() + offset, maskd.data_ptr<float>() + offset, n);
    }
    EXPECT_LE(MaxRelative(pd, p), 1e-6) << "offset " << offset;
    EXPECT_LE(MaxRelative(md, m), 1e-6) << "offset " << offset;
    EXPECT_LE(MaxRelative(vd, v), 1e-6) << "offset " << offset;
  }
}

TEST_F(KernelsGpuTest, MaskedSquareSumEqualsTheReferenceAndIsDeterministic) {
  torch::manual_seed(6);
  const int64_t n = 12'345'679;
  auto g = torch::randn({n}), mask = (torch::rand({n}) > 0.5).to(torch::kFloat);
  float expected = 1.0f;
  MaskedSquareSumReference(g.data_ptr<float>(), mask.data_ptr<float>(), n, &expected);
  auto gd = g.cuda(), maskd = mask.cuda();
  auto scratch = torch::empty({MaskedSquareSumScratch()}, gd.options());
  std::vector<float> results;
  for (int run = 0; run < 3; ++run) {
    auto out = torch::ones({1}, gd.options());
    MaskedSquareSum(place_, gd.data_ptr<float>(), maskd.data_ptr<float>(), n, out.data_ptr<float>(), scratch.data_ptr<float>());
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
      CrossEntropyGradInPlaceReference(d, ref.data_ptr(), rows, vocab, stride, targets.data_ptr<int64_t>(), 0.5f, ref_loss.data_ptr<float>());
      auto gpu = logits.cuda();
      auto gpu_targets = targets.cuda();
      auto gpu_loss = torch::empty({rows}, gpu.options().dtype(torch::kFloat));
      CrossEntropyGradInPlace(place_, d, gpu.data_ptr(), rows, vocab, stride, gpu_targets.data_ptr<int64_t>(), 0.5f,
                              gpu_loss.data_ptr<float>());
      EXPECT_LE(MaxRelative(gpu_loss, ref_loss), 1e-6) << "stride " << stride << " " << dtype;
      auto diff = (gpu.cpu().to(torch::kFloat) - ref.to(torch::kFloat)).abs();
      // fp32: exp's rounding; bf16: at most one ulp where the fp32 values straddle a boundary.
      const double bound = dtype == torch::kFloat ? 4e-6 : 1.0 / 128;
      EXPECT_LE((diff - ref.to(torch::kFloat).abs() * bound).max().item<double>(), 1e-9) << "stride " << stride << " " << dtype;
    }
  }
}

}  // namespace
}  // namespace strata::kernels
