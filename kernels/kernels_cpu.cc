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

void AdamWReference(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    int64_t n, uint16_t* param_bf16) {
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

namespace {

// Row i's first `vocab` logits, widened to fp32.
void ReadLogitRow(DType dtype, const void* logits, int64_t i, int64_t vocab, int64_t row_stride,
                  std::vector<float>& z) {
  z.resize(static_cast<size_t>(vocab));
  if (dtype == DType::kFloat32) {
    const float* row = static_cast<const float*>(logits) + i * row_stride;
    std::copy(row, row + vocab, z.begin());
  } else {
    const uint16_t* row = static_cast<const uint16_t*>(logits) + i * row_stride;
    for (int64_t v = 0; v < vocab; ++v) z[v] = Bf16ToFloat(row[v]);
  }
}

float LogSumExp(const std::vector<float>& z) {
  float m = -std::numeric_limits<float>::infinity();
  for (float x : z) m = std::max(m, x);
  double sum = 0;  // double: the order of a long fp32 sum would otherwise decide its last bits
  for (float x : z) sum += std::exp(x - m);
  return m + static_cast<float>(std::log(sum));
}

// grad_scale * (softmax - one-hot at t) over the row's vocabulary, 0 over its padding.
void WriteGradRow(DType dtype, void* logits, int64_t i, int64_t row_stride, const std::vector<float>& z, float lse,
                  int64_t t, float grad_scale) {
  const auto vocab = static_cast<int64_t>(z.size());
  float* f32 = dtype == DType::kFloat32 ? static_cast<float*>(logits) + i * row_stride : nullptr;
  uint16_t* b16 = dtype == DType::kBFloat16 ? static_cast<uint16_t*>(logits) + i * row_stride : nullptr;
  for (int64_t v = 0; v < row_stride; ++v) {
    const float g = v < vocab ? grad_scale * (std::exp(z[v] - lse) - (v == t ? 1.0f : 0.0f)) : 0.0f;
    if (f32) {
      f32[v] = g;
    } else {
      b16[v] = FloatToBf16(g);
    }
  }
}

}  // namespace

void CrossEntropyGradInPlaceReference(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                      const int64_t* targets, float grad_scale, float* row_loss) {
  std::vector<float> z;
  for (int64_t i = 0; i < rows; ++i) {
    ReadLogitRow(dtype, logits, i, vocab, row_stride, z);
    const float lse = LogSumExp(z);
    const int64_t t = targets[i];
    row_loss[i] = lse - z[t];
    WriteGradRow(dtype, logits, i, row_stride, z, lse, t, grad_scale);
  }
}

void CrossEntropyRowStatsReference(DType dtype, const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                   const int64_t* targets, float* lse, float* target_logit) {
  std::vector<float> z;
  for (int64_t i = 0; i < rows; ++i) {
    ReadLogitRow(dtype, logits, i, vocab, row_stride, z);
    lse[i] = LogSumExp(z);
    const int64_t t = targets[i];
    target_logit[i] = t >= 0 && t < vocab ? z[t] : 0.0f;
  }
}

void CrossEntropyGradFromLseReference(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                      const int64_t* targets, const float* lse, float grad_scale) {
  std::vector<float> z;
  for (int64_t i = 0; i < rows; ++i) {
    ReadLogitRow(dtype, logits, i, vocab, row_stride, z);
    WriteGradRow(dtype, logits, i, row_stride, z, lse[i], targets[i], grad_scale);
  }
}

#ifndef STRATA_KERNELS_WITH_CUDA
bool HasCuda() { return false; }

using internal::NoCuda;

void AdamW(const Place& place, const AdamWArgs& args, float* param, const float* grad, float* exp_avg,
           float* exp_avg_sq, int64_t n, uint16_t* param_bf16) {
  if (place.cuda) NoCuda("kernels::AdamW");
  if (param_bf16) return AdamWReference(args, param, grad, exp_avg, exp_avg_sq, n, param_bf16);
  AdamWHost(args, param, grad, exp_avg, exp_avg_sq, n);
}

void SquareSum(const Place& place, const float* grad, int64_t n, float* out, float* /*scratch*/) {
  if (place.cuda) NoCuda("kernels::SquareSum");
  SquareSumReference(grad, n, out);
}

void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
                             int64_t row_stride, const int64_t* targets, float grad_scale, float* row_loss) {
  if (place.cuda) NoCuda("kernels::CrossEntropyGradInPlace");
  CrossEntropyGradInPlaceReference(dtype, logits, rows, vocab, row_stride, targets, grad_scale, row_loss);
}

void CrossEntropyRowStats(const Place& place, DType dtype, const void* logits, int64_t rows, int64_t vocab,
                          int64_t row_stride, const int64_t* targets, float* lse, float* target_logit) {
  if (place.cuda) NoCuda("kernels::CrossEntropyRowStats");
  CrossEntropyRowStatsReference(dtype, logits, rows, vocab, row_stride, targets, lse, target_logit);
}

void CrossEntropyGradFromLse(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
                             int64_t row_stride, const int64_t* targets, const float* lse, float grad_scale) {
  if (place.cuda) NoCuda("kernels::CrossEntropyGradFromLse");
  CrossEntropyGradFromLseReference(dtype, logits, rows, vocab, row_stride, targets, lse, grad_scale);
}
#endif

}  // namespace strata::kernels
