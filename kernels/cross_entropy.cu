// CUDA version of kernels.h's CrossEntropyGradInPlace: one block per row.
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

template <typename T, int VEC>
__global__ void __launch_bounds__(kRowThreads) CrossEntropyRows(T* logits, int64_t vocab, int64_t stride, const int64_t* targets,
                                                                float grad_scale, float* row_loss) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * stride;
  // VEC == 1: any stride; else stride % VEC == 0 and z 16-byte aligned (the caller checked).
  const int64_t packs = stride / VEC;
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t p = threadIdx.x; p < packs; p += kRowThreads) {
    const Pack<T, VEC> pack = reinterpret_cast<const Pack<T, VEC>*>(z)[p];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (p * VEC + j < vocab) Add(st, Load(pack.x, j));
    }
  }
  const MaxSum all = BlockMerge(st);
  const float lse = all.m + logf(all.s);
  const int64_t t = targets[row];
  if (threadIdx.x == 0) row_loss[row] = lse - Load(z, t);
  __syncthreads();  // the target's logit is read before any thread overwrites it
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

template <typename T>
void Launch(cudaStream_t stream, T* logits, int64_t rows, int64_t vocab, int64_t stride, const int64_t* targets, float scale,
            float* row_loss) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorized = stride % kVec == 0 && (reinterpret_cast<uintptr_t>(logits) & 15u) == 0;
  if (vectorized) {
    CrossEntropyRows<T, kVec><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, stride, targets, scale, row_loss);
  } else {
    CrossEntropyRows<T, 1><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, stride, targets, scale, row_loss);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                             const int64_t* targets, float grad_scale, float* row_loss) {
  if (!place.cuda) {
    return CrossEntropyGradInPlaceReference(dtype, logits, rows, vocab, row_stride, targets, grad_scale, row_loss);
  }
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw std::invalid_argument("kernels::CrossEntropyGradInPlace: more than 2^31 - 1 rows; pass fewer per call");
  auto stream = static_cast<cudaStream_t>(place.stream);
  if (dtype == DType::kFloat32) {
    Launch(stream, static_cast<float*>(logits), rows, vocab, row_stride, targets, grad_scale, row_loss);
  } else {
    Launch(stream, static_cast<__nv_bfloat16*>(logits), rows, vocab, row_stride, targets, grad_scale, row_loss);
  }
}

}  // namespace strata::kernels
