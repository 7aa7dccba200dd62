// CUDA versions of kernels.h's CrossEntropyGradInPlace and its vocab-parallel halves
// (CrossEntropyRowStats: pass 1 alone; CrossEntropyGradFromLse: pass 2 with a given lse): one
// block per row.
//   pass 1  each thread keeps an online (max, sum of exp) over its strided share of the row
//           (Milakov & Gimelshein's online softmax: one exp per element), merged across the
//           block with warp shuffles: lse = m + log(s);
//   pass 2  the row is read again (from L2: the blocks in flight hold a few tens of MB of rows)
//           and the gradient written over it.
// 16-byte vector loads and stores where the row stride and base allow it (8 bf16 or 4 fp32);
// element by element otherwise. Bytes moved per element: 2 reads + 1 write of the storage dtype.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

constexpr int kRowThreads = 512;

using cuda_util::Load;
using cuda_util::Store;

// Online softmax state: the running max and the sum of exp(x - max).
struct MaxSum {
  float m, s;
};

__device__ inline MaxSum Merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ inline void Add(MaxSum& st, float x) {
  if (x > st.m) {
    st.s = st.s * expf(st.m - x) + 1.0f;
    st.m = x;
  } else {
    st.s += expf(x - st.m);
  }
}

// The block's merged state, returned to every thread.
__device__ MaxSum BlockMerge(MaxSum st) {
  __shared__ MaxSum warps[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    st = Merge(st, {__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset)});
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = st;
  __syncthreads();
  MaxSum all = warps[0];
  for (int w = 1; w < kRowThreads / 32; ++w) all = Merge(all, warps[w]);
  return all;
}

// Storage of VEC elements in one transaction (cuda_util.cuh: 16 bytes when vectorized; one
// element otherwise, aligned as the element itself - a 16-byte alignment there would make the
// compiler emit wide loads on element-aligned addresses).
using cuda_util::Pack;

// What a launch does: both passes (the fused loss), pass 1 alone, or pass 2 alone.
enum class Passes { kBoth, kStats, kGrad };

template <typename T, int VEC, Passes P>
__global__ void __launch_bounds__(kRowThreads) CrossEntropyRows(T* logits, int64_t vocab, int64_t stride, const int64_t* targets,
                                                                float grad_scale, float* row_loss, float* lse_io, float* target_logit) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * stride;
  // VEC == 1: any stride; else stride % VEC == 0 and z 16-byte aligned (the caller checked).
  const int64_t packs = stride / VEC;
  const int64_t t = targets[row];
  float lse;
  if constexpr (P == Passes::kGrad) {
    lse = lse_io[row];
  } else {
    MaxSum st{-INFINITY, 0.0f};
    for (int64_t p = threadIdx.x; p < packs; p += kRowThreads) {
      const Pack<T, VEC> pack = reinterpret_cast<const Pack<T, VEC>*>(z)[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (p * VEC + j < vocab) Add(st, Load(pack.x, j));
      }
    }
    const MaxSum all = BlockMerge(st);
    lse = all.m + logf(all.s);
    if constexpr (P == Passes::kStats) {
      if (threadIdx.x == 0) {
        lse_io[row] = lse;
        target_logit[row] = t >= 0 && t < vocab ? Load(z, t) : 0.0f;
      }
      return;
    } else {
      if (threadIdx.x == 0) row_loss[row] = lse - Load(z, t);
      __syncthreads();  // the target's logit is read before any thread overwrites it
    }
  }
  for (int64_t p = threadIdx.x; p < packs; p += kRowThreads) {
    Pack<T, VEC> pack = reinterpret_cast<const Pack<T, VEC>*>(z)[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t v = p * VEC + j;
      const float g = v < vocab ? grad_scale * (expf(Load(pack.x, j) - lse) - (v == t ? 1.0f : 0.0f)) : 0.0f;
      Store(pack.x, j, g);
    }
    reinterpret_cast<Pack<T, VEC>*>(z)[p] = pack;
  }
}

template <Passes P, typename T>
void Launch(cudaStream_t stream, T* logits, int64_t rows, int64_t vocab, int64_t stride, const int64_t* targets, float scale,
            float* row_loss, float* lse, float* target_logit) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorized = stride % kVec == 0 && (reinterpret_cast<uintptr_t>(logits) & 15u) == 0;
  if (vectorized) {
    CrossEntropyRows<T, kVec, P><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, stride, targets, scale, row_loss,
                                                                                          lse, target_logit);
  } else {
    CrossEntropyRows<T, 1, P><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, stride, targets, scale, row_loss,
                                                                                       lse, target_logit);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <Passes P>
void Dispatch(const char* name, const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t stride,
              const int64_t* targets, float scale, float* row_loss, float* lse, float* target_logit) {
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw std::invalid_argument(std::string(name) + ": more than 2^31 - 1 rows; pass fewer per call");
  auto stream = static_cast<cudaStream_t>(place.stream);
  if (dtype == DType::kFloat32) {
    Launch<P>(stream, static_cast<float*>(logits), rows, vocab, stride, targets, scale, row_loss, lse, target_logit);
  } else {
    Launch<P>(stream, static_cast<__nv_bfloat16*>(logits), rows, vocab, stride, targets, scale, row_loss, lse, target_logit);
  }
}

}  // namespace

void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                             const int64_t* targets, float grad_scale, float* row_loss) {
  if (!place.cuda) {
    return CrossEntropyGradInPlaceReference(dtype, logits, rows, vocab, row_stride, targets, grad_scale, row_loss);
  }
  Dispatch<Passes::kBoth>("kernels::CrossEntropyGradInPlace", place, dtype, logits, rows, vocab, row_stride, targets, grad_scale,
                          row_loss, nullptr, nullptr);
}

void CrossEntropyRowStats(const Place& place, DType dtype, const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                          const int64_t* targets, float* lse, float* target_logit) {
  if (!place.cuda) return CrossEntropyRowStatsReference(dtype, logits, rows, vocab, row_stride, targets, lse, target_logit);
  // Pass 1 only reads the logits.
  Dispatch<Passes::kStats>("kernels::CrossEntropyRowStats", place, dtype, const_cast<void*>(logits), rows, vocab, row_stride, targets,
                           0.0f, nullptr, lse, target_logit);
}

void CrossEntropyGradFromLse(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                             const int64_t* targets, const float* lse, float grad_scale) {
  if (!place.cuda) return CrossEntropyGradFromLseReference(dtype, logits, rows, vocab, row_stride, targets, lse, grad_scale);
  // Pass 2 only reads lse.
  Dispatch<Passes::kGrad>("kernels::CrossEntropyGradFromLse", place, dtype, logits, rows, vocab, row_stride, targets, grad_scale,
                          nullptr, const_cast<float*>(lse), nullptr);
}

}  // namespace strata::kernels
