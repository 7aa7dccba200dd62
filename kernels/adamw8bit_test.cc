// kernels.h's AdamW8bit on the CPU: the code tables; the reference step against a plain LibTorch
// implementation written here from kernels.h's maths (dequantize by table lookup, AdamW op by op
// in fp32, quantize by brute force over all 256 codes); the quantization's error bound; block
// edges (a partial last block, all-zero blocks, one huge value); and 8-bit AdamW tracking fp32
// AdamW on a small problem. The reference rounds each fp32 operation once, as LibTorch's
// elementwise ops do, so the two agree bit for bit: codes, scales and parameters are compared
// for equality, not within a tolerance.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

constexpr int64_t kBlock = kAdamW8bitBlock;

torch::Tensor Table(bool is_signed) {
  return torch::from_blob(const_cast<float*>(AdamW8bitCodeTable(is_signed)), {256}, torch::kFloat).clone();
}

// Half the widest gap between neighbouring codes: the quantization error bound, per unit of scale.
double HalfGap(bool is_signed) {
  const auto t = Table(is_signed);
  return (t.slice(0, 1) - t.slice(0, 0, 255)).max().item<double>() / 2;
}

int64_t Blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// One scale per element: its block's.
torch::Tensor PerElement(const torch::Tensor& scales, int64_t n) {
  return scales.repeat_interleave(kBlock).narrow(0, 0, n);
}

// kernels.h's quantization, by brute force: every code's fp32 distance, the first (lowest) of the
// nearest.
void BruteForceQuantize(const torch::Tensor& x, bool is_signed, torch::Tensor* codes, torch::Tensor* scales) {
  const int64_t n = x.numel();
  auto padded = torch::zeros({Blocks(n) * kBlock});
  padded.narrow(0, 0, n).copy_(x.abs());
  *scales = padded.view({Blocks(n), kBlock}).amax(1);
  const auto scale = PerElement(*scales, n);
  const auto unit = torch::where(scale > 0, x / scale, torch::zeros_like(x));
  *codes = (unit.unsqueeze(1) - Table(is_signed).unsqueeze(0)).abs().argmin(1).to(torch::kUInt8);
}

torch::Tensor TableDequantize(const torch::Tensor& codes, const torch::Tensor& scales, bool is_signed) {
  return Table(is_signed).index({codes.to(torch::kLong)}) * PerElement(scales, codes.numel());
}

struct State8 {
  torch::Tensor m_codes, m_scales, v_codes, v_scales;

  static State8 Fresh(int64_t n) {
    State8 s{torch::empty({n}, torch::kUInt8), torch::empty({Blocks(n)}), torch::empty({n}, torch::kUInt8),
             torch::empty({Blocks(n)})};
    AdamW8bitInit(Place{}, s.m_codes.data_ptr<uint8_t>(), s.m_scales.data_ptr<float>(), s.v_codes.data_ptr<uint8_t>(),
                  s.v_scales.data_ptr<float>(), n);
    return s;
  }
  State8 Clone() const { return {m_codes.clone(), m_scales.clone(), v_codes.clone(), v_scales.clone()}; }
};

// The step through the Place-dispatching call (the CPU runs the reference).
// `decayed` false: a span of norms and biases (weight decay 0).
void Step8(AdamWArgs a, torch::Tensor& p, const torch::Tensor& g, State8& s, bool decayed) {
  if (!decayed) a.weight_decay = 0;
  AdamW8bit(Place{}, a, p.data_ptr<float>(), g.data_ptr<float>(), s.m_codes.data_ptr<uint8_t>(),
            s.m_scales.data_ptr<float>(), s.v_codes.data_ptr<uint8_t>(), s.v_scales.data_ptr<float>(), p.numel());
}

torch::Tensor DecayMask(int64_t n, bool decayed) { return torch::full({n}, decayed ? 1.0f : 0.0f); }

