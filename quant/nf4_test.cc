// Tests of quant/nf4: NF4 storage as bitsandbytes writes it.
//
// Golden values here were derived, not invented: the packed bytes of the small hand-made tensors
// from the NF4 table and bnb's rounding rule (worked in the comments); the table and dynamic-map
// bit patterns from bitsandbytes itself (get_4bit_type("nf4") and create_dynamic_map() run under
// torch 2.11 on an x86 host with AVX512, the same map under AVX2). Separately (not part of this
// test), the library was checked byte for byte against bnb's CUDA quantize_4bit on an H200.
#include "quant/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace strata::quant {
namespace {

const uint32_t kBnbNf4Bits[16] = {0xbf800000u, 0xbf3239b1u, 0xbf066b30u, 0xbeca32a0u, 0xbe91a24du, 0xbe3d353fu,
                                  0xbdba7871u, 0x00000000u, 0x3da2faffu, 0x3e24cae3u, 0x3e7c04ddu, 0x3ead033au,
                                  0x3ee1a4b8u, 0x3f1007abu, 0x3f3913b3u, 0x3f800000u};

// bitsandbytes.functional.create_dynamic_map() (torch 2.11, CPU capability AVX512; AVX2 gives the
// same bits), as float32 bit patterns.
const uint32_t kBnbDynamicMapBits[256] = {
    0xbf7e3333u, 0xbf7a999au, 0xbf770000u, 0xbf736666u, 0xbf6fcccdu, 0xbf6c3333u, 0xbf68999au, 0xbf650000u, 0xbf616666u,
    0xbf5dcccdu, 0xbf5a3333u, 0xbf56999au, 0xbf530000u, 0xbf4f6666u, 0xbf4bcccdu, 0xbf483333u, 0xbf44999au, 0xbf410000u,
    0xbf3d6666u, 0xbf39cccdu, 0xbf363334u, 0xbf32999au, 0xbf2f0000u, 0xbf2b6666u, 0xbf27cccdu, 0xbf243334u, 0xbf20999au,
    0xbf1d0000u, 0xbf196666u, 0xbf15cccdu, 0xbf123334u, 0xbf0e999au, 0xbf0b0000u, 0xbf076666u, 0xbf03ccccu, 0xbf003333u,
    0xbef93332u, 0xbef20000u, 0xbeeaccccu, 0xbee3999au, 0xbedc6666u, 0xbed53333u, 0xbece0000u, 0xbec6ccccu, 0xbebf999au,
    0xbeb86666u, 0xbeb13333u, 0xbeaa0000u, 0xbea2ccccu, 0xbe9b999au, 0xbe946666u, 0xbe8d3334u, 0xbe860000u, 0xbe7d9999u,
    0xbe6f3333u, 0xbe60cccdu, 0xbe526666u, 0xbe440000u, 0xbe35999au, 0xbe273333u, 0xbe18cccdu, 0xbe0a6666u, 0xbdf80000u,
    0xbddb3334u, 0xbdc9eb85u, 0xbdc428f7u, 0xbdbe6667u, 0xbdb8a3d7u, 0xbdb2e148u, 0xbdad1eb8u, 0xbda75c2au, 0xbda1999au,
    0xbd9bd70au, 0xbd96147bu, 0xbd9051ebu, 0xbd8a8f5du, 0xbd84cccdu, 0xbd7e147bu, 0xbd728f5du, 0xbd670a3du, 0xbd5b851fu,
    0xbd500000u, 0xbd447ae1u, 0xbd38f5c3u, 0xbd2d70a3u, 0xbd21eb85u, 0xbd166667u, 0xbd0ae148u, 0xbcfeb852u, 0xbce7ae15u,
    0xbcd0a3d7u, 0xbcb9999au, 0xbca28f5du, 0xbc8b851fu, 0xbc68f5c3u, 0xbc3ae148u, 0xbc1f3b64u, 0xbc160418u, 0xbc0ccccdu,
    0xbc039581u, 0xbbf4bc6au, 0xbbe24dd3u, 0xbbcfdf3bu, 0xbbbd70a4u, 0xbbab020du, 0xbb989374u, 0xbb8624ddu, 0xbb676c8au,
    0xbb428f5cu, 0xbb1db22du, 0xbaf1a9fcu, 0xbaa7ef9du, 0xba7765ffu, 0xba59e83eu, 0xba3c6a80u, 0xba1eecc1u, 0xba016f01u,
    0xb9c7e283u, 0xb98ce705u, 0xb923d70bu, 0xb8ba1f4bu, 0xb88aefb3u, 0xb8378034u, 0xb7b24206u, 0xb70205ffu, 0xb65a1a94u,
    0xb513a3b7u, 0x00000000u, 0x3513a3b7u, 0x365a1a94u, 0x370205ffu, 0x37b24206u, 0x38378034u, 0x388aefb3u, 0x38ba1f4bu,
    0x3923d70bu, 0x398ce705u, 0x39c7e283u, 0x3a016f01u, 0x3a1eecc1u, 0x3a3c6a80u, 0x3a59e83eu, 0x3a7765ffu, 0x3aa7ef9du,
    0x3af1a9fcu, 0x3b1db22du, 0x3b428f5cu, 0x3b676c8au, 0x3b8624ddu, 0x3b989374u, 0x3bab020du, 0x3bbd70a4u, 0x3bcfdf3bu,
    0x3be24dd3u, 0x3bf4bc6au, 0x3c039581u, 0x3c0ccccdu, 0x3c160418u, 0x3c1f3b64u, 0x3c3ae148u, 0x3c68f5c3u, 0x3c8b851fu,
    0x3ca28f5du, 0x3cb9999au, 0x3cd0a3d7u, 0x3ce7ae15u, 0x3cfeb852u, 0x3d0ae148u, 0x3d166667u, 0x3d21eb85u, 0x3d2d70a3u,
    0x3d38f5c3u, 0x3d447ae1u, 0x3d500000u, 0x3d5b851fu, 0x3d670a3du, 0x3d728f5du, 0x3d7e147bu, 0x3d84cccdu, 0x3d8a8f5du,
    0x3d9051ebu, 0x3d96147bu, 0x3d9bd70au, 0x3da1999au, 0x3da75c2au, 0x3dad1eb8u, 0x3db2e148u, 0x3db8a3d7u, 0x3dbe6667u,
    0x3dc428f7u, 0x3dc9eb85u, 0x3ddb3334u, 0x3df80000u, 0x3e0a6666u, 0x3e18cccdu, 0x3e273333u, 0x3e35999au, 0x3e440000u,
    0x3e526666u, 0x3e60cccdu, 0x3e6f3333u, 0x3e7d9999u, 0x3e860000u, 0x3e8d3334u, 0x3e946666u, 0x3e9b999au, 0x3ea2ccccu,
    0x3eaa0000u, 0x3eb13333u, 0x3eb86666u, 0x3ebf999au, 0x3ec6ccccu, 0x3ece0000u, 0x3ed53333u, 0x3edc6666u, 0x3ee3999au,
    0x3eeaccccu, 0x3ef20000u, 0x3ef93332u, 0x3f003333u, 0x3f03ccccu, 0x3f076666u, 0x3f0b0000u, 0x3f0e999au, 0x3f123334u,
    0x3f15cccdu, 0x3f196666u, 0x3f1d0000u, 0x3f20999au, 0x3f243334u, 0x3f27cccdu, 0x3f2b6666u, 0x3f2f0000u, 0x3f32999au,
    0x3f363334u, 0x3f39cccdu, 0x3f3d6666u, 0x3f410000u, 0x3f44999au, 0x3f483333u, 0x3f4bcccdu, 0x3f4f6666u, 0x3f530000u,
    0x3f56999au, 0x3f5a3333u, 0x3f5dcccdu, 0x3f616666u, 0x3f650000u, 0x3f68999au, 0x3f6c3333u, 0x3f6fcccdu, 0x3f736666u,
    0x3f770000u, 0x3f7a999au, 0x3f7e3333u, 0x3f800000u};

uint8_t CodeAt(const Nf4Tensor& t, int64_t i) {
  const uint8_t b = t.codes[static_cast<size_t>(i / 2)];
  return i % 2 == 0 ? b >> 4 : b & 0x0f;
}

// The NF4 code nearest to x in exact (double) arithmetic, or -1 where bnb's float threshold and
// the exact midpoint straddle x, i.e. where rounding the midpoint to float decides (a tie in
// effect). bnb breaks exact ties toward the lower code, and so does the exact rule below.
int NearestNf4OrTie(float xf) {
  const double x = xf;
  const auto& t = Nf4Table();
  const auto& m = Nf4Thresholds();
  for (int c = 0; c < 15; ++c) {
    const double exact_mid = (static_cast<double>(t[c]) + t[c + 1]) / 2;
    const double lo = std::min<double>(exact_mid, m[c]), hi = std::max<double>(exact_mid, m[c]);
    if (x >= lo && x <= hi && lo != hi) return -1;
  }
  int best = 0;
  for (int c = 1; c < 16; ++c)
    if (std::fabs(x - t[c]) < std::fabs(x - t[best])) best = c;
  return best;
}

struct Gen {
  explicit Gen(uint64_t seed) : rng(seed) {}
  std::mt19937_64 rng;
  std::vector<float> Normal(int64_t n, float sd) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  }
  // Student-t with 3 degrees of freedom times `scale`, with every ~500th value 100x larger.
  std::vector<float> Heavy(int64_t n, float scale) {
    std::normal_distribution<double> d(0.0, 1.0);
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) {
      const double z = d(rng);
      double chi2 = 0;
      for (int k = 0; k < 3; ++k) chi2 += std::pow(d(rng), 2);
      x = static_cast<float>(scale * z / std::sqrt(chi2 / 3.0));
    }
    for (int64_t k = 0; k < std::max<int64_t>(1, n / 500); ++k) v[static_cast<size_t>(pick(rng))] *= 100.0f;
    return v;
  }
};

