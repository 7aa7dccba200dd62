// GELU and its derivative in fp32 (kernels.h has the formulas), written once for the CPU
// reference and the CUDA kernels (host and device), with the constants and operation order of
// LibTorch's GeluKernel so that fp32 results agree to the last bits.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels::gelu_math {

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f;  // 1 / sqrt(2)
constexpr float kPdfScale = 0.3989422804014327f;  // 1 / sqrt(2 pi)

STRATA_HOST_DEVICE inline float GeluTanh(float z) {
  const float inner = kBeta * (z + kKappa * z * z * z);
  return 0.5f * z * (1.0f + tanhf(inner));
}

STRATA_HOST_DEVICE inline float GeluTanhGrad(float z) {
  const float z2 = z * z;
  const float t = tanhf(kBeta * (z + kKappa * z2 * z));
  const float left = 0.5f * z, right = 1.0f + t;
  return 0.5f * right + left * (1.0f - t * t) * (kBeta * (1.0f + 3.0f * kKappa * z2));
}

STRATA_HOST_DEVICE inline float GeluErf(float z) { return z * 0.5f * (1.0f + erff(z * kSqrtHalf)); }

STRATA_HOST_DEVICE inline float GeluErfGrad(float z) {
  const float cdf = 0.5f * (1.0f + erff(z * kSqrtHalf));
  return cdf + z * (kPdfScale * expf(-0.5f * z * z));
}

}  // namespace strata::kernels::gelu_math
