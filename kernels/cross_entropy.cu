// CUDA versions of kernels.h's CrossEntropyGradInPlace and its vocab-parallel halves
// (CrossEntropyRowStats: pass 1 alone; CrossEntropyGradFromLse: pass 2 with a given lse): one
// block per row.
//   pass 1  each thread keeps an online (max, sum of exp) over its strided share of the row
//           (Milakov & Gimelshein's online softmax), a 16-byte pack at a time: the pack's max,
//           then its exps against it (one rescale per pack, not per element), merged across the
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

// Of 512, 256 and 128 threads a row, the fused loss is fastest at 256 (kernels_bench, one H200, 2026-11-29:
// docs/history/benchmarks-sessions.md, "The loss kernel").
constexpr int kRowThreads = 256;

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

// One pack of VEC elements (those at or past `vocab` count as -inf) into the state: the pack's max
// first, then its VEC exps against the new max, independent of one another (the old serial form,
// an exp and a branch per element each waiting on the last, ran pass 1 at a quarter of HBM speed).
template <typename T, int VEC>
__device__ inline void AddPack(MaxSum& st, const T* x, int64_t first, int64_t vocab) {
  float v[VEC];
  float m = st.m;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    v[j] = first + j < vocab ? cuda_util::Load(x, j) : -INFINITY;
    m = fmaxf(m, v[j]);
  }
  // All -inf so far: exps against 0, so a NaN among them still reaches s (fmaxf passed over it)
  // and an empty state stays (-inf, 0).
  const float base = m == -INFINITY ? 0.0f : m;
  float s = st.s * expf(st.m - base);
#pragma unroll
  for (int j = 0; j < VEC; ++j) s += expf(v[j] - base);
  st = {m, s};
}

// The block's merged state, returned to every thread: each warp merges by shuffles, then the
// first warp merges the warps' states the same way.
__device__ MaxSum BlockMerge(MaxSum st) {
  constexpr int kWarps = kRowThreads / 32;
  static_assert(kWarps <= 32 && (kWarps & (kWarps - 1)) == 0, "the first warp merges the warps' states by shuffles");
  __shared__ MaxSum warps[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) {
    st = Merge(st, {__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset)});
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = lane < kWarps ? warps[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = kWarps / 2; offset > 0; offset /= 2) {
      st = Merge(st, {__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset)});
    }
    if (lane == 0) warps[0] = st;
  }
  __syncthreads();
  return warps[0];
}

// Storage of VEC elements in one transaction (cuda_util.cuh: 16 bytes when vectorized; one
// element otherwise, aligned as the element itself - a 16-byte alignment there would make the
// compiler emit wide loads on element-aligned addresses).
using cuda_util::Pack;

// What a launch does: both passes (the fused loss), pass 1 alone, or pass 2 alone.
enum class Passes { kBoth, kStats, kGrad };

template <typename T, int VEC, Passes P>
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyRows(T* logits, int64_t vocab, int64_t stride, const int64_t* targets, float grad_scale,
                     float* row_loss, float* lse_io, float* target_logit) {
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
    const auto* packed = reinterpret_cast<const Pack<T, VEC>*>(z);
    int64_t p = threadIdx.x;
    for (; p + kRowThreads < packs; p += 2 * kRowThreads) {  // two loads in flight per thread
      const Pack<T, VEC> a = packed[p], b = packed[p + kRowThreads];
      AddPack<T, VEC>(st, a.x, p * VEC, vocab);
      AddPack<T, VEC>(st, b.x, (p + kRowThreads) * VEC, vocab);
    }
    if (p < packs) AddPack<T, VEC>(st, packed[p].x, p * VEC, vocab);
    const MaxSum all = BlockMerge(st);
    lse = all.m + logf(all.s);
    if constexpr (P == Passes::kStats) {
      if (threadIdx.x == 0) {
        lse_io[row] = lse;
        target_logit[row] = t >= 0 && t < vocab ? Load(z, t) : 0.0f;
      }
    } else {
      if (threadIdx.x == 0) row_loss[row] = lse - Load(z, t);
      __syncthreads();  // the target's logit is read before any thread overwrites it
    }
  }
  if constexpr (P != Passes::kStats) {
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
}

template <Passes P, typename T>
void Launch(cudaStream_t stream, T* logits, int64_t rows, int64_t vocab, int64_t stride, const int64_t* targets,
            float scale, float* row_loss, float* lse, float* target_logit) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorized = stride % kVec == 0 && (reinterpret_cast<uintptr_t>(logits) & 15u) == 0;
  if (vectorized) {
    CrossEntropyRows<T, kVec, P><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        logits, vocab, stride, targets, scale, row_loss, lse, target_logit);
  } else {
    CrossEntropyRows<T, 1, P><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        logits, vocab, stride, targets, scale, row_loss, lse, target_logit);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

template <Passes P>
void Dispatch(const char* name, const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
              int64_t stride, const int64_t* targets, float scale, float* row_loss, float* lse, float* target_logit) {
  if (rows <= 0) return;
  if (rows > 0x7fffffff)
    throw std::invalid_argument(std::string(name) + ": more than 2^31 - 1 rows; pass fewer per call");
  auto stream = static_cast<cudaStream_t>(place.stream);
  if (dtype == DType::kFloat32) {
    Launch<P>(stream, static_cast<float*>(logits), rows, vocab, stride, targets, scale, row_loss, lse, target_logit);
  } else {
    Launch<P>(stream, static_cast<__nv_bfloat16*>(logits), rows, vocab, stride, targets, scale, row_loss, lse,
              target_logit);
  }
}

}  // namespace

void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
                             int64_t row_stride, const int64_t* targets, float grad_scale, float* row_loss) {
  if (!place.cuda) {
    return CrossEntropyGradInPlaceReference(dtype, logits, rows, vocab, row_stride, targets, grad_scale, row_loss);
  }
  Dispatch<Passes::kBoth>("kernels::CrossEntropyGradInPlace", place, dtype, logits, rows, vocab, row_stride, targets,
                          grad_scale, row_loss, nullptr, nullptr);
}

void CrossEntropyRowStats(const Place& place, DType dtype, const void* logits, int64_t rows, int64_t vocab,
                          int64_t row_stride, const int64_t* targets, float* lse, float* target_logit) {
  if (!place.cuda)
    return CrossEntropyRowStatsReference(dtype, logits, rows, vocab, row_stride, targets, lse, target_logit);
  // Pass 1 only reads the logits.
  Dispatch<Passes::kStats>("kernels::CrossEntropyRowStats", place, dtype, const_cast<void*>(logits), rows, vocab,
                           row_stride, targets, 0.0f, nullptr, lse, target_logit);
}

void CrossEntropyGradFromLse(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
                             int64_t row_stride, const int64_t* targets, const float* lse, float grad_scale) {
  if (!place.cuda)
    return CrossEntropyGradFromLseReference(dtype, logits, rows, vocab, row_stride, targets, lse, grad_scale);
  // Pass 2 only reads lse.
  Dispatch<Passes::kGrad>("kernels::CrossEntropyGradFromLse", place, dtype, logits, rows, vocab, row_stride, targets,
                          grad_scale, nullptr, const_cast<float*>(lse), nullptr);
}

}  // namespace strata::kernels