uint16_t ToBf16Truncate(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }
float FromBf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// ---- tables -------------------------------------------------------------------------------------

TEST(Nf4Table, BitsAreBitsandbytes) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(Nf4Table()[i]), kBnbNf4Bits[i]) << i;
}

TEST(Nf4Table, ThresholdsAreTheMidpointsRoundedToFloat) {
  // bnb's literals are the double midpoints of adjacent table values, printed to 16-17 digits and
  // compiled as float literals (nvcc rounds the decimal straight to float: checked on an H200).
  // Each is a float nearest to the exact midpoint. Four exact midpoints fall exactly between two
  // floats; there the literal's trailing digits pick the upper neighbour while float32 arithmetic
  // (bnb's CPU backend: (q_i + q_i+1) / 2) rounds to even: indices 0, 8, 12 and 14 differ by one
  // ulp. On bnb's CUDA path a value equal to one of those four floats takes the literal's rule.
  const auto& t = Nf4Table();
  std::vector<int> differ;
  for (int i = 0; i < 15; ++i) {
    const float lit = Nf4Thresholds()[i];
    const double exact = (static_cast<double>(t[i]) + t[i + 1]) / 2;
    const double ulp = std::nextafter(std::fabs(lit), 2.0f) - std::fabs(lit);
    EXPECT_LE(std::fabs(lit - exact), ulp / 2) << i;
    if (lit != (t[i] + t[i + 1]) / 2.0f) differ.push_back(i);
  }
  EXPECT_EQ(differ, (std::vector<int>{0, 8, 12, 14}));
}

