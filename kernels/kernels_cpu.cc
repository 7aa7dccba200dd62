#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/adamw_scalars.h"
#include "kernels/bf16.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace strata::kernels {

void AdamWReference(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                    uint16_t* param_bf16) {
  const AdamWScalars s = ScalarsOf(args);
  for (int64_t i = 0; i < n; ++i) {
    AdamWElement(s, param[i], grad[i], exp_avg[i], exp_avg_sq[i]);
    if (param_bf16) param_bf16[i] = FloatToBf16(param[i]);
  }
}

void SquareSumReference(const float* grad, int64_t n, float* out) {
  // Double accumulation: the order of a long fp32 sum would otherwise decide its last bits.
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(grad[i]);
    sum += x * x;
  }
  *out += static_cast<float>(sum);
}

int64_t SquareSumScratch() { return 1024; }

void CrossEntropyGradInPlaceReference(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                      const int64_t* targets, float grad_scale, float* row_loss) {
  std::vector<float> z(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < rows; ++i) {
    float* f32 = dtype == DType::kFloat32 ? static_cast<float*>(logits) + i * row_stride : nullptr;
    uint16_t* b16 = dtype == DType::kBFloat16 ? static_cast<uint16_t*>(logits) + i * row_stride : nullptr;
    for (int64_t v = 0; v < vocab; ++v) z[v] = f32 ? f32[v] : Bf16ToFloat(b16[v]);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < vocab; ++v) m = std::max(m, z[v]);
    double sum = 0;  // double: the order of a long fp32 sum would otherwise decide its last bits
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] - m);
    const float lse = m + static_cast<float>(std::log(sum));
    const int64_t t = targets[i];
    row_loss[i] = lse - z[t];
    for (int64_t v = 0; v < row_stride; ++v) {
      const float g = v < vocab ? grad_scale * (std::exp(z[v] - lse) - (v == t ? 1.0f : 0.0f)) : 0.0f;
      if (f32) {
        f32[v] = g;
      } else {
        b16[v] = FloatToBf16(g);
      }
    }
  }
}

#ifndef STRATA_KERNELS_WITH_CUDA
bool HasCuda() { return false; }

using internal::NoCuda;

void AdamW(const Place& place, const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
           uint16_t* param_bf16) {
  if (place.cuda) NoCuda("kernels::AdamW");
  if (param_bf16) return AdamWReference(args, param, grad, exp_avg, exp_avg_sq, n, param_bf16);
  AdamWHost(args, param, grad, exp_avg, exp_avg_sq, n);
}

void SquareSum(const Place& place, const float* grad, int64_t n, float* out, float* /*scratch*/) {
  if (place.cuda) NoCuda("kernels::SquareSum");
  SquareSumReference(grad, n, out);
}

void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                             const int64_t* targets, float grad_scale, float* row_loss) {
  if (place.cuda) NoCuda("kernels::CrossEntropyGradInPlace");
  CrossEntropyGradInPlaceReference(dtype, logits, rows, vocab, row_stride, targets, grad_scale, row_loss);
}
#endif

}  // namespace strata::kernels
