// CUDA versions of kernels.h's block pieces (RmsNorm, LayerNorm and their residual-add forms,
// SwiGlu, Rotary); the maths is in kernels.h. All are memory-bound: each reads its inputs once
// and writes its outputs once (the norms read a row two or three times, after the first from
// L1), in the storage dtypes, computing in fp32.
//   norm forward   one warp per row: sums by warp shuffles, then the scaled row. With an addend
//                  (AddRmsNorm, AddLayerNorm) each pass reads x and a and forms s = x + a (the
//                  same value every time), and the last also stores s.
//   norm backward  a grid of a few blocks per SM taking rows in turn, a warp per row (<= 1024
//                  columns; each warp's dw (db) partial sums in its own slice of shared memory,
//                  added in warp order) or a block per row (wider; block reductions). The
//                  residual gradient, when given, is added to dx as it is stored.
//   SwiGlu, Rotary elementwise, grid-stride, in 16-byte (SwiGlu) or 4-element (Rotary) packs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

constexpr int kElementThreads = 256;

using cuda_util::Aligned16;
using cuda_util::Load;
using cuda_util::Pack;
using cuda_util::SmCount;
using cuda_util::Store;
// x rounded to the dtype `p` points to (as Store then Load would give it back).
__device__ inline float RoundedAs(const float*, float x) { return x; }
__device__ inline float RoundedAs(const __nv_bfloat16*, float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

constexpr int kNormThreads = 256;

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

int ElementBlocks(int64_t n) {
  const int64_t wanted = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(SmCount()) * 16)));
}

// Blocks of the backward: enough to fill every SM (8 blocks of 256 threads each) with loads in
// flight; each writes one partial row of dw.
int64_t NormPartialRows(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>(rows, int64_t(SmCount()) * 8)); }

// ---- RmsNorm and LayerNorm: one pair of kernels, kCentered for LayerNorm (mu and bias), kAdd
// for the forward of the norm of a residual add (s = x + a, the norm's input).
//   xhat = (x - mu) r;  y = w xhat (+ b)
//   dx = r (g - [mean(g)] - xhat mean(g xhat)) (+ d_residual),  g = w dy;  dw = sum dy xhat;  db = sum dy
// One warp per row: the row's reductions are warp shuffles (no block barriers), and a row
// (3-16 KB) stays in L1 between the passes over it. Rows of a model's width are short enough
// that a block per row spends more time in barriers than in loads (measured: 1.2-1.6 TB/s).

constexpr int kNormWarps = 8;  // rows per block in the forward

__device__ inline float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;  // the same in every lane: a fixed butterfly order
}

// The norm's input at column j of a row: x, or (kAdd) s = x + a as stored in x's dtype - the
// value the unfused form's norm would read back, so the two forms' y are equal.
template <bool kAdd, typename TX, typename TA>
__device__ inline float NormInput(const TX* xr, const TA* ar, int64_t j) {
  if (kAdd) return RoundedAs(xr, Load(xr, j) + Load(ar, j));
  return Load(xr, j);
}

// kAdd: a (the addend) and s (the sum, stored in x's dtype) [rows, cols]; else both null.
template <bool kCentered, bool kAdd, typename TX, typename TA, typename TY>
__global__ void __launch_bounds__(kNormWarps * 32)
    NormForwardKernel(const TX* x, const TA* a, TX* s, const float* w, const float* b, TY* y, float* mean, float* rstd,
                      int64_t rows, int64_t cols, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const TX* xr = x + row * cols;
  const TA* ar = kAdd ? a + row * cols : nullptr;
  float mu = 0;
  if (kCentered) {
    float sum = 0;
    for (int64_t j = lane; j < cols; j += 32) sum += NormInput<kAdd>(xr, ar, j);
    mu = WarpSum(sum) / static_cast<float>(cols);
  }
  float squares = 0;
  for (int64_t j = lane; j < cols; j += 32) {
    const float v = NormInput<kAdd>(xr, ar, j) - mu;
    squares += v * v;
  }
  const float inv = rsqrtf(WarpSum(squares) / static_cast<float>(cols) + eps);
  if (lane == 0) {
    rstd[row] = inv;
    if (kCentered) mean[row] = mu;
  }
  TY* yr = y + row * cols;
  TX* sr = kAdd ? s + row * cols : nullptr;
  for (int64_t j = lane; j < cols; j += 32) {
    const float in = NormInput<kAdd>(xr, ar, j);
    if (kAdd) Store(sr, j, in);
    const float v = w[j] * ((in - mu) * inv);
    Store(yr, j, kCentered ? v + b[j] : v);
  }
}

