// The per-element pieces of kernels.h's AdamW8bit (maths there), written once for the CPU
// reference and the CUDA kernel (host and device) so that the two agree bit for bit:
//   - the AdamW update with every operation rounded on its own. nvcc fuses a * b + c into one
//     fused multiply-add by default, which rounds once where the reference rounds twice; a last-
//     bit difference in m or v can move a block's scale and flip a code at a midpoint. The
//     device side spells each operation as its _rn intrinsic (never fused); the host side is
//     compiled with -ffp-contract=off (kernels/CMakeLists.txt), for hosts that have an FMA.
//   - the nearest code: a binary search over the sorted table C, whose 255 pivots are stored
//     level by level (the pivot of the whole table, then the two of its halves, then the four
//     of its quarters, ...): the up to 2^l pivots a warp may read at level l lie side by side,
//     in different shared-memory banks for l <= 5, where in sorted order they would all share
//     one or two banks (C[32], C[96], C[160], C[224]: bank 0) and serialize.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/adamw_scalars.h"

#ifdef __CUDACC__
#define STRATA_ADAMW8BIT_HD __host__ __device__
#else
#define STRATA_ADAMW8BIT_HD
#endif

namespace strata::kernels::adamw8bit {

constexpr int kCodes = 256;
constexpr int kLevels = 8;  // 2^8 codes: 8 halvings
// Where 0 sits in each table (the code of a fresh state).
constexpr uint8_t kSignedZeroCode = 127, kUnsignedZeroCode = 0;

STRATA_ADAMW8BIT_HD inline float Mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_ADAMW8BIT_HD inline float Add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_ADAMW8BIT_HD inline float Div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRATA_ADAMW8BIT_HD inline float Sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// One element of the step on dequantized moments: AdamWElement's expression, operation by
// operation in its order (what AdamWReference computes without an FMA).
STRATA_ADAMW8BIT_HD inline void AdamWElementRounded(const AdamWScalars& s, float& p, float grad, float& m, float& v, float decay_mask) {
  const float g = Mul(grad, s.grad_scale);
  p = Mul(p, Add(Mul(decay_mask, s.decay), 1.0f));
  m = Add(Mul(m, s.beta1), Mul(g, s.one_minus_beta1));
  v = Add(Mul(v, s.beta2), Mul(Mul(g, g), s.one_minus_beta2));
  const float denom = Add(Div(Sqrt(v), s.sqrt_bc2), s.eps);
  p = Add(p, Mul(s.step_size, Div(m, denom)));
}

// The sorted position of the level-ordered tree's entry `index` (0..254): level l holds the
// 2^l pivots (2j + 1) * 128 / 2^l, j = 0..2^l - 1, from index 2^l - 1.
STRATA_ADAMW8BIT_HD inline int TreePivot(int index) {
  int level = 0;
  while ((2 << level) <= index + 1) ++level;
  const int j = index + 1 - (1 << level);
  return (2 * j + 1) * (kCodes / 2 >> level);
}

// The index of the code nearest to x, ties to the lower index: the largest i with C[i] <= x (0
// if none) by halving, then i or i + 1, whichever C is nearer in fp32. The last pivot taken is
// C[i] and the last refused C[i + 1] (none: i = 255). A NaN x refuses every pivot: code 0.
// tree: the level-ordered pivots; first: C[0].
STRATA_ADAMW8BIT_HD inline int NearestCode(const float* tree, float first, float x) {
  int i = 0;
  float below = first, above = INFINITY;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int level = 0; level < kLevels; ++level) {
    const float pivot = tree[(1 << level) - 1 + (i >> (kLevels - level))];
    if (pivot <= x) {
      i += kCodes / 2 >> level;
      below = pivot;
    } else {
      above = pivot;
    }
  }
  return above - x < x - below ? i + 1 : i;
}

// x's code in a block of scale `absmax` (the block's largest |x|).
STRATA_ADAMW8BIT_HD inline uint8_t Quantize(const float* tree, float first, float x, float absmax) {
  const float unit = absmax > 0.0f ? Div(x, absmax) : 0.0f;
  return static_cast<uint8_t>(NearestCode(tree, first, unit));
}

}  // namespace strata::kernels::adamw8bit