// kernels.h's step written plainly: dequantize, AdamW op by op with the scalar factors rounded to
// fp32 once, quantize by brute force. `m` and `v` get the new moments before quantizing.
State8 LibTorchStep8(const AdamWArgs& a, torch::Tensor& p, const torch::Tensor& grad, const State8& s,
                     const torch::Tensor& decay, torch::Tensor* m_out = nullptr, torch::Tensor* v_out = nullptr) {
  const double t = static_cast<double>(a.step);
  const float decay_factor = static_cast<float>(-a.lr * a.weight_decay), beta1 = static_cast<float>(a.beta1),
              one_minus_beta1 = static_cast<float>(1.0 - a.beta1), beta2 = static_cast<float>(a.beta2),
              one_minus_beta2 = static_cast<float>(1.0 - a.beta2),
              sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(a.beta2, t))),
              step_size = static_cast<float>(-a.lr / (1.0 - std::pow(a.beta1, t))), eps = static_cast<float>(a.eps),
              grad_scale = static_cast<float>(a.grad_scale);
  auto m = TableDequantize(s.m_codes, s.m_scales, true), v = TableDequantize(s.v_codes, s.v_scales, false);
  const auto g = grad * grad_scale;
  p = p * (decay * decay_factor + 1.0f);
  m = m * beta1 + g * one_minus_beta1;
  v = v * beta2 + (g * g) * one_minus_beta2;
  const auto denom = v.sqrt() / torch::full_like(v, sqrt_bc2) + eps;  // a tensor divisor: a true division
  p = p + (m / denom) * step_size;
  State8 out;
  BruteForceQuantize(m, true, &out.m_codes, &out.m_scales);
  BruteForceQuantize(v, false, &out.v_codes, &out.v_scales);
  if (m_out) *m_out = m;
  if (v_out) *v_out = v;
  return out;
}

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

int64_t Differing(const torch::Tensor& a, const torch::Tensor& b) { return a.ne(b).sum().item<int64_t>(); }

// |dequantize(quantize(x)) - x| <= scale * (half the widest gap) per element; the slack is fp32
// rounding of x / scale and of code * scale (a few ulps of the scale).
void ExpectWithinQuantizationBound(const torch::Tensor& dequantized, const torch::Tensor& x,
                                   const torch::Tensor& scales, bool is_signed, const std::string& what) {
  const auto bound = PerElement(scales, x.numel()) * (HalfGap(is_signed) + 1e-6);
  const auto excess = (dequantized - x).abs() - bound;
  EXPECT_LE(excess.max().item<double>(), 0.0) << what << ": worst at " << excess.argmax().item<int64_t>();
}

TEST(AdamW8bitTest, CodeTablesAreTheDynamicMapsHoldingZeroAndOne) {
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const auto t = Table(is_signed);
    EXPECT_TRUE((t.slice(0, 1) > t.slice(0, 0, 255)).all().item<bool>()) << "sorted, no code twice";
    EXPECT_EQ(t[255].item<float>(), 1.0f);
    EXPECT_EQ(t[0].item<float>(), is_signed ? -1.0f : 0.0f);
    EXPECT_EQ(t[is_signed ? 127 : 0].item<float>(), 0.0f) << "the code of 0 (AdamW8bitInit's)";
    EXPECT_EQ(AdamW8bitCodeTable(is_signed), AdamW8bitCodeTable(is_signed)) << "built once";
    // bitsandbytes' decades: 2^d (signed) or 2^(d+1) (unsigned) positive codes in
    // (0.1, 1) * 10^(d-6), for d = 0..6; then 1.
    for (int d = 0; d < 7; ++d) {
      const double low = 0.1 * std::pow(10.0, d - 6), high = std::pow(10.0, d - 6);
      EXPECT_EQ(((t > low) & (t < high)).sum().item<int64_t>(), is_signed ? 1 << d : 2 << d) << "decade " << d;
    }
    // The widest gap: the top decade's, 0.9 / its number of codes.
    EXPECT_NEAR(2 * HalfGap(is_signed), is_signed ? 0.9 / 64 : 0.9 / 128, 1e-7);
  }
  const auto s = Table(true), u = Table(false);
  // Signed: symmetric but for +c_{0,0} = 0.55e-6, whose negative's place -1 took.
  EXPECT_TRUE(torch::equal(s.slice(0, 0, 127), -s.slice(0, 129, 256).flip(0)));
  EXPECT_EQ(s[128].item<float>(), 0.55e-6f);
  // Values of bitsandbytes' maps (the midpoints of 0.1 + 0.9 k / N), rounded to fp32.
  EXPECT_EQ(s[254].item<float>(), 0.99296875f);
  EXPECT_EQ(s[1].item<float>(), -0.99296875f);
  EXPECT_EQ(s[129].item<float>(), 3.25e-6f);
  EXPECT_EQ(u[1].item<float>(), 3.25e-7f);
  EXPECT_EQ(u[2].item<float>(), 7.75e-7f);
  EXPECT_EQ(u[254].item<float>(), 0.996484375f);
}

