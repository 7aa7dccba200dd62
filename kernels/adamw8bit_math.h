// The per-element pieces of kernels.h's AdamW8bit (maths there), written once for the CPU
// reference and the CUDA kernel (host and device) so that the two agree bit for bit:
//   - the AdamW update with every operation rounded on its own (adamw_scalars.h: a last-bit
//     difference in m or v could move a block's scale and flip a code at a midpoint);
//   - the nearest code: a binary search over the sorted table C, whose 255 pivots are stored
//     level by level (the pivot of the whole table, then the two of its halves, then the four
//     of its quarters, ...: a heap): the up to 2^l pivots a warp may read at level l lie side
//     by side, in different shared-memory banks for l <= 5 (at most 2 and 4 to a bank at l = 6
//     and 7), where in sorted order they share one or two banks (C[32], C[96], C[160], C[224]:
//     all bank 0) and serialize; and the next node is 2k or 2k + 1, no bookkeeping.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/adamw_scalars.h"

#define STRATA_ADAMW8BIT_HD STRATA_KERNELS_HD

namespace strata::kernels::adamw8bit {

constexpr int kCodes = 256;
constexpr int kLevels = 8;  // 2^8 codes: 8 halvings
// Where 0 sits in each table (the code of a fresh state).
constexpr uint8_t kSignedZeroCode = 127, kUnsignedZeroCode = 0;

using rounded::Add;
using rounded::Div;
using rounded::Mul;
using rounded::Sqrt;

// The search tree: the 255 pivots of a binary search over the sorted table in heap order, so
// that node k's children are 2k and 2k + 1 - node 1 is C[128], nodes 2, 3 are C[64], C[192],
// nodes 4..7 are C[32], C[96], C[160], C[224], and so on: level l is the 2^l nodes from 2^l,
// the pivots (2j + 1) * 128 / 2^l. TreePivot(k): the sorted position of node k (1..255).
STRATA_ADAMW8BIT_HD inline int TreePivot(int k) {
  int level = 0;
  while ((2 << level) <= k) ++level;
  return (2 * (k - (1 << level)) + 1) * (kCodes / 2 >> level);
}

// The index of the code nearest to x, ties to the lower index: the largest i with C[i] <= x (0
// if none: a NaN x too) by eight halvings down the tree, then i or i + 1, whichever C is nearer
// in fp32. tree: kCodes floats, [k] = C[TreePivot(k)] ([0] unused); sorted: C and a copy of
// C[255] after it (kCodes + 1 floats), so that i + 1 needs no check (at i = 255 the two are
// equally near and i wins).
STRATA_ADAMW8BIT_HD inline int NearestCode(const float* tree, const float* sorted, float x) {
  int k = 1;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int level = 0; level < kLevels; ++level) k = 2 * k + (tree[k] <= x ? 1 : 0);
  const int i = k - kCodes;
  return sorted[i + 1] - x < x - sorted[i] ? i + 1 : i;
}

// x's code in a block of scale `absmax` (the block's largest |x|).
STRATA_ADAMW8BIT_HD inline uint8_t Quantize(const float* tree, const float* sorted, float x, float absmax) {
  const float unit = absmax > 0.0f ? Div(x, absmax) : 0.0f;
  return static_cast<uint8_t>(NearestCode(tree, sorted, unit));
}

}  // namespace strata::kernels::adamw8bit
