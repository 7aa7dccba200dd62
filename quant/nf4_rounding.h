// The two roundings of NF4 storage (nf4.cc opens with their maths), as inline functions the host
// (quant/nf4.cc) and the device (kernels/nf4.cu) both compile, so the GPU's codes are the CPU
// reference's by construction rather than by a second copy kept in step. Plain float operations
// only: no division, no multiply-add to fuse.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::quant {

inline constexpr int64_t kNf4Blocksize = 64;      // bnb's default for quantize_4bit
inline constexpr int64_t kNestedBlocksize = 256;  // bnb quantizes absmax blockwise in 256s

namespace rounding {

// bitsandbytes' dQuantizeNF4: the number of the 15 ascending midpoints `mid` below x (a value on a
// midpoint takes the lower code; every comparison is false for NaN, so NaN takes code 0).
STRATA_HOST_DEVICE inline uint8_t Nf4Code(const float* mid, float x) {
  uint8_t code = 0;
  for (int k = 0; k < 15; ++k) code += static_cast<uint8_t>(x > mid[k]);
  return code;
}

// bitsandbytes' dQuantize<0>: a 7-step binary search of the sorted 256-entry `code` from index
// 127, then the nearer neighbour by a float midpoint.
STRATA_HOST_DEVICE inline uint8_t DynamicCode(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

// A block's absmax from its 8-bit code: map[code] * nested absmax + offset, a float multiply then
// a float add (dequantize_blockwise's two tensor operations), never one fused multiply-add: the
// device rounds each with an _rn intrinsic, and the host files that include this compile with
// -ffp-contract=off (quant/ and kernels/nf4_cpu.cc, their CMakeLists.txt). kernels/nf4.cu still
// writes the same two intrinsics inline: it ran on the GPU so, and moves here once it runs again.
STRATA_HOST_DEVICE inline float DecodeScale(float mapped, float nested, float offset) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(mapped, nested), offset);
#else
  const float scaled = mapped * nested;
  return scaled + offset;
#endif
}

}  // namespace rounding
}  // namespace strata::quant