TEST(AdamW8bitTest, QuantizeEqualsBruteForceWithinTheErrorBoundAtBlockEdges) {
  torch::manual_seed(21);
  const int64_t n = 5 * kBlock + 37;  // a partial last block
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    // Magnitudes over many decades, so every part of the table is used.
    auto x = torch::randn({n}) * torch::pow(10.0, torch::rand({n}) * 8 - 6);
    if (!is_signed) x = x.abs();
    x.narrow(0, kBlock, kBlock).zero_();  // block 1: all zero
    // Block 2: one huge value (negative when signed: -1's code) among small ones.
    const int64_t huge_at = 2 * kBlock + 17;
    x.narrow(0, 2 * kBlock, kBlock).copy_(torch::randn({kBlock}) * 1e-4);
    if (!is_signed) x.narrow(0, 2 * kBlock, kBlock).abs_();
    x[huge_at] = is_signed ? -5e4 : 5e4;
    auto codes = torch::empty({n}, torch::kUInt8), scales = torch::empty({Blocks(n)}), back = torch::empty({n});
    Quantize8bit(Place{}, is_signed, x.data_ptr<float>(), codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), n);
    Dequantize8bit(Place{}, is_signed, codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), back.data_ptr<float>(), n);
    torch::Tensor expected_codes, expected_scales;
    BruteForceQuantize(x, is_signed, &expected_codes, &expected_scales);
    EXPECT_EQ(Differing(codes, expected_codes), 0);
    EXPECT_TRUE(torch::equal(scales, expected_scales));
    EXPECT_TRUE(torch::equal(back, TableDequantize(codes, scales, is_signed)));
    ExpectWithinQuantizationBound(back, x, scales, is_signed, "random");
    // Each block's largest |x| and its zeros come back exactly.
    for (int64_t b = 0; b < Blocks(n); ++b) {
      const auto block = x.narrow(0, b * kBlock, std::min(kBlock, n - b * kBlock));
      const int64_t at = b * kBlock + block.abs().argmax().item<int64_t>();
      EXPECT_EQ(back[at].item<float>(), x[at].item<float>()) << "block " << b;
    }
    EXPECT_EQ(scales[1].item<float>(), 0.0f);
    EXPECT_TRUE(codes.narrow(0, kBlock, kBlock).eq(is_signed ? 127 : 0).all().item<bool>()) << "zeros: the code of 0";
    EXPECT_TRUE(back.narrow(0, kBlock, kBlock).eq(0).all().item<bool>());
    EXPECT_EQ(scales[2].item<float>(), 5e4f);
    EXPECT_EQ(back[huge_at].item<float>(), x[huge_at].item<float>());
    // Beside it the rest of block 2 (|x| ~ 1e-4, 2e-9 of the scale, under half the smallest
    // nonzero code) is stored as 0: what blockwise scales cost, and why the blocks are small.
    auto others = torch::ones({kBlock}, torch::kBool);
    others[17] = false;
    EXPECT_TRUE(codes.narrow(0, 2 * kBlock, kBlock).masked_select(others).eq(is_signed ? 127 : 0).all().item<bool>());
  }
}