TEST(DynamicMap, BitsAreBitsandbytes) {
  const std::vector<float> m = DynamicMap8bit();
  ASSERT_EQ(m.size(), 256u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(m[i]), kBnbDynamicMapBits[i]) << i;
  // Structure: ascending, one 0 and 1.0 at the top; the most negative is -(1 - 0.9/128).
  EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
  EXPECT_EQ(std::count(m.begin(), m.end(), 0.0f), 1);
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_NEAR(m[0], -(1.0 - 0.9 / 128), 1e-7);
}

// ---- rounding -----------------------------------------------------------------------------------

TEST(Nf4Rounding, NearestTableValueByBruteForce) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xs;
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng));
  for (float m : Nf4Thresholds()) {
    xs.push_back(m);
    xs.push_back(std::nextafter(m, 2.0f));
    xs.push_back(std::nextafter(m, -2.0f));
  }
  for (float v : Nf4Table()) xs.push_back(v);
  int ties = 0;
  for (float x : xs) {
    const int want = NearestNf4OrTie(x);
    if (want < 0) {
      ++ties;
      continue;
    }
    ASSERT_EQ(QuantizeNf4Value(x), want) << "x=" << x;
  }
  // On a threshold: the lower code; one float above it: the upper.
  for (int c = 0; c < 15; ++c) {
    EXPECT_EQ(QuantizeNf4Value(Nf4Thresholds()[c]), c);
    EXPECT_EQ(QuantizeNf4Value(std::nextafter(Nf4Thresholds()[c], 2.0f)), c + 1);
  }
  EXPECT_EQ(QuantizeNf4Value(std::nanf("")), 0);
  std::printf("NF4 rounding: %zu values, %d within the float rounding of a midpoint\n", xs.size(), ties);
}