// dx_j of a norm backward stored: plus the residual gradient (dr, when not null) and again in
// the copy's dtype (dc, when not null). __fadd_rn is never contracted with the product that made
// dx_norm, so ds is the unfused form's (dx_norm rounded, then added) bit for bit in fp32.
template <typename TX, typename TC>
__device__ inline void StoreDx(TX* dxr, const TX* dr, TC* dc, int64_t j, float dx_norm) {
  const float ds = dr != nullptr ? __fadd_rn(Load(dr, j), dx_norm) : dx_norm;
  Store(dxr, j, ds);
  if (dc != nullptr) Store(dc, j, ds);
}

// Warps of a block take rows in turn; each warp sums its rows' dw (and db) into its own slice
// of shared memory, and the block adds the slices in warp order at the end: deterministic.
// d_residual (x's dtype) and dx_copy (TC) [rows, cols] or null: NormResidualGrad's.
template <bool kCentered, typename TX, typename TD, typename TC>
__global__ void NormBackwardKernel(const TX* x, const float* w, const float* mean, const float* rstd, const TD* dy,
                                   const TX* d_residual, TX* dx, TC* dx_copy, float* dw_partials, float* db_partials,
                                   int64_t rows, int64_t cols) {
  extern __shared__ float sums[];  // [warps][kCentered ? 2 : 1][cols]
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t slice = (kCentered ? 2 : 1) * cols;
  float* dw = sums + warp * slice;
  float* db = dw + cols;
  for (int64_t j = threadIdx.x; j < warps * slice; j += blockDim.x) sums[j] = 0;
  __syncthreads();
  for (int64_t row = int64_t(blockIdx.x) * warps + warp; row < rows; row += int64_t(gridDim.x) * warps) {
    const TX* xr = x + row * cols;
    const TD* dyr = dy + row * cols;
    const float inv = rstd[row], mu = kCentered ? mean[row] : 0.0f;
    float g_sum = 0, gx_sum = 0;
    for (int64_t j = lane; j < cols; j += 32) {
      const float xhat = (Load(xr, j) - mu) * inv, d = Load(dyr, j), g = w[j] * d;
      gx_sum += g * xhat;
      dw[j] += d * xhat;
      if (kCentered) {
        g_sum += g;
        db[j] += d;
      }
    }
    const float c2 = WarpSum(gx_sum) / static_cast<float>(cols);
    const float c1 = kCentered ? WarpSum(g_sum) / static_cast<float>(cols) : 0.0f;
    TX* dxr = dx + row * cols;
    const TX* drr = d_residual != nullptr ? d_residual + row * cols : nullptr;
    TC* dcr = dx_copy != nullptr ? dx_copy + row * cols : nullptr;
    for (int64_t j = lane; j < cols; j += 32) {
      const float xhat = (Load(xr, j) - mu) * inv;
      StoreDx(dxr, drr, dcr, j, inv * (w[j] * Load(dyr, j) - c1 - xhat * c2));
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float dw_total = 0, db_total = 0;
    for (int v = 0; v < warps; ++v) {
      dw_total += sums[v * slice + j];
      if (kCentered) db_total += sums[v * slice + cols + j];
    }
    dw_partials[int64_t(blockIdx.x) * cols + j] = dw_total;
    if (kCentered) db_partials[int64_t(blockIdx.x) * cols + j] = db_total;
  }
}

// Rows of more than 1024 columns: a block per row at a time (a block loops over rows), the
// block's dw (db) partial sums in shared memory for the columns its threads own. Measured on an
// H200 for Llama's 2048: faster than a warp per row, whose per-warp slices of shared memory
// (8 KB a warp) leave too few warps per SM to keep loads in flight.
template <bool kCentered, typename TX, typename TD, typename TC>
__global__ void __launch_bounds__(kNormThreads)
    NormBackwardBlockKernel(const TX* x, const float* w, const float* mean, const float* rstd, const TD* dy,
                            const TX* d_residual, TX* dx, TC* dx_copy, float* dw_partials, float* db_partials,
                            int64_t rows, int64_t cols) {
  // [cols] dw partial sums, then (LayerNorm) [cols] db: thread t owns columns t + k * kNormThreads.
  extern __shared__ float sums[];
  float* dw = sums;
  float* db = sums + cols;
  __shared__ float scratch[kNormThreads / 32];
  for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) {
    dw[j] = 0;
    if (kCentered) db[j] = 0;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const TX* xr = x + row * cols;
    const TD* dyr = dy + row * cols;
    const float inv = rstd[row], mu = kCentered ? mean[row] : 0.0f;
    float g_sum = 0, gx_sum = 0;
    for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) {
      const float xhat = (Load(xr, j) - mu) * inv, d = Load(dyr, j), g = w[j] * d;
      gx_sum += g * xhat;
      dw[j] += d * xhat;
      if (kCentered) {
        g_sum += g;
        db[j] += d;
      }
    }
    const float c2 = BlockSum(gx_sum, scratch) / static_cast<float>(cols);
    const float c1 = kCentered ? BlockSum(g_sum, scratch) / static_cast<float>(cols) : 0.0f;
    TX* dxr = dx + row * cols;
    const TX* drr = d_residual != nullptr ? d_residual + row * cols : nullptr;
    TC* dcr = dx_copy != nullptr ? dx_copy + row * cols : nullptr;
    for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) {
      const float xhat = (Load(xr, j) - mu) * inv;
      StoreDx(dxr, drr, dcr, j, inv * (w[j] * Load(dyr, j) - c1 - xhat * c2));
    }
  }
  for (int64_t j = threadIdx.x; j < cols; j += kNormThreads) {
    dw_partials[int64_t(blockIdx.x) * cols + j] = dw[j];
    if (kCentered) db_partials[int64_t(blockIdx.x) * cols + j] = db[j];
  }
}

