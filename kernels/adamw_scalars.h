// The scalar factors of one AdamW step, rounded to fp32 once, shared by the CPU reference and
// the CUDA kernel so both compute with the same constants (kernels.h has the maths).
#pragma once

#include <cmath>

#include "kernels/kernels.h"

namespace strata::kernels {

struct AdamWScalars {
  float decay;  // -lr * weight_decay
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bc2;   // sqrt(1 - beta2^t)
  float step_size;  // -lr / (1 - beta1^t)
  float eps, grad_scale;
};

inline AdamWScalars ScalarsOf(const AdamWArgs& a) {
  const double t = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(a.beta1, t), bc2 = 1.0 - std::pow(a.beta2, t);
  return {static_cast<float>(-a.lr * a.weight_decay),
          static_cast<float>(a.beta1),
          static_cast<float>(1.0 - a.beta1),
          static_cast<float>(a.beta2),
          static_cast<float>(1.0 - a.beta2),
          static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(-a.lr / bc1),
          static_cast<float>(a.eps),
          static_cast<float>(a.grad_scale)};
}

#if defined(__CUDACC__)
#define STRATA_KERNELS_HD __host__ __device__
#else
#define STRATA_KERNELS_HD
#endif

// fp32 operations each rounded on its own. nvcc fuses a * b + c into one fused multiply-add by
// default, which rounds once where the CPU rounds twice; the device side therefore spells each
// operation as its _rn intrinsic (never fused), and the host side is compiled with
// -ffp-contract=off (kernels/CMakeLists.txt) for hosts that have an FMA. So the CUDA kernels,
// the CPU references and the vectorised host AdamW (offload) agree bit for bit.
namespace rounded {
STRATA_KERNELS_HD inline float Mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_KERNELS_HD inline float Add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_KERNELS_HD inline float Div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRATA_KERNELS_HD inline float Sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
}  // namespace rounded

// One element, exactly as every implementation computes it (weight decay is s.decay for every
// element of a call: callers split a unit into spans of decayed and undecayed parameters).
STRATA_KERNELS_HD inline void AdamWElement(const AdamWScalars& s, float& p, float grad, float& m, float& v) {
  using namespace rounded;
  const float g = Mul(grad, s.grad_scale);
  p = Mul(p, Add(s.decay, 1.0f));
  m = Add(Mul(m, s.beta1), Mul(g, s.one_minus_beta1));
  v = Add(Mul(v, s.beta2), Mul(Mul(g, g), s.one_minus_beta2));
  const float denom = Add(Div(Sqrt(v), s.sqrt_bc2), s.eps);
  p = Add(p, Mul(s.step_size, Div(m, denom)));
}

}  // namespace strata::kernels