TEST(DynamicRounding, NearestMapEntryByBruteForce) {
  const std::vector<float> m = DynamicMap8bit();
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xs = {-1.0f, 1.0f, 0.0f};
  for (int i = 0; i < 100000; ++i) xs.push_back(u(rng));
  for (int i = 0; i < 2000; ++i) xs.push_back(u(rng) * 1e-4f);  // the dense part near 0
  for (float v : m) xs.push_back(v);
  for (float x : xs) {
    const int got = QuantizeDynamicValue(m.data(), x);
    double best = 1e9;
    for (float v : m) best = std::min(best, std::fabs(static_cast<double>(x) - v));
    // Nearest up to the float rounding of the midpoint bnb compares against.
    const double err = std::fabs(static_cast<double>(x) - m[static_cast<size_t>(got)]);
    ASSERT_LE(err - best, 1e-7 * std::max(1e-6, std::fabs(static_cast<double>(x)))) << "x=" << x << " code=" << got;
  }
}

// ---- hand-made tensors --------------------------------------------------------------------------

TEST(Nf4Golden, PackingFirstElementHighNibble) {
  // absmax 1, so x = w. 1.0 -> 15 (above 0.8614...), -1.0 -> 0, 0.0 -> 7 (between -0.0455 and
  // 0.0398), 0.5 -> 12 (above 0.3893, not above 0.5017): bytes 0xF0, 0x7C.
  const float w[4] = {1.0f, -1.0f, 0.0f, 0.5f};
  auto t = QuantizeNf4(w, {4}, 64, /*nested=*/false);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->codes, (std::vector<uint8_t>{0xF0, 0x7C}));
  EXPECT_EQ(t->absmax, (std::vector<float>{1.0f}));

  // absmax 2, x = w * 0.5: 1.0 -> 15; -0.25 -> 4 (-0.2844 is nearer than -0.1848; above only
  // t0..t3); 0.085 -> 8 (above 0.0398, not 0.1203); -0.6 -> 2 (-0.5251 is nearer than -0.6962):
  // bytes 0xF4, 0x82.
  const float w2[4] = {2.0f, -0.5f, 0.17f, -1.2f};
  auto t2 = QuantizeNf4(w2, {2, 2}, 64, false);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->codes, (std::vector<uint8_t>{0xF4, 0x82}));
  auto d2 = DequantizeNf4(*t2);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(*d2, (std::vector<float>{2.0f, Nf4Table()[4] * 2.0f, Nf4Table()[8] * 2.0f, Nf4Table()[2] * 2.0f}));

  // Odd count: the pad after the last element is a zero, code 7: 1.0, -1.0 | 0.5, pad -> F0 C7.
  const float w3[3] = {1.0f, -1.0f, 0.5f};
  auto t3 = QuantizeNf4(w3, {3}, 64, false);
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(t3->codes, (std::vector<uint8_t>{0xF0, 0xC7}));
}

TEST(Nf4Golden, MultipliesByTheReciprocal) {
  // bnb's kernel computes w * (1.0f / absmax), not w / absmax. With absmax 1.1f these differ for
  // w = 0x1.ca7e22p-3 (0.223873392): times the reciprocal it lands on or below the 9|10 threshold
  // 0.20352125 (code 9), divided it lands above (code 10). Found by a search over such pairs.
  const float a = 1.1f, w = 0x1.ca7e22p-3f;
  ASSERT_EQ(QuantizeNf4Value(w / a), 10);  // the rule not taken
  const float v[2] = {a, w};
  auto t = QuantizeNf4(v, {2}, 64, false);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->codes, (std::vector<uint8_t>{0xF9}));
}

TEST(Nf4Golden, NestedSingleBlock) {
  // One block: offset = mean = 2.0; 2.0 - 2.0 = 0, so the nested group's absmax is 0 and its code
  // is 0; decoding gives map[0] * 0 + 2.0 = 2.0 exactly.
  const float w2[4] = {2.0f, -0.5f, 0.17f, -1.2f};
  auto t = QuantizeNf4(w2, {4}, 64, true);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->codes, (std::vector<uint8_t>{0xF4, 0x82}));
  EXPECT_EQ(t->offset, 2.0f);
  EXPECT_EQ(t->absmax_codes, (std::vector<uint8_t>{0}));
  EXPECT_EQ(t->nested_absmax, (std::vector<float>{0.0f}));
  auto a = BlockAbsmax(*t);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<float>{2.0f}));
  EXPECT_EQ(BnbQuantStateJson(*t),
            "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4], "
            "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 2.0}");
}