// ---- SwiGlu

__device__ inline float Silu(float g) { return g / (1.0f + expf(-g)); }  // as LibTorch's silu
__device__ inline float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// 8 bf16 or 4 fp32 per 16-byte load where n and the pointers allow (the activations LibTorch
// allocates always do), else one element at a time. (cuda_util::Pack).

template <typename T, int VEC>
__global__ void SwiGluForwardKernel(const T* gate, const T* up, T* y, int64_t packs) {
  using P = Pack<T, VEC>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const P g = reinterpret_cast<const P*>(gate)[i], u = reinterpret_cast<const P*>(up)[i];
    P out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) Store(out.x, j, Silu(Load(g.x, j)) * Load(u.x, j));
    reinterpret_cast<P*>(y)[i] = out;
  }
}

template <typename T, int VEC>
__global__ void SwiGluBackwardKernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t packs) {
  using P = Pack<T, VEC>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const P gp = reinterpret_cast<const P*>(gate)[i], up_p = reinterpret_cast<const P*>(up)[i],
            dp = reinterpret_cast<const P*>(dy)[i];
    P dg, du;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float g = Load(gp.x, j), u = Load(up_p.x, j), d = Load(dp.x, j);
      const float s = Sigmoid(g);
      Store(dg.x, j, d * u * (s * (1.0f + g * (1.0f - s))));
      Store(du.x, j, d * Silu(g));
    }
    reinterpret_cast<P*>(dgate)[i] = dg;
    reinterpret_cast<P*>(dup)[i] = du;
  }
}

// ---- Rotary: one thread per (head row, 4 consecutive pairs i..i+3), indices in 32 bits where
// the tensor allows (64-bit division costs more than the rotation itself); the pass-through
// dimensions of a partial rotation are copied by a second kernel.

template <typename Index, int VEC, typename TX, typename TY>
__global__ void RotaryKernel(RotaryShape shape, const TX* x, TY* y, const float* cos, const float* sin, float sign,
                             Index quads) {
  using PX = Pack<TX, VEC>;
  using PY = Pack<TY, VEC>;
  const Index half = static_cast<Index>(shape.rotary_dims / 2), per_row = half / 4;
  const Index heads = static_cast<Index>(shape.heads), seq = static_cast<Index>(shape.seq),
              hd = static_cast<Index>(shape.head_dim);
  for (Index q = blockIdx.x * Index(blockDim.x) + threadIdx.x; q < quads; q += Index(gridDim.x) * blockDim.x) {
    const Index head_row = q / per_row, i0 = (q - head_row * per_row) * 4;
    const Index p = (head_row / heads) % seq;
    const Index base = head_row * hd;
    // VEC 4: the quad's first-half and second-half elements in one load each; VEC 1: four each.
    PX a[4 / VEC], b[4 / VEC];
#pragma unroll
    for (int k = 0; k < 4 / VEC; ++k) {
      a[k] = reinterpret_cast<const PX*>(x + base + i0)[k];
      b[k] = reinterpret_cast<const PX*>(x + base + i0 + half)[k];
    }
    PY ya[4 / VEC], yb[4 / VEC];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float c = cos[p * half + i0 + k], s = sign * sin[p * half + i0 + k];
      const float av = Load(a[k / VEC].x, k % VEC), bv = Load(b[k / VEC].x, k % VEC);
      Store(ya[k / VEC].x, k % VEC, av * c - bv * s);
      Store(yb[k / VEC].x, k % VEC, bv * c + av * s);
    }
#pragma unroll
    for (int k = 0; k < 4 / VEC; ++k) {
      reinterpret_cast<PY*>(y + base + i0)[k] = ya[k];
      reinterpret_cast<PY*>(y + base + i0 + half)[k] = yb[k];
    }
  }
}