TEST(AdamW8bitTest, QuantizeBreaksTiesToTheLowerCode) {
  // A block of scale 1 holding the fp32 midpoint of every pair of neighbouring codes: where the
  // two fp32 distances are equal the lower code wins, as in the brute force.
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const auto t = Table(is_signed);
    auto x = torch::cat({torch::ones({1}), (t.slice(0, 0, 255) + t.slice(0, 1)) / 2});  // 256 values, largest 1
    auto codes = torch::empty({256}, torch::kUInt8), scales = torch::empty({1});
    Quantize8bit(Place{}, is_signed, x.data_ptr<float>(), codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), 256);
    torch::Tensor expected_codes, expected_scales;
    BruteForceQuantize(x, is_signed, &expected_codes, &expected_scales);
    EXPECT_TRUE(torch::equal(codes, expected_codes));
    const auto lower = torch::arange(255).to(torch::kUInt8), chosen = codes.slice(0, 1);
    const auto tied = ((x.slice(0, 1) - t.slice(0, 0, 255)).abs() == (t.slice(0, 1) - x.slice(0, 1)).abs());
    EXPECT_GT(tied.sum().item<int64_t>(), 100) << "most fp32 midpoints are exact ties";
    EXPECT_TRUE(chosen.masked_select(tied).eq(lower.masked_select(tied)).all().item<bool>());
  }
}

TEST(AdamW8bitTest, ReferenceEqualsLibTorchOpByOpBitForBitOverSteps) {
  torch::manual_seed(22);
  const int64_t n = 39 * kBlock + 23;  // a partial last block
  // Gradients of very different sizes per block, as across a model's tensors.
  const auto block_size = torch::pow(10.0, torch::randn({Blocks(n)}) * 1.5);
  const int64_t zero_block = 5, huge_at = 3 * kBlock + 77;
  block_size[huge_at / kBlock] = 1.0;  // so that 1e4 is its block's largest gradient
  auto p = torch::randn({n}), p_theirs = p.clone();
  State8 ours = State8::Fresh(n), theirs = ours.Clone();
  for (int64_t step = 1; step <= 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const AdamWArgs a{step <= 10 ? 3e-3 : 1e-3, 0.9, 0.95, 1e-8, 0.1, step, step % 3 == 0 ? 0.37 : 1.0};
    auto g = torch::randn({n}) * PerElement(block_size, n);
    g.narrow(0, zero_block * kBlock, kBlock).zero_();  // never a gradient: the moments stay 0
    g[huge_at] = 1e4;
    const bool decayed = step % 2 == 0;  // the step of a span of matrices, then of one of norms
    Step8(a, p, g, ours, decayed);
    torch::Tensor m, v;
    theirs = LibTorchStep8(a, p_theirs, g, theirs, DecayMask(n, decayed), &m, &v);
    ASSERT_EQ(Differing(ours.m_codes, theirs.m_codes), 0);
    ASSERT_EQ(Differing(ours.v_codes, theirs.v_codes), 0);
    ASSERT_TRUE(torch::equal(ours.m_scales, theirs.m_scales));
    ASSERT_TRUE(torch::equal(ours.v_scales, theirs.v_scales));
    ASSERT_LE(MaxRelative(p, p_theirs), 1e-6);
    ASSERT_TRUE(torch::equal(p, p_theirs)) << "each fp32 operation rounded once on both sides";
    // The stored moments are the fp32 ones within the quantization bound.
    ExpectWithinQuantizationBound(TableDequantize(ours.m_codes, ours.m_scales, true), m, ours.m_scales, true, "m");
    ExpectWithinQuantizationBound(TableDequantize(ours.v_codes, ours.v_scales, false), v, ours.v_scales, false, "v");
    EXPECT_EQ(TableDequantize(ours.m_codes, ours.m_scales, true)[huge_at].item<float>(), m[huge_at].item<float>())
        << "the huge value is its block's largest: stored exactly";
  }
  EXPECT_EQ(ours.m_scales[zero_block].item<float>(), 0.0f);
  EXPECT_EQ(ours.v_scales[zero_block].item<float>(), 0.0f);
  EXPECT_TRUE(ours.m_codes.narrow(0, zero_block * kBlock, kBlock).eq(127).all().item<bool>());
  EXPECT_TRUE(ours.v_codes.narrow(0, zero_block * kBlock, kBlock).eq(0).all().item<bool>());
  EXPECT_GT(torch::bincount(ours.m_codes.to(torch::kLong), {}, 256).gt(0).sum().item<int64_t>(), 200)
      << "the steps used most of the table";
}

