// CPU references of kernels.h's block pieces: the maths written once per element, in fp32 with
// double accumulation for the row sums, storage dtypes read and written through internal.h.
#include <cmath>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace strata::kernels {

using internal::Get;
using internal::Set;

namespace {

// Element i of a norm backward's dx: the norm's own (dx_norm), plus the residual's gradient when
// given, stored in x's dtype and, when asked, in the copy's.
void StoreDx(DType x_dtype, void* dx, const NormResidualGrad& residual, int64_t i, float dx_norm) {
  const float ds = residual.d_residual ? Get(x_dtype, residual.d_residual, i) + dx_norm : dx_norm;
  Set(x_dtype, dx, i, ds);
  if (residual.dx_copy) Set(residual.copy_dtype, residual.dx_copy, i, ds);
}

// s = x + a in fp32, stored in x's dtype: what the norm after it reads.
void AddInto(DType x_dtype, const void* x, DType addend_dtype, const void* addend, void* sum, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Set(x_dtype, sum, i, Get(x_dtype, x, i) + Get(addend_dtype, addend, i));
}

}  // namespace

void RmsNormForwardReference(DType x_dtype, const void* x, const float* weight, DType y_dtype, void* y, float* rstd,
                             int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = Get(x_dtype, x, r * cols + j);
      squares += static_cast<double>(v) * v;
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(squares / static_cast<double>(cols)) + eps);
    rstd[r] = inv;
    for (int64_t j = 0; j < cols; ++j) Set(y_dtype, y, r * cols + j, weight[j] * (Get(x_dtype, x, r * cols + j) * inv));
  }
}

void RmsNormBackwardReference(DType x_dtype, const void* x, const float* weight, const float* rstd, DType dy_dtype,
                              const void* dy, void* dx, float* dweight_partials, int64_t rows, int64_t cols,
                              const NormResidualGrad& residual) {
  std::vector<double> dw(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = rstd[r];
    double dot = 0;  // sum_k w_k dy_k x_k
    for (int64_t j = 0; j < cols; ++j) {
      const float xv = Get(x_dtype, x, r * cols + j), g = Get(dy_dtype, dy, r * cols + j);
      dot += static_cast<double>(weight[j] * g) * xv;
      dw[j] += static_cast<double>(g * (xv * inv));
    }
    const float coef = inv * inv * inv / static_cast<float>(cols) * static_cast<float>(dot);
    for (int64_t j = 0; j < cols; ++j) {
      const float xv = Get(x_dtype, x, r * cols + j), g = Get(dy_dtype, dy, r * cols + j);
      StoreDx(x_dtype, dx, residual, r * cols + j, inv * (weight[j] * g) - xv * coef);
    }
  }
  for (int64_t j = 0; j < cols; ++j) dweight_partials[j] = static_cast<float>(dw[j]);
}

void LayerNormForwardReference(DType x_dtype, const void* x, const float* weight, const float* bias, DType y_dtype,
                               void* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += Get(x_dtype, x, r * cols + j);
    const float mu = static_cast<float>(sum / static_cast<double>(cols));
    double squares = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = Get(x_dtype, x, r * cols + j) - mu;
      squares += static_cast<double>(v) * v;
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(squares / static_cast<double>(cols)) + eps);
    mean[r] = mu;
    rstd[r] = inv;
    for (int64_t j = 0; j < cols; ++j) {
      Set(y_dtype, y, r * cols + j, weight[j] * ((Get(x_dtype, x, r * cols + j) - mu) * inv) + bias[j]);
    }
  }
}

void LayerNormBackwardReference(DType x_dtype, const void* x, const float* weight, const float* mean, const float* rstd,
                                DType dy_dtype, const void* dy, void* dx, float* dweight_partials,
                                float* dbias_partials, int64_t rows, int64_t cols, const NormResidualGrad& residual) {
  std::vector<double> dw(static_cast<size_t>(cols), 0.0), db(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = rstd[r], mu = mean[r];
    double g_sum = 0, gx_sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (Get(x_dtype, x, r * cols + j) - mu) * inv, d = Get(dy_dtype, dy, r * cols + j),
                  g = weight[j] * d;
      g_sum += g;
      gx_sum += static_cast<double>(g) * xhat;
      dw[j] += static_cast<double>(d) * xhat;
      db[j] += d;
    }
    const float c1 = static_cast<float>(g_sum / static_cast<double>(cols)),
                c2 = static_cast<float>(gx_sum / static_cast<double>(cols));
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (Get(x_dtype, x, r * cols + j) - mu) * inv;
      StoreDx(x_dtype, dx, residual, r * cols + j,
              inv * (weight[j] * Get(dy_dtype, dy, r * cols + j) - c1 - xhat * c2));
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    dweight_partials[j] = static_cast<float>(dw[j]);
    dbias_partials[j] = static_cast<float>(db[j]);
  }
}

void AddRmsNormForwardReference(DType x_dtype, const void* x, DType addend_dtype, const void* addend, void* sum,
                                const float* weight, DType y_dtype, void* y, float* rstd, int64_t rows, int64_t cols,
                                float eps) {
  AddInto(x_dtype, x, addend_dtype, addend, sum, rows * cols);
  RmsNormForwardReference(x_dtype, sum, weight, y_dtype, y, rstd, rows, cols, eps);
}