TEST(Nf4Golden, ZeroBlocks) {
  // Blocks: 64 zeros | 64 normals | 5 zeros (+ pad). bnb's CUDA kernel: 0 * (1/0) = NaN -> code 0,
  // the pad too. (bnb's CPU backend writes code 7 there instead; both decode to zero.)
  Gen g(3);
  std::vector<float> w(133, 0.0f);
  auto mid = g.Normal(64, 0.02f);
  std::copy(mid.begin(), mid.end(), w.begin() + 64);
  for (bool nested : {false, true}) {
    auto t = QuantizeNf4(w.data(), {133}, 64, nested);
    ASSERT_TRUE(t.ok());
    for (int i = 0; i < 32; ++i) EXPECT_EQ(t->codes[i], 0x00) << i;
    for (int i = 64; i < 67; ++i) EXPECT_EQ(t->codes[i], 0x00) << i;
    auto d = DequantizeNf4(*t);
    auto a = BlockAbsmax(*t);
    ASSERT_TRUE(d.ok() && a.ok());
    if (!nested) {
      EXPECT_EQ(t->absmax[0], 0.0f);
      EXPECT_EQ(t->absmax[2], 0.0f);
      for (int i : {0, 63, 128, 132}) EXPECT_EQ((*d)[i], 0.0f);
    } else {
      // Nested, a zero block's absmax decodes to the nested quantization's error, and its values
      // to q_0 times that: -absmax', small next to the real block's absmax.
      for (int b : {0, 2}) {
        EXPECT_LT(std::fabs((*a)[b]), 0.01f * (*a)[1]) << b;
        EXPECT_EQ((*d)[b * 64], -(*a)[b]);
      }
    }
  }
}

// ---- accuracy on realistic tensors --------------------------------------------------------------

struct Case {
  const char* name;
  std::vector<int64_t> shape;
  bool heavy;
  bool bf16;
};

void CheckAccuracy(const Case& c, bool nested) {
  int64_t n = 1;
  for (auto d : c.shape) n *= d;
  Gen g(static_cast<uint64_t>(n) * 7 + nested);
  std::vector<float> w = c.heavy ? g.Heavy(n, 0.02f) : g.Normal(n, 0.02f);
  std::vector<uint16_t> bits;
  if (c.bf16) {
    for (auto& x : w) {
      bits.push_back(ToBf16Truncate(x));
      x = FromBf16(bits.back());
    }
  }
  auto r = c.bf16 ? QuantizeNf4Bf16(bits.data(), c.shape, 64, nested) : QuantizeNf4(w.data(), c.shape, 64, nested);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Nf4Tensor& t = *r;
  EXPECT_EQ(t.dtype, c.bf16 ? SourceDtype::kBfloat16 : SourceDtype::kFloat32);
  auto deq = DequantizeNf4(t);
  auto dec = BlockAbsmax(t);
  ASSERT_TRUE(deq.ok() && dec.ok());
  const int64_t blocks = (n + 63) / 64;
  ASSERT_EQ(t.num_blocks(), blocks);

  // Each block's true absmax, independently.
  std::vector<float> am(static_cast<size_t>(blocks), 0.0f);
  for (int64_t i = 0; i < n; ++i) am[i / 64] = std::max(am[i / 64], std::fabs(w[i]));
  if (nested) {
    double s = 0;
    for (float a : am) s += a;
    EXPECT_EQ(t.offset, static_cast<float>(s / blocks));
    const std::vector<float>& m = t.nested_quant_map;
    for (int64_t b = 0; b < blocks; ++b) {
      const size_t grp = static_cast<size_t>(b / 256);
      float want2 = 0;
      for (int64_t k = grp * 256; k < std::min<int64_t>(blocks, grp * 256 + 256); ++k)
        want2 = std::max(want2, std::fabs(am[k] - t.offset));
      ASSERT_EQ(t.nested_absmax[grp], want2);
      // The nested absmax is within half a dynamic-map step of the truth (or, below the map's
      // smallest entry, its distance to it), plus float rounding.
      const double a2 = want2;
      const double y = (static_cast<double>(am[b]) - t.offset) / a2;
      double half = 0;
      if (y <= m[0]) {
        half = m[0] - y;
      } else {
        const size_t hi = static_cast<size_t>(std::upper_bound(m.begin(), m.end(), static_cast<float>(y)) - m.begin());
        half = (hi >= 256 ? 0.0 : (static_cast<double>(m[hi]) - m[hi - 1]) / 2);
      }
      const double slack = 4e-7 * (std::fabs(t.offset) + a2);
      ASSERT_LE(std::fabs(static_cast<double>((*dec)[b]) - am[b]), half * a2 + slack) << c.name << " block " << b;
    }
  } else {
    for (int64_t b = 0; b < blocks; ++b) ASSERT_EQ((*dec)[b], am[b]) << b;
  }

  double worst = 0, se = 0, ss = 0;
  int64_t ties = 0;
  const auto& tab = Nf4Table();
  for (int64_t i = 0; i < n; ++i) {
    const float a = am[i / 64];
    const uint8_t code = CodeAt(t, i);
    // (1) the code is the nearest table value to w * (1/absmax), as bnb computes it.
    const float xn = w[i] * (1.0f / a);
    const int want = NearestNf4OrTie(xn);
    if (want < 0) {
      ++ties;
    } else {
      ASSERT_EQ(code, want) << c.name << " element " << i << " xn=" << xn;
    }
    // (2) within half an NF4 step (of the two table values around w/absmax) times the absmax, plus
    // what the nested absmax's error moves the chosen level by.
    const double x = static_cast<double>(w[i]) / a;
    int lo = 0;
    while (lo < 14 && tab[lo + 1] <= x) ++lo;
    const double half = (static_cast<double>(tab[lo + 1]) - tab[lo]) / 2;
    const double bound =
        half * a + std::fabs(tab[code]) * std::fabs(static_cast<double>((*dec)[i / 64]) - a) + 1e-6 * a;
    const double err = std::fabs(static_cast<double>(w[i]) - (*deq)[i]);
    ASSERT_LE(err, bound) << c.name << " element " << i;
    worst = std::max(worst, err / bound);
    se += err * err;
    ss += static_cast<double>(w[i]) * w[i];
  }
  // The pad nibble of an odd count: code 7 (or 0 for an all-zero last block).
  if (n % 2) {
    EXPECT_EQ(t.codes.back() & 0x0f, am.back() == 0.0f ? 0 : 7);
  }
  std::printf("%-24s %-6s n=%-7lld blocks=%-5lld worst err/bound=%.3f  rms err/rms w=%.4f  midpoint ties=%lld\n",
              c.name, nested ? "nested" : "plain", static_cast<long long>(n), static_cast<long long>(blocks), worst,
              std::sqrt(se / ss), static_cast<long long>(ties));
}