TEST(AdamW8bitTest, OnTheDequantizedStateTheStepIsFp32AdamWs) {
  // One step from a non-trivial 8-bit state: the parameters equal AdamWReference's on the
  // dequantized moments bit for bit (both round every operation on their own: adamw_scalars.h).
  torch::manual_seed(23);
  const int64_t n = 7 * kBlock + 5;
  auto p = torch::randn({n});
  State8 s = State8::Fresh(n);
  for (int64_t step = 1; step <= 3; ++step)
    Step8({1e-2, 0.9, 0.999, 1e-8, 0.1, step, 1.0}, p, torch::randn({n}), s, true);
  auto m = TableDequantize(s.m_codes, s.m_scales, true), v = TableDequantize(s.v_codes, s.v_scales, false);
  auto p32 = p.clone();
  const auto g = torch::randn({n});
  const AdamWArgs a{1e-2, 0.9, 0.999, 1e-8, 0.1, 4, 0.5};
  AdamWReference(a, p32.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n);
  Step8(a, p, g, s, true);
  EXPECT_TRUE(torch::equal(p, p32));
}

TEST(AdamW8bitTest, PartialBlocksTouchNothingPastTheVector) {
  torch::manual_seed(24);
  for (int64_t n : {1, 5, 255, 256, 257, 300, 512}) {
    SCOPED_TRACE("n " + std::to_string(n));
    // Buffers with guard elements past n (codes) and past the last block (scales).
    auto m_codes = torch::full({n + 8}, 0xAB, torch::kUInt8), v_codes = m_codes.clone();
    auto m_scales = torch::full({Blocks(n) + 2}, 7.0f), v_scales = m_scales.clone();
    AdamW8bitInit(Place{}, m_codes.data_ptr<uint8_t>(), m_scales.data_ptr<float>(), v_codes.data_ptr<uint8_t>(),
                  v_scales.data_ptr<float>(), n);
    EXPECT_TRUE(m_codes.narrow(0, 0, n).eq(127).all().item<bool>());
    EXPECT_TRUE(v_codes.narrow(0, 0, n).eq(0).all().item<bool>());
    EXPECT_TRUE(m_scales.narrow(0, 0, Blocks(n)).eq(0).all().item<bool>());
    auto p = torch::randn({n}), p_theirs = p.clone(), decay = DecayMask(n, true);
    State8 theirs{m_codes.narrow(0, 0, n).clone(), m_scales.narrow(0, 0, Blocks(n)).clone(),
                  v_codes.narrow(0, 0, n).clone(), v_scales.narrow(0, 0, Blocks(n)).clone()};
    for (int64_t step = 1; step <= 2; ++step) {
      const AdamWArgs a{1e-2, 0.9, 0.999, 1e-8, 0.01, step, 1.0};
      const auto g = torch::randn({n});
      AdamW8bit(Place{}, a, p.data_ptr<float>(), g.data_ptr<float>(), m_codes.data_ptr<uint8_t>(),
                m_scales.data_ptr<float>(), v_codes.data_ptr<uint8_t>(), v_scales.data_ptr<float>(), n);
      theirs = LibTorchStep8(a, p_theirs, g, theirs, decay);
    }
    EXPECT_TRUE(torch::equal(m_codes.narrow(0, 0, n), theirs.m_codes));
    EXPECT_TRUE(torch::equal(v_codes.narrow(0, 0, n), theirs.v_codes));
    EXPECT_TRUE(torch::equal(m_scales.narrow(0, 0, Blocks(n)), theirs.m_scales));
    EXPECT_TRUE(torch::equal(v_scales.narrow(0, 0, Blocks(n)), theirs.v_scales));
    EXPECT_TRUE(torch::equal(p, p_theirs));
    EXPECT_TRUE(m_codes.narrow(0, n, 8).eq(0xAB).all().item<bool>()) << "codes past n untouched";
    EXPECT_TRUE(v_codes.narrow(0, n, 8).eq(0xAB).all().item<bool>());
    EXPECT_TRUE(m_scales.narrow(0, Blocks(n), 2).eq(7.0f).all().item<bool>()) << "scales past the last block untouched";
    EXPECT_TRUE(v_scales.narrow(0, Blocks(n), 2).eq(7.0f).all().item<bool>());
  }
}