template <typename TX, typename TY>
__global__ void RotaryPassThrough(RotaryShape shape, const TX* x, TY* y, int64_t n) {
  const int64_t rest = shape.head_dim - shape.rotary_dims;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t head_row = e / rest, d = shape.rotary_dims + (e - head_row * rest);
    Store(y, head_row * shape.head_dim + d, Load(x, head_row * shape.head_dim + d));
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

}  // namespace

namespace {

// `addend` null: the plain norm of x (`sum` unused); else the norm of s = x + addend, stored in `sum`.
template <bool kCentered>
void NormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend, void* sum,
                 const float* weight, const float* bias, DType y_dtype, void* y, float* mean, float* rstd, int64_t rows,
                 int64_t cols, float eps) {
  auto stream = static_cast<cudaStream_t>(place.stream);
  const auto blocks = static_cast<unsigned>((rows + kNormWarps - 1) / kNormWarps);
  WithType(x_dtype, x, [&](auto xt) {
    using TX = std::remove_const_t<std::remove_pointer_t<decltype(xt)>>;
    WithType(y_dtype, y, [&](auto yt) {
      using TY = std::remove_pointer_t<decltype(yt)>;
      if (addend == nullptr) {
        NormForwardKernel<kCentered, false, TX, TX, TY><<<blocks, kNormWarps * 32, 0, stream>>>(
            xt, nullptr, nullptr, weight, bias, yt, mean, rstd, rows, cols, eps);
      } else {
        WithType(addend_dtype, addend, [&](auto at) {
          using TA = std::remove_const_t<std::remove_pointer_t<decltype(at)>>;
          NormForwardKernel<kCentered, true, TX, TA, TY><<<blocks, kNormWarps * 32, 0, stream>>>(
              xt, at, static_cast<TX*>(sum), weight, bias, yt, mean, rstd, rows, cols, eps);
        });
      }
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <bool kCentered>
void NormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* mean,
                  const float* rstd, DType dy_dtype, const void* dy, void* dx, float* dw_partials, float* db_partials,
                  int64_t rows, int64_t cols, const NormResidualGrad& residual) {
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int blocks = static_cast<int>(NormPartialRows(rows));
  const size_t per_slice = static_cast<size_t>(cols) * sizeof(float) * (kCentered ? 2 : 1);
  if (per_slice > 200 * 1024)
    throw std::invalid_argument("kernels: a norm backward over rows of more than 25,600 columns");
  WithType(x_dtype, x, [&](auto xt) {
    using TX = std::remove_const_t<std::remove_pointer_t<decltype(xt)>>;
    WithType(dy_dtype, dy, [&](auto dyt) {
      using TD = std::remove_const_t<std::remove_pointer_t<decltype(dyt)>>;
      WithType(residual.copy_dtype, residual.dx_copy, [&](auto dct) {
        using TC = std::remove_pointer_t<decltype(dct)>;
        // Narrow rows (GPT-2's 768): a warp per row, 8 warps a block, each with its own slice.
        // Wide rows: a block per row (see NormBackwardBlockKernel).
        const bool warp_rows = cols <= 1024;
        auto kernel =
            warp_rows ? NormBackwardKernel<kCentered, TX, TD, TC> : NormBackwardBlockKernel<kCentered, TX, TD, TC>;
        const int threads = warp_rows ? 8 * 32 : kNormThreads;
        const size_t shared = warp_rows ? per_slice * 8 : per_slice;
        if (shared > 48 * 1024) {
          STRATA_CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        }
        kernel<<<blocks, threads, shared, stream>>>(xt, weight, mean, rstd, dyt,
                                                    static_cast<const TX*>(residual.d_residual), static_cast<TX*>(dx),
                                                    dct, dw_partials, db_partials, rows, cols);
      });
    });
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void RmsNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, DType y_dtype, void* y,
                    float* rstd, int64_t rows, int64_t cols, float eps) {
  if (!place.cuda) return RmsNormForwardReference(x_dtype, x, weight, y_dtype, y, rstd, rows, cols, eps);
  if (rows > 0)
    NormForward<false>(place, x_dtype, x, x_dtype, nullptr, nullptr, weight, nullptr, y_dtype, y, nullptr, rstd, rows,
                       cols, eps);
}

int64_t NormWeightPartialRows(const Place& place, int64_t rows) { return place.cuda ? NormPartialRows(rows) : 1; }

void RmsNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* rstd,
                     DType dy_dtype, const void* dy, void* dx, float* dweight_partials, int64_t rows, int64_t cols,
                     const NormResidualGrad& residual) {
  if (!place.cuda)
    return RmsNormBackwardReference(x_dtype, x, weight, rstd, dy_dtype, dy, dx, dweight_partials, rows, cols, residual);
  if (rows > 0) {
    NormBackward<false>(place, x_dtype, x, weight, nullptr, rstd, dy_dtype, dy, dx, dweight_partials, nullptr, rows,
                        cols, residual);
  }
}

void LayerNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* bias,
                      DType y_dtype, void* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (!place.cuda) return LayerNormForwardReference(x_dtype, x, weight, bias, y_dtype, y, mean, rstd, rows, cols, eps);
  if (rows > 0)
    NormForward<true>(place, x_dtype, x, x_dtype, nullptr, nullptr, weight, bias, y_dtype, y, mean, rstd, rows, cols,
                      eps);
}

void LayerNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* mean,
                       const float* rstd, DType dy_dtype, const void* dy, void* dx, float* dweight_partials,
                       float* dbias_partials, int64_t rows, int64_t cols, const NormResidualGrad& residual) {
  if (!place.cuda) {
    return LayerNormBackwardReference(x_dtype, x, weight, mean, rstd, dy_dtype, dy, dx, dweight_partials,
                                      dbias_partials, rows, cols, residual);
  }
  if (rows > 0) {
    NormBackward<true>(place, x_dtype, x, weight, mean, rstd, dy_dtype, dy, dx, dweight_partials, dbias_partials, rows,
                       cols, residual);
  }
}

void AddRmsNormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend,
                       void* sum, const float* weight, DType y_dtype, void* y, float* rstd, int64_t rows, int64_t cols,
                       float eps) {
  if (!place.cuda)
    return AddRmsNormForwardReference(x_dtype, x, addend_dtype, addend, sum, weight, y_dtype, y, rstd, rows, cols, eps);
  if (addend == nullptr || sum == nullptr)
    throw std::invalid_argument("kernels::AddRmsNormForward: null addend or sum");
  if (rows > 0)
    NormForward<false>(place, x_dtype, x, addend_dtype, addend, sum, weight, nullptr, y_dtype, y, nullptr, rstd, rows,
                       cols, eps);
}

void AddLayerNormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend,
                         void* sum, const float* weight, const float* bias, DType y_dtype, void* y, float* mean,
                         float* rstd, int64_t rows, int64_t cols, float eps) {
  if (!place.cuda) {
    return AddLayerNormForwardReference(x_dtype, x, addend_dtype, addend, sum, weight, bias, y_dtype, y, mean, rstd,
                                        rows, cols, eps);
  }
  if (addend == nullptr || sum == nullptr)
    throw std::invalid_argument("kernels::AddLayerNormForward: null addend or sum");
  if (rows > 0)
    NormForward<true>(place, x_dtype, x, addend_dtype, addend, sum, weight, bias, y_dtype, y, mean, rstd, rows, cols,
                      eps);
}

void SwiGluForward(const Place& place, DType dtype, const void* gate, const void* up, void* y, int64_t n) {
  if (!place.cuda) return SwiGluForwardReference(dtype, gate, up, y, n);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool vectorized = Aligned16(gate) && Aligned16(up) && Aligned16(y);
  WithType(dtype, gate, [&](auto g) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    constexpr int kVec = 16 / sizeof(T);
    if (vectorized && n % kVec == 0) {
      SwiGluForwardKernel<T, kVec><<<ElementBlocks(n / kVec), kElementThreads, 0, stream>>>(
          g, static_cast<const T*>(up), static_cast<T*>(y), n / kVec);
    } else {
      SwiGluForwardKernel<T, 1>
          <<<ElementBlocks(n), kElementThreads, 0, stream>>>(g, static_cast<const T*>(up), static_cast<T*>(y), n);
    }
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void SwiGluBackward(const Place& place, DType dtype, const void* gate, const void* up, const void* dy, void* dgate,
                    void* dup, int64_t n) {
  if (!place.cuda) return SwiGluBackwardReference(dtype, gate, up, dy, dgate, dup, n);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool vectorized = Aligned16(gate) && Aligned16(up) && Aligned16(dy) && Aligned16(dgate) && Aligned16(dup);
  WithType(dtype, gate, [&](auto g) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    constexpr int kVec = 16 / sizeof(T);
    auto u = static_cast<const T*>(up);
    auto d = static_cast<const T*>(dy);
    if (vectorized && n % kVec == 0) {
      SwiGluBackwardKernel<T, kVec><<<ElementBlocks(n / kVec), kElementThreads, 0, stream>>>(
          g, u, d, static_cast<T*>(dgate), static_cast<T*>(dup), n / kVec);
    } else {
      SwiGluBackwardKernel<T, 1>
          <<<ElementBlocks(n), kElementThreads, 0, stream>>>(g, u, d, static_cast<T*>(dgate), static_cast<T*>(dup), n);
    }
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void Rotary(const Place& place, const RotaryShape& shape, DType x_dtype, const void* x, DType y_dtype, void* y,
            const float* cos, const float* sin, bool inverse) {
  const int64_t n = shape.batch * shape.seq * shape.heads * shape.head_dim;
  if (!place.cuda || (shape.rotary_dims / 2) % 4 != 0) {
    // The CPU, or a rotation of an odd number of pair quads (no such model today): the reference
    // maths on the host would be wrong for device pointers, so it is an error on a GPU.
    if (place.cuda) throw std::invalid_argument("kernels::Rotary: rotary_dims must be a multiple of 8 on a GPU");
    return RotaryReference(shape, x_dtype, x, y_dtype, y, cos, sin, inverse);
  }
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int64_t head_rows = shape.batch * shape.seq * shape.heads;
  const int64_t quads = head_rows * (shape.rotary_dims / 8);
  WithType(x_dtype, x, [&](auto xt) {
    WithType(y_dtype, y, [&](auto yt) {
      const float sign = inverse ? -1.0f : 1.0f;
      // Quads start at multiples of 4 elements of rows of head_dim (a multiple of 8), so 4-wide
      // packs are aligned wherever the tensors' bases are.
      const bool packed = (reinterpret_cast<uintptr_t>(xt) % (4 * sizeof(*xt))) == 0 &&
                          (reinterpret_cast<uintptr_t>(yt) % (4 * sizeof(*yt))) == 0 && shape.head_dim % 4 == 0;
      const int blocks = ElementBlocks(quads);
      if (n < (int64_t{1} << 31)) {
        const auto q32 = static_cast<uint32_t>(quads);
        if (packed) {
          RotaryKernel<uint32_t, 4><<<blocks, kElementThreads, 0, stream>>>(shape, xt, yt, cos, sin, sign, q32);
        } else {
          RotaryKernel<uint32_t, 1><<<blocks, kElementThreads, 0, stream>>>(shape, xt, yt, cos, sin, sign, q32);
        }
      } else if (packed) {
        RotaryKernel<int64_t, 4><<<blocks, kElementThreads, 0, stream>>>(shape, xt, yt, cos, sin, sign, quads);
      } else {
        RotaryKernel<int64_t, 1><<<blocks, kElementThreads, 0, stream>>>(shape, xt, yt, cos, sin, sign, quads);
      }
      STRATA_CUDA_CHECK(cudaGetLastError());
      if (shape.rotary_dims < shape.head_dim) {
        const int64_t rest = head_rows * (shape.head_dim - shape.rotary_dims);
        RotaryPassThrough<<<ElementBlocks(rest), kElementThreads, 0, stream>>>(shape, xt, yt, rest);
        STRATA_CUDA_CHECK(cudaGetLastError());
      }
    });
  });
}

}  // namespace strata::kernels