TEST(Nf4Accuracy, RandomNormalAndHeavyTailed) {
  const Case cases[] = {
      {"normal f32 37x91", {37, 91}, false, false}, {"normal bf16 129x67", {129, 67}, false, true},
      {"heavy f32 7x4729", {7, 4729}, true, false}, {"heavy bf16 257x513", {257, 513}, true, true},
      {"normal f32 3 (1-d)", {3}, false, false},
  };
  for (const Case& c : cases)
    for (bool nested : {true, false}) CheckAccuracy(c, nested);
}

TEST(Nf4Accuracy, StorageCostIs4Point127Bits) {
  std::vector<float> w = Gen(5).Normal(1024 * 4096, 0.02f);
  auto t = QuantizeNf4(w.data(), {1024, 4096});
  ASSERT_TRUE(t.ok());
  const double bits = 8.0 * (t->codes.size() + t->absmax_codes.size() + 4 * t->nested_absmax.size()) / w.size();
  EXPECT_NEAR(bits, 4.0 + 8.0 / 64 + 32.0 / (64 * 256), 1e-9);
  std::printf("storage: %.4f bits a weight\n", bits);
}

// ---- streaming and input types ------------------------------------------------------------------

TEST(Nf4Builder, ChunkedEqualsWhole) {
  Gen g(6);
  std::vector<float> w = g.Heavy(7 * 4729, 0.02f);
  auto whole = QuantizeNf4(w.data(), {7, 4729});
  ASSERT_TRUE(whole.ok());
  Nf4Builder b({7, 4729}, SourceDtype::kFloat32);
  std::uniform_int_distribution<int64_t> len(1, 300);
  int64_t at = 0;
  while (at < static_cast<int64_t>(w.size())) {
    const int64_t k = std::min<int64_t>(len(g.rng), static_cast<int64_t>(w.size()) - at);
    ASSERT_TRUE(b.Append(w.data() + at, k).ok());
    at += k;
  }
  auto chunked = std::move(b).Finish();
  ASSERT_TRUE(chunked.ok());
  EXPECT_EQ(chunked->codes, whole->codes);
  EXPECT_EQ(chunked->absmax_codes, whole->absmax_codes);
  EXPECT_EQ(chunked->nested_absmax, whole->nested_absmax);
  EXPECT_EQ(chunked->offset, whole->offset);
}