TEST(AdamW8bitTest, TracksFp32AdamWOnAQuadratic) {
  // f(p) = sum_i a_i (p_i - c_i)^2 / 2, curvatures a_i over two decades, start and target
  // N(0, 1), a noisy gradient (the same noise for both), weight decay on all: 600 steps of
  // 8-bit AdamW against fp32 AdamW (AdamWReference), lr 3e-2 then 3e-3 for the last third.
  // The bounds, with what this seed measured: every parameter within 0.6 of fp32's at every step
  // (0.42: the flat directions, where a small m and v sit many decades under their block's
  // largest and so get few codes; the path is ~1.4 long), the mean within 0.05 (0.03), both
  // losses under 1e-4 of the start's (4e-5, 5e-5), 8-bit's within 1.5x of fp32's (1.19x).
  torch::manual_seed(25);
  const int64_t n = 16 * kBlock, steps = 600;
  const auto curvature = torch::pow(10.0, torch::rand({n}) * 2 - 1), target = torch::randn({n});
  const auto start = torch::randn({n});
  auto p8 = start.clone(), p32 = start.clone(), m32 = torch::zeros({n}), v32 = torch::zeros({n});
  State8 s = State8::Fresh(n);
  auto loss = [&](const torch::Tensor& p) { return (curvature * (p - target).pow(2)).sum().item<double>() / 2; };
  double worst = 0, worst_mean = 0;  // of |p8 - p32| over the run
  for (int64_t step = 1; step <= steps; ++step) {
    const AdamWArgs a{step <= steps * 2 / 3 ? 3e-2 : 3e-3, 0.9, 0.999, 1e-8, 0.01, step, 1.0};
    const auto noise = torch::randn({n}) * 0.1;
    const auto g8 = curvature * (p8 - target) + noise, g32 = curvature * (p32 - target) + noise;
    Step8(a, p8, g8, s, true);
    AdamWReference(a, p32.data_ptr<float>(), g32.data_ptr<float>(), m32.data_ptr<float>(), v32.data_ptr<float>(), n);
    const auto diff = (p8 - p32).abs();
    worst = std::max(worst, diff.max().item<double>());
    worst_mean = std::max(worst_mean, diff.mean().item<double>());
  }
  const double start_loss = loss(start), loss8 = loss(p8), loss32 = loss(p32);
  SCOPED_TRACE("losses: start " + std::to_string(start_loss) + ", 8-bit " + std::to_string(loss8) + ", fp32 " +
               std::to_string(loss32));
  EXPECT_LT(loss32, 1e-4 * start_loss) << "the problem is solved";
  EXPECT_LT(loss8, 1e-4 * start_loss);
  EXPECT_LT(loss8, 1.5 * loss32);
  EXPECT_LE(worst, 0.6);
  EXPECT_LE(worst_mean, 0.05);
  EXPECT_GT(worst, 1e-3) << "the moments really are quantized";
}

}  // namespace
}  // namespace strata::kernels
