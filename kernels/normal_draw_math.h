// The values of a seed-drawn parameter (worker/nn/causal_lm.h ParameterDraw), as inline functions
// the host (kernels/normal_draw_cpu.cc) and the device (kernels/normal_draw.cu) both compile: a
// counter-based generator, so element i of a parameter is a function of (stream, i) alone - the
// same on any thread count, for any slice drawn alone, and on a GPU as on the CPU, bit for bit.
//
//   h_c      = SplitMix64's output c of the sequence seeded with `stream`:
//              x = stream + (c + 1) * 0x9E3779B97F4A7C15, then SplitMix64's finaliser
//   S_i      = the sum of the twelve 16-bit fields of h_{3i}, h_{3i+1}, h_{3i+2}    (an integer)
//   z_i      = (S_i - 393210) / 65536
//            = sum_{k<12} u_k - 6 with u_k = (v_k + 1/2) / 65536 uniform on (0, 1): the Irwin-Hall
//              approximation of a standard normal (mean 0, variance 1 - 2^-32, |z| < 6). Exact in
//              fp32: |S_i - 393210| < 2^24 and the scale is a power of two.
//   value_i  = mean + std * z_i   in fp32, each operation rounded on its own (no fused multiply-add).
// Integer operations throughout but the last two, so nothing differs between compilers or devices.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_DRAW_HOST_DEVICE __host__ __device__
#else
#define STRATA_DRAW_HOST_DEVICE
#endif

namespace strata::kernels::draw {

STRATA_DRAW_HOST_DEVICE inline uint64_t SplitMix64At(uint64_t stream, uint64_t counter) {
  uint64_t x = stream + (counter + 1) * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The sum of a 64-bit word's four 16-bit fields.
STRATA_DRAW_HOST_DEVICE inline int32_t FieldSum16(uint64_t h) {
  const uint64_t pairs = (h & 0x0000ffff0000ffffull) + ((h >> 16) & 0x0000ffff0000ffffull);
  return static_cast<int32_t>((pairs & 0xffffffffull) + (pairs >> 32));
}

// z_i above: a multiple of 2^-16 in (-6, 6).
STRATA_DRAW_HOST_DEVICE inline float StandardAt(uint64_t stream, uint64_t i) {
  const int32_t sum = FieldSum16(SplitMix64At(stream, 3 * i)) + FieldSum16(SplitMix64At(stream, 3 * i + 1)) +
                      FieldSum16(SplitMix64At(stream, 3 * i + 2));
  return static_cast<float>(sum - 393210) * (1.0f / 65536.0f);
}

}  // namespace strata::kernels::draw