TEST(Nf4Builder, Bf16AndFp16WidenExactly) {
  Gen g(7);
  std::vector<float> w = g.Normal(1001, 0.02f);
  std::vector<uint16_t> bf;
  for (auto& x : w) {
    bf.push_back(ToBf16Truncate(x));
    x = FromBf16(bf.back());
  }
  auto a = QuantizeNf4Bf16(bf.data(), {7, 143});
  auto b = QuantizeNf4(w.data(), {7, 143});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->codes, b->codes);
  EXPECT_EQ(a->absmax_codes, b->absmax_codes);
  EXPECT_NE(BnbQuantStateJson(*a).find("\"dtype\": \"bfloat16\""), std::string::npos);
  // fp16 1.0 = 0x3c00, -2.0 = 0xc000, 2^-24 (smallest subnormal) = 0x0001, 0.5 = 0x3800.
  const uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x3800};
  const float f[4] = {1.0f, -2.0f, std::ldexp(1.0f, -24), 0.5f};
  auto c = QuantizeNf4Fp16(h, {4}, 64, false);
  auto d = QuantizeNf4(f, {4}, 64, false);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_EQ(c->codes, d->codes);
  EXPECT_EQ(c->absmax, d->absmax);
  // Dequantized to bf16 with round-to-nearest-even.
  auto deq = DequantizeNf4(*a);
  auto deq16 = DequantizeNf4Bf16(*a);
  ASSERT_TRUE(deq.ok() && deq16.ok());
  for (size_t i = 0; i < deq->size(); ++i) {
    const float back = FromBf16((*deq16)[i]);
    ASSERT_LE(std::fabs(back - (*deq)[i]), std::ldexp(std::fabs((*deq)[i]), -8)) << i;
  }
}

TEST(Nf4Builder, RefusesBadInput) {
  const float w[4] = {1, 2, std::nanf(""), 4};
  auto r = QuantizeNf4(w, {4});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("element 2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(QuantizeNf4(w, {2}, 48).ok());
  EXPECT_FALSE(QuantizeNf4(w, {0, 4}).ok());
  EXPECT_FALSE(QuantizeNf4(w, {-1, 4}).ok());
  Nf4Builder b({2, 3}, SourceDtype::kFloat32);
  ASSERT_TRUE(b.Append(w, 2).ok());
  EXPECT_FALSE(b.Append(w, 5).ok());  // more than the shape holds
  auto early = std::move(b).Finish();
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.status().message().find("2 of the 6"), std::string::npos) << early.status().message();
}

// ---- bitsandbytes' state dict -------------------------------------------------------------------

const std::string kW = "model.layers.0.self_attn.q_proj.weight";

Nf4Tensor SomeTensor(bool nested) {
  std::vector<float> w = Gen(8).Heavy(7 * 4729, 0.02f);  // 518 blocks: 3 nested groups
  return QuantizeNf4(w.data(), {7, 4729}, 64, nested).value();
}

TEST(BnbStateDict, KeysDtypesShapesAreBitsandbytes) {
  const Nf4Tensor t = SomeTensor(true);
  auto es = ToBnbStateDict(t, kW);
  ASSERT_TRUE(es.ok());
  std::vector<std::string> names;
  for (const auto& e : *es) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{kW, kW + ".absmax", kW + ".quant_map", kW + ".nested_absmax",
                                             kW + ".nested_quant_map", kW + ".quant_state.bitsandbytes__nf4"}));
  const int64_t n = 7 * 4729, blocks = (n + 63) / 64;
  EXPECT_EQ((*es)[0].dtype, "U8");
  EXPECT_EQ((*es)[0].shape, (std::vector<int64_t>{(n + 1) / 2, 1}));
  EXPECT_EQ((*es)[1].dtype, "U8");
  EXPECT_EQ((*es)[1].shape, (std::vector<int64_t>{blocks}));
  EXPECT_EQ((*es)[2].dtype, "F32");
  EXPECT_EQ((*es)[2].shape, (std::vector<int64_t>{16}));
  EXPECT_EQ((*es)[3].shape, (std::vector<int64_t>{(blocks + 255) / 256}));
  EXPECT_EQ((*es)[4].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ((*es)[5].dtype, "U8");
  const std::string json((*es)[5].bytes.begin(), (*es)[5].bytes.end());
  EXPECT_EQ(json,
            "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [7, 4729], "
            "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": " +
                PythonFloatRepr(t.offset) + "}");
  for (const auto& e : *es) {
    int64_t c = 1;
    for (auto d : e.shape) c *= d;
    EXPECT_EQ(e.bytes.size(), static_cast<size_t>(c) * (e.dtype == "F32" ? 4 : 1)) << e.name;
  }

  auto plain = ToBnbStateDict(SomeTensor(false), kW);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->size(), 4u);
  EXPECT_EQ((*plain)[1].name, kW + ".absmax");
  EXPECT_EQ((*plain)[1].dtype, "F32");
  EXPECT_EQ(std::string((*plain)[3].bytes.begin(), (*plain)[3].bytes.end()),
            "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [7, 4729]}");
}

