// CUDA version of kernels.h's BiasGelu (maths there and in bias_gelu_math.h). Memory-bound: the
// forward reads h and writes y once; the backward reads h and dy and writes dh once.
//   grid  x over packs of VEC columns (16 bytes where the shape and pointers allow), y over
//         groups of rows; each thread walks its group's rows for one pack, so a warp's accesses
//         are one contiguous stretch of a row, and the bias (and the backward's column sums)
//         stay in registers.
//   db    each row group writes one partial row; the caller adds the BiasPartialRows partial
//         rows in a fixed order (deterministic, unlike atomics).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/bias_gelu_math.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

using cuda_util::Load;
using cuda_util::Pack;
using cuda_util::Store;

constexpr int kThreads = 128;

template <bool kTanh>
__device__ inline float Act(float z) {
  return kTanh ? gelu_math::GeluTanh(z) : gelu_math::GeluErf(z);
}
template <bool kTanh>
__device__ inline float ActGrad(float z) {
  return kTanh ? gelu_math::GeluTanhGrad(z) : gelu_math::GeluErfGrad(z);
}

template <bool kTanh, typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    BiasGeluForwardKernel(const T* __restrict__ h, const float* __restrict__ bias, T* __restrict__ y, int64_t rows,
                          int64_t cols, int64_t rows_per_group) {
  using P = Pack<T, VEC>;
  const int64_t col = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * VEC;
  if (col >= cols) return;
  float b[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) b[j] = bias[col + j];
  const int64_t begin = blockIdx.y * rows_per_group,
                end = begin + rows_per_group < rows ? begin + rows_per_group : rows;
#pragma unroll 4
  for (int64_t r = begin; r < end; ++r) {
    const P in = *reinterpret_cast<const P*>(h + r * cols + col);
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) Store(out.x, j, Act<kTanh>(Load(in.x, j) + b[j]));
    *reinterpret_cast<P*>(y + r * cols + col) = out;
  }
}

template <bool kTanh, typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    BiasGeluBackwardKernel(const T* __restrict__ h, const float* __restrict__ bias, const T* __restrict__ dy,
                           T* __restrict__ dh, float* __restrict__ dbias_partials, int64_t rows, int64_t cols,
                           int64_t rows_per_group) {
  using P = Pack<T, VEC>;
  const int64_t col = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * VEC;
  if (col >= cols) return;
  float b[VEC], sum[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    b[j] = bias[col + j];
    sum[j] = 0.0f;
  }
  const int64_t begin = blockIdx.y * rows_per_group,
                end = begin + rows_per_group < rows ? begin + rows_per_group : rows;
#pragma unroll 4
  for (int64_t r = begin; r < end; ++r) {
    const P hp = *reinterpret_cast<const P*>(h + r * cols + col), dp = *reinterpret_cast<const P*>(dy + r * cols + col);
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = Load(dp.x, j) * ActGrad<kTanh>(Load(hp.x, j) + b[j]);
      Store(out.x, j, d);
      sum[j] += d;
    }
    *reinterpret_cast<P*>(dh + r * cols + col) = out;
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) dbias_partials[blockIdx.y * cols + col + j] = sum[j];
}

int64_t RowGroups(int64_t rows) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, int64_t(cuda_util::SmCount()) * 4));
}

// Calls f with a typed null pointer of the storage dtype, the 16-byte pack width when it
// applies (cols a multiple of it, every pointer 16-byte aligned) and the row grouping.
template <typename F>
void Dispatch(DType dtype, Gelu kind, int64_t rows, int64_t cols, bool aligned, F f) {
  auto with_type = [&](auto typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    constexpr int kVec = 16 / sizeof(T);
    const bool vectorized = aligned && cols % kVec == 0;
    const int64_t groups = RowGroups(rows), per_group = (rows + groups - 1) / groups;
    const int64_t vec = vectorized ? kVec : 1;
    const dim3 grid(static_cast<unsigned>((cols / vec + kThreads - 1) / kThreads),
                    static_cast<unsigned>((rows + per_group - 1) / per_group));
    auto with_kind = [&](auto tanh_tag) {
      constexpr bool kTanh = decltype(tanh_tag)::value;
      if (vectorized) {
        f(grid, per_group, typed, std::integral_constant<bool, kTanh>(), std::integral_constant<int, kVec>());
      } else {
        f(grid, per_group, typed, std::integral_constant<bool, kTanh>(), std::integral_constant<int, 1>());
      }
    };
    if (kind == Gelu::kTanh) {
      with_kind(std::true_type());
    } else {
      with_kind(std::false_type());
    }
  };
  if (dtype == DType::kBFloat16) {
    with_type(static_cast<__nv_bfloat16*>(nullptr));
  } else {
    with_type(static_cast<float*>(nullptr));
  }
}

}  // namespace

void BiasGeluForward(const Place& place, Gelu kind, DType dtype, const void* h, const float* bias, void* y,
                     int64_t rows, int64_t cols) {
  if (!place.cuda) return BiasGeluForwardReference(kind, dtype, h, bias, y, rows, cols);
  if (rows <= 0 || cols <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool aligned = cuda_util::Aligned16(h) && cuda_util::Aligned16(y);
  Dispatch(
      dtype, kind, rows, cols, aligned, [&](dim3 grid, int64_t per_group, auto typed, auto tanh_tag, auto vec_tag) {
        using T = std::remove_pointer_t<decltype(typed)>;
        BiasGeluForwardKernel<decltype(tanh_tag)::value, T, decltype(vec_tag)::value>
            <<<grid, kThreads, 0, stream>>>(static_cast<const T*>(h), bias, static_cast<T*>(y), rows, cols, per_group);
      });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

int64_t BiasPartialRows(const Place& place, int64_t rows) {
  if (!place.cuda) return 1;
  const int64_t groups = RowGroups(rows), per_group = (rows + groups - 1) / groups;
  return (rows + per_group - 1) / per_group;  // the grid's y extent: every partial row is written
}

void BiasGeluBackward(const Place& place, Gelu kind, DType dtype, const void* h, const float* bias, const void* dy,
                      void* dh, float* dbias_partials, int64_t rows, int64_t cols) {
  if (!place.cuda) return BiasGeluBackwardReference(kind, dtype, h, bias, dy, dh, dbias_partials, rows, cols);
  if (rows <= 0 || cols <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool aligned = cuda_util::Aligned16(h) && cuda_util::Aligned16(dy) && cuda_util::Aligned16(dh);
  Dispatch(dtype, kind, rows, cols, aligned,
           [&](dim3 grid, int64_t per_group, auto typed, auto tanh_tag, auto vec_tag) {
             using T = std::remove_pointer_t<decltype(typed)>;
             BiasGeluBackwardKernel<decltype(tanh_tag)::value, T, decltype(vec_tag)::value>
                 <<<grid, kThreads, 0, stream>>>(static_cast<const T*>(h), bias, static_cast<const T*>(dy),
                                                 static_cast<T*>(dh), dbias_partials, rows, cols, per_group);
           });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
