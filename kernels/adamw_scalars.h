// The scalar factors of one AdamW step, rounded to fp32 once, shared by the CPU reference and
// the CUDA kernel so both compute with the same constants (kernels.h has the maths).
#pragma once

#include <cmath>

#include "kernels/kernels.h"

namespace strata::kernels {

struct AdamWScalars {
  float decay;        // -lr * weight_decay
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bc2;     // sqrt(1 - beta2^t)
  float step_size;    // -lr / (1 - beta1^t)
  float eps, grad_scale;
};

inline AdamWScalars ScalarsOf(const AdamWArgs& a) {
  const double t = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(a.beta1, t), bc2 = 1.0 - std::pow(a.beta2, t);
  return {static_cast<float>(-a.lr * a.weight_decay), static_cast<float>(a.beta1), static_cast<float>(1.0 - a.beta1),
          static_cast<float>(a.beta2), static_cast<float>(1.0 - a.beta2), static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(-a.lr / bc1), static_cast<float>(a.eps), static_cast<float>(a.grad_scale)};
}

// One element, exactly as both implementations compute it.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline void AdamWElement(const AdamWScalars& s, float& p, float grad, float& m, float& v, float decay_mask) {
  const float g = grad * s.grad_scale;
  p = p * (decay_mask * s.decay + 1.0f);
  m = m * s.beta1 + g * s.one_minus_beta1;
  v = v * s.beta2 + g * g * s.one_minus_beta2;
  const float denom = sqrtf(v) / s.sqrt_bc2 + s.eps;
  p = p + s.step_size * (m / denom);
}

}  // namespace strata::kernels