void AddLayerNormForwardReference(DType x_dtype, const void* x, DType addend_dtype, const void* addend, void* sum,
                                  const float* weight, const float* bias, DType y_dtype, void* y, float* mean,
                                  float* rstd, int64_t rows, int64_t cols, float eps) {
  AddInto(x_dtype, x, addend_dtype, addend, sum, rows * cols);
  LayerNormForwardReference(x_dtype, sum, weight, bias, y_dtype, y, mean, rstd, rows, cols, eps);
}

namespace {
// As LibTorch's silu: g / (1 + exp(-g)), so fp32 results are LibTorch's bit for bit.
float Silu(float g) { return g / (1.0f + std::exp(-g)); }
float Sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
}  // namespace

void SwiGluForwardReference(DType dtype, const void* gate, const void* up, void* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = Get(dtype, gate, i);
    Set(dtype, y, i, Silu(g) * Get(dtype, up, i));
  }
}

void SwiGluBackwardReference(DType dtype, const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = Get(dtype, gate, i), u = Get(dtype, up, i), d = Get(dtype, dy, i);
    const float s = Sigmoid(g);
    Set(dtype, dgate, i, d * u * (s * (1.0f + g * (1.0f - s))));
    Set(dtype, dup, i, d * Silu(g));
  }
}

void RotaryReference(const RotaryShape& shape, DType x_dtype, const void* x, DType y_dtype, void* y, const float* cos,
                     const float* sin, bool inverse) {
  const int64_t half = shape.rotary_dims / 2, rows = shape.batch * shape.seq;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t p = row % shape.seq;
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t base = (row * shape.heads + h) * shape.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cos[p * half + i], s = inverse ? -sin[p * half + i] : sin[p * half + i];
        const float a = Get(x_dtype, x, base + i), b = Get(x_dtype, x, base + i + half);
        Set(y_dtype, y, base + i, a * c - b * s);
        Set(y_dtype, y, base + i + half, b * c + a * s);
      }
      for (int64_t i = shape.rotary_dims; i < shape.head_dim; ++i) Set(y_dtype, y, base + i, Get(x_dtype, x, base + i));
    }
  }
}

#ifndef STRATA_KERNELS_WITH_CUDA
using internal::NoCuda;

void RmsNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, DType y_dtype, void* y,
                    float* rstd, int64_t rows, int64_t cols, float eps) {
  if (place.cuda) NoCuda("kernels::RmsNormForward");
  RmsNormForwardReference(x_dtype, x, weight, y_dtype, y, rstd, rows, cols, eps);
}

int64_t NormWeightPartialRows(const Place&, int64_t) { return 1; }

void RmsNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* rstd,
                     DType dy_dtype, const void* dy, void* dx, float* dweight_partials, int64_t rows, int64_t cols,
                     const NormResidualGrad& residual) {
  if (place.cuda) NoCuda("kernels::RmsNormBackward");
  RmsNormBackwardReference(x_dtype, x, weight, rstd, dy_dtype, dy, dx, dweight_partials, rows, cols, residual);
}

void LayerNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* bias,
                      DType y_dtype, void* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (place.cuda) NoCuda("kernels::LayerNormForward");
  LayerNormForwardReference(x_dtype, x, weight, bias, y_dtype, y, mean, rstd, rows, cols, eps);
}

void LayerNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* mean,
                       const float* rstd, DType dy_dtype, const void* dy, void* dx, float* dweight_partials,
                       float* dbias_partials, int64_t rows, int64_t cols, const NormResidualGrad& residual) {
  if (place.cuda) NoCuda("kernels::LayerNormBackward");
  LayerNormBackwardReference(x_dtype, x, weight, mean, rstd, dy_dtype, dy, dx, dweight_partials, dbias_partials, rows,
                             cols, residual);
}

void AddRmsNormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend,
                       void* sum, const float* weight, DType y_dtype, void* y, float* rstd, int64_t rows, int64_t cols,
                       float eps) {
  if (place.cuda) NoCuda("kernels::AddRmsNormForward");
  AddRmsNormForwardReference(x_dtype, x, addend_dtype, addend, sum, weight, y_dtype, y, rstd, rows, cols, eps);
}

void AddLayerNormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend,
                         void* sum, const float* weight, const float* bias, DType y_dtype, void* y, float* mean,
                         float* rstd, int64_t rows, int64_t cols, float eps) {
  if (place.cuda) NoCuda("kernels::AddLayerNormForward");
  AddLayerNormForwardReference(x_dtype, x, addend_dtype, addend, sum, weight, bias, y_dtype, y, mean, rstd, rows, cols,
                               eps);
}

void SwiGluForward(const Place& place, DType dtype, const void* gate, const void* up, void* y, int64_t n) {
  if (place.cuda) NoCuda("kernels::SwiGluForward");
  SwiGluForwardReference(dtype, gate, up, y, n);
}

void SwiGluBackward(const Place& place, DType dtype, const void* gate, const void* up, const void* dy, void* dgate,
                    void* dup, int64_t n) {
  if (place.cuda) NoCuda("kernels::SwiGluBackward");
  SwiGluBackwardReference(dtype, gate, up, dy, dgate, dup, n);
}

void Rotary(const Place& place, const RotaryShape& shape, DType x_dtype, const void* x, DType y_dtype, void* y,
            const float* cos, const float* sin, bool inverse) {
  if (place.cuda) NoCuda("kernels::Rotary");
  RotaryReference(shape, x_dtype, x, y_dtype, y, cos, sin, inverse);
}
#endif

}  // namespace strata::kernels