TEST(BnbStateDict, RoundTrips) {
  for (bool nested : {true, false}) {
    const Nf4Tensor t = SomeTensor(nested);
    auto es = ToBnbStateDict(t, kW);
    ASSERT_TRUE(es.ok());
    es->push_back({"model.layers.0.self_attn.q_proj.bias", "F32", {1}, {0, 0, 0, 0}});  // ignored
    auto back = FromBnbStateDict(*es, kW);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->shape, t.shape);
    EXPECT_EQ(back->blocksize, t.blocksize);
    EXPECT_EQ(back->nested, t.nested);
    EXPECT_EQ(back->codes, t.codes);
    EXPECT_EQ(back->absmax, t.absmax);
    EXPECT_EQ(back->absmax_codes, t.absmax_codes);
    EXPECT_EQ(back->nested_absmax, t.nested_absmax);
    EXPECT_EQ(back->nested_quant_map, t.nested_quant_map);
    EXPECT_EQ(std::bit_cast<uint32_t>(back->offset), std::bit_cast<uint32_t>(t.offset));
    EXPECT_EQ(DequantizeNf4(*back).value(), DequantizeNf4(t).value());
  }
}

TEST(BnbStateDict, RefusesDamageNamingTheKey) {
  const auto good = ToBnbStateDict(SomeTensor(true), kW).value();
  for (size_t k = 0; k < good.size(); ++k) {
    const std::string& key = good[k].name;
    auto trunc = good;
    trunc[k].bytes.pop_back();
    auto r = FromBnbStateDict(trunc, kW);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().message();

    auto missing = good;
    missing.erase(missing.begin() + static_cast<long>(k));
    r = FromBnbStateDict(missing, kW);
    if (key == kW + ".nested_absmax") {
      // Without nested_absmax bnb reads the state as not nested; the JSON's nested fields then
      // contradict it.
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find("nested_absmax"), std::string::npos) << r.status().message();
      continue;
    }
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().message();
  }
  // A dtype other than bnb's, a shape that does not fit, a foreign quant_map.
  auto bad = good;
  bad[1].dtype = "F32";
  auto r = FromBnbStateDict(bad, kW);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(kW + ".absmax"), std::string::npos);
  bad = good;
  bad[0].shape = {static_cast<int64_t>(bad[0].bytes.size()) - 1, 1};
  EXPECT_FALSE(FromBnbStateDict(bad, kW).ok());
  bad = good;
  bad[2].bytes[0] ^= 1;
  r = FromBnbStateDict(bad, kW);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(kW + ".quant_map"), std::string::npos);
  // JSON: a missing field, an unknown field, not JSON, FP4.
  auto with_json = [&](const std::string& j) {
    auto e = good;
    e[5].bytes.assign(j.begin(), j.end());
    e[5].shape = {static_cast<int64_t>(j.size())};
    return FromBnbStateDict(e, kW);
  };
  r = with_json(
      "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [7, 4729], "
      "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\"}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested_offset"), std::string::npos) << r.status().message();
  r = with_json("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"colour\": 1}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("colour"), std::string::npos);
  EXPECT_FALSE(with_json("{\"quant_type\": \"nf4\", ").ok());
  EXPECT_FALSE(
      with_json("{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [7, 4729]}").ok());
  auto fp4 = good;
  fp4[5].name = kW + ".quant_state.bitsandbytes__fp4";
  r = FromBnbStateDict(fp4, kW);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fp4"), std::string::npos);
}

TEST(PythonFloatRepr, MatchesPythonRepr) {
  // Python's repr(float) (json.dumps writes it): shortest digits; positional in [1e-4, 1e16).
  EXPECT_EQ(PythonFloatRepr(2.0), "2.0");
  EXPECT_EQ(PythonFloatRepr(0.0), "0.0");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(static_cast<double>(0.1f)), "0.10000000149011612");
  EXPECT_EQ(PythonFloatRepr(1.5), "1.5");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(0.00001), "1e-05");
  EXPECT_EQ(PythonFloatRepr(1.25e-7), "1.25e-07");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(2.5e20), "2.5e+20");
  EXPECT_EQ(PythonFloatRepr(123456789.0), "123456789.0");
  EXPECT_EQ(PythonFloatRepr(-12.375), "-12.375");
  EXPECT_EQ(PythonFloatRepr(std::nan("")), "NaN");
  EXPECT_EQ(PythonFloatRepr(INFINITY), "Infinity");
  EXPECT_EQ(PythonFloatRepr(-INFINITY), "-Infinity");
}

}  // namespace
}  // namespace strata::quant
