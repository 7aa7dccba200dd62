// bf16 as raw bits, for the CPU references: the conversions LibTorch's c10::BFloat16 makes (round
// to nearest even; NaN stays a quiet NaN), so a reference's bf16 output equals LibTorch's bit for
// bit where its fp32 value does.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::kernels {

inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

inline uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace strata::kernels
