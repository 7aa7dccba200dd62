// CUDA versions of kernels.h's block pieces (RmsNorm, SwiGlu, Rotary); the maths is in kernels.h.
// All are memory-bound: each reads its inputs once and writes its outputs once (RmsNorm reads its
// row twice, the second time from L1/L2), in the storage dtypes, computing in fp32.
//   RmsNorm forward   one block per row: sum of squares, a block reduction, then the scaled row.
//   RmsNorm backward  a grid of a few blocks per SM, each looping over rows: the row's dot
//                     product (a block reduction), dx, and the block's dw partial sums kept in
//                     shared memory for the columns its threads own, written once at the end.
//   SwiGlu, Rotary    elementwise, grid-stride.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

constexpr int kNormThreads = 256;
constexpr int kElementThreads = 256;

__device__ inline float Load(const float* p, int64_t i) { return p[i]; }
__device__ inline float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void Store(float* p, int64_t i, float x) { p[i] = x; }
__device__ inline void Store(__nv_bfloat16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }

// Sum over the block, returned to every thread. `scratch`: kNormThreads / 32 floats.
__device__ float BlockSum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kNormThreads / 32; ++w) total += scratch[w];  // same order in every thread
  return total;
}

int SmCount() {
  static int sms = [] {
    int device = 0, count = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return sms;
}

int ElementBlocks(int64_t n) {
  const int64_t wanted = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(SmCount()) * 16)));
}

// ---- RmsNorm

template <typename TX, typename TY>
__global__ void __launch_bounds__(kNormThreads) RmsNormForwardKernel(const TX* x, const float* w, TY* y, float* rstd, int64_t cols,
                                                                     float eps) {
  __shared__ float scratch[kNormThreads / 32];
  const int64_t row = blockIdx.x;
  const TX* xr = x + row * cols;
  float squares = 0;
  for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) {
    const float v = Load(xr, j);
    squares += v * v;
  }
  const float inv = rsqrtf(BlockSum(squares, scratch) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) rstd[row] = inv;
  TY* yr = y + row * cols;
  for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) Store(yr, j, w[j] * (Load(xr, j) * inv));
}

template <typename TX, typename TD>
__global__ void __launch_bounds__(kNormThreads) RmsNormBackwardKernel(const TX* x, const float* w, const float* rstd, const TD* dy,
                                                                      TX* dx, float* partials, int64_t rows, int64_t cols) {
  extern __shared__ float dw[];  // [cols]: this block's partial sums; thread t owns columns t + k * kNormThreads
  __shared__ float scratch[kNormThreads / 32];
  for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) dw[j] = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const TX* xr = x + row * cols;
    const TD* dyr = dy + row * cols;
    const float inv = rstd[row];
    float dot = 0;
    for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) {
      const float xv = Load(xr, j), g = Load(dyr, j);
      dot += w[j] * g * xv;
      dw[j] += g * (xv * inv);
    }
    const float coef = inv * inv * inv / static_cast<float>(cols) * BlockSum(dot, scratch);
    TX* dxr = dx + row * cols;
    for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) Store(dxr, j, inv * (w[j] * Load(dyr, j)) - Load(xr, j) * coef);
  }
  for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) partials[int64_t(blockIdx.x) * cols + j] = dw[j];
}

// ---- SwiGlu

__device__ inline float Silu(float g) { return g / (1.0f + expf(-g)); }  // as LibTorch's silu
__device__ inline float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void SwiGluForwardKernel(const T* gate, const T* up, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = Load(gate, i);
    Store(y, i, Silu(g) * Load(up, i));
  }
}

template <typename T>
__global__ void SwiGluBackwardKernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = Load(gate, i), u = Load(up, i), d = Load(dy, i);
    const float s = Sigmoid(g);
    Store(dgate, i, d * u * (s * (1.0f + g * (1.0f - s))));
    Store(dup, i, d * Silu(g));
  }
}

// ---- Rotary: one thread per element of y.

