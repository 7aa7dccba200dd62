// CPU reference of kernels.h's BiasGelu: one element at a time in fp32 (bias_gelu_math.h), the
// bias gradient summed over rows in double.
#include <cmath>
#include <vector>

#include "kernels/bias_gelu_math.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace strata::kernels {

using internal::Get;
using internal::Set;

void BiasGeluForwardReference(Gelu kind, DType dtype, const void* h, const float* bias, void* y, int64_t rows,
                              int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const float z = Get(dtype, h, r * cols + j) + bias[j];
      Set(dtype, y, r * cols + j, kind == Gelu::kTanh ? gelu_math::GeluTanh(z) : gelu_math::GeluErf(z));
    }
  }
}

void BiasGeluBackwardReference(Gelu kind, DType dtype, const void* h, const float* bias, const void* dy, void* dh,
                               float* dbias_partials, int64_t rows, int64_t cols) {
  std::vector<double> db(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const float z = Get(dtype, h, i) + bias[j];
      const float d =
          Get(dtype, dy, i) * (kind == Gelu::kTanh ? gelu_math::GeluTanhGrad(z) : gelu_math::GeluErfGrad(z));
      Set(dtype, dh, i, d);
      db[static_cast<size_t>(j)] += d;
    }
  }
  for (int64_t j = 0; j < cols; ++j) dbias_partials[j] = static_cast<float>(db[static_cast<size_t>(j)]);
}

#ifndef STRATA_KERNELS_WITH_CUDA
void BiasGeluForward(const Place& place, Gelu kind, DType dtype, const void* h, const float* bias, void* y,
                     int64_t rows, int64_t cols) {
  if (place.cuda) internal::NoCuda("kernels::BiasGeluForward");
  BiasGeluForwardReference(kind, dtype, h, bias, y, rows, cols);
}

int64_t BiasPartialRows(const Place&, int64_t) { return 1; }

void BiasGeluBackward(const Place& place, Gelu kind, DType dtype, const void* h, const float* bias, const void* dy,
                      void* dh, float* dbias_partials, int64_t rows, int64_t cols) {
  if (place.cuda) internal::NoCuda("kernels::BiasGeluBackward");
  BiasGeluBackwardReference(kind, dtype, h, bias, dy, dh, dbias_partials, rows, cols);
}
#endif

}  // namespace strata::kernels