template <typename TX, typename TY>
__global__ void RotaryKernel(RotaryShape shape, const TX* x, TY* y, const float* cos, const float* sin, float sign, int64_t n) {
  const int64_t half = shape.rotary_dims / 2;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % shape.head_dim;
    if (d >= shape.rotary_dims) {
      Store(y, e, Load(x, e));
      continue;
    }
    const int64_t p = (e / (shape.head_dim * shape.heads)) % shape.seq;
    const int64_t i = d < half ? d : d - half;
    const float c = cos[p * half + i], s = sign * sin[p * half + i];
    if (d < half) {
      Store(y, e, Load(x, e) * c - Load(x, e + half) * s);
    } else {
      Store(y, e, Load(x, e) * c + Load(x, e - half) * s);
    }
  }
}

// Calls f(ptr) with the pointer typed by its dtype.
template <typename F>
void WithType(DType dtype, const void* p, F f) {
  if (dtype == DType::kFloat32) {
    f(static_cast<const float*>(p));
  } else {
    f(static_cast<const __nv_bfloat16*>(p));
  }
}
template <typename F>
void WithType(DType dtype, void* p, F f) {
  if (dtype == DType::kFloat32) {
    f(static_cast<float*>(p));
  } else {
    f(static_cast<__nv_bfloat16*>(p));
  }
}

int64_t NormPartialRows(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>(rows, int64_t(SmCount()) * 2)); }

}  // namespace

void RmsNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, DType y_dtype, void* y, float* rstd,
                    int64_t rows, int64_t cols, float eps) {
  if (!place.cuda) return RmsNormForwardReference(x_dtype, x, weight, y_dtype, y, rstd, rows, cols, eps);
  if (rows <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  WithType(x_dtype, x, [&](auto xt) {
    WithType(y_dtype, y, [&](auto yt) {
      RmsNormForwardKernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(xt, weight, yt, rstd, cols, eps);
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

int64_t RmsNormWeightPartialRows(const Place& place, int64_t rows) { return place.cuda ? NormPartialRows(rows) : 1; }

void RmsNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* rstd, DType dy_dtype,
                     const void* dy, void* dx, float* dweight_partials, int64_t rows, int64_t cols) {
  if (!place.cuda) return RmsNormBackwardReference(x_dtype, x, weight, rstd, dy_dtype, dy, dx, dweight_partials, rows, cols);
  if (rows <= 0) return;
  const size_t shared = static_cast<size_t>(cols) * sizeof(float);
  if (shared > 200 * 1024) throw std::invalid_argument("kernels::RmsNormBackward: rows of more than 51,200 columns");
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int blocks = static_cast<int>(NormPartialRows(rows));
  WithType(x_dtype, x, [&](auto xt) {
    using TX = std::remove_const_t<std::remove_pointer_t<decltype(xt)>>;
    WithType(dy_dtype, dy, [&](auto dyt) {
      using TD = std::remove_const_t<std::remove_pointer_t<decltype(dyt)>>;
      auto kernel = RmsNormBackwardKernel<TX, TD>;
      if (shared > 48 * 1024) {
        STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
      }
      kernel<<<blocks, kNormThreads, shared, stream>>>(xt, weight, rstd, dyt, static_cast<TX*>(dx), dweight_partials, rows, cols);
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void SwiGluForward(const Place& place, DType dtype, const void* gate, const void* up, void* y, int64_t n) {
  if (!place.cuda) return SwiGluForwardReference(dtype, gate, up, y, n);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  WithType(dtype, gate, [&](auto g) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    SwiGluForwardKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(g, static_cast<const T*>(up), static_cast<T*>(y), n);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void SwiGluBackward(const Place& place, DType dtype, const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                    int64_t n) {
  if (!place.cuda) return SwiGluBackwardReference(dtype, gate, up, dy, dgate, dup, n);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  WithType(dtype, gate, [&](auto g) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    SwiGluBackwardKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(g, static_cast<const T*>(up), static_cast<const T*>(dy),
                                                                          static_cast<T*>(dgate), static_cast<T*>(dup), n);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void Rotary(const Place& place, const RotaryShape& shape, DType x_dtype, const void* x, DType y_dtype, void* y, const float* cos,
            const float* sin, bool inverse) {
  if (!place.cuda) return RotaryReference(shape, x_dtype, x, y_dtype, y, cos, sin, inverse);
  const int64_t n = shape.batch * shape.seq * shape.heads * shape.head_dim;
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  WithType(x_dtype, x, [&](auto xt) {
    WithType(y_dtype, y, [&](auto yt) {
      RotaryKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(shape, xt, yt, cos, sin, inverse ? -1.0f : 1.0f, n);
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
