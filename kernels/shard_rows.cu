// CUDA version of kernels.h's ShardRows (the maths there). Both memory-bound.
//   gather       one block a looked-up id, its threads over the row's columns: a warp reads a
//                contiguous stretch of the row from the shard (or writes zeros outside it) and
//                writes one of the output row; 16-byte packs where the shard's start, the row
//                width and the pointers allow, elements one at a time at the shard's edges.
//   scatter-add  one block a position k of the sorted ids; the block at the first position of a
//                row's run sums that row's gradients (the run, in order) for its columns and adds
//                the sums into the shard's gradient; every other block returns at once. Each row
//                is one run, so no two blocks write one element and no atomics are needed: the
//                sums are the reference's, in its order, bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

template <bool kVec>
__global__ void ShardRowsGatherKernel(ShardRowsShape s, const float* __restrict__ shard, const int64_t* __restrict__ ids,
                                      float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t id = ids[i];
  const int64_t base = id * s.cols;
  float* row_out = out + i * s.cols;
  if constexpr (kVec) {
    using Pack = cuda_util::Pack<float, 4>;
    for (int64_t j = int64_t(threadIdx.x) * 4; j < s.cols; j += int64_t(kThreads) * 4) {
      const int64_t at = base + j;
      Pack p;
      if (id >= 0 && at >= s.shard_begin && at + 4 <= s.shard_end) {
        p = *reinterpret_cast<const Pack*>(shard + (at - s.shard_begin));
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int64_t e = at + q;
          p.x[q] = id >= 0 && e >= s.shard_begin && e < s.shard_end ? shard[e - s.shard_begin] : 0.0f;
        }
      }
      *reinterpret_cast<Pack*>(row_out + j) = p;
    }
  } else {
    for (int64_t j = threadIdx.x; j < s.cols; j += kThreads) {
      const int64_t at = base + j;
      row_out[j] = id >= 0 && at >= s.shard_begin && at < s.shard_end ? shard[at - s.shard_begin] : 0.0f;
    }
  }
}

__global__ void ShardRowsScatterAddKernel(ShardRowsShape s, const float* __restrict__ dy, const int64_t* __restrict__ sorted,
                                          const int64_t* __restrict__ order, int64_t n, float* __restrict__ grad) {
  const int64_t k = blockIdx.x;
  const int64_t row = sorted[k];
  if (k > 0 && sorted[k - 1] == row) return;  // not the first of its run
  const int64_t first_row = s.shard_begin / s.cols, end_row = (s.shard_end + s.cols - 1) / s.cols;
  if (row < first_row || row >= end_row) return;  // none of the row's elements is in the shard
  int64_t next = k + 1;
  while (next < n && sorted[next] == row) ++next;
  const int64_t row_begin = row * s.cols, row_end = row_begin + s.cols;
  const int64_t from = row_begin > s.shard_begin ? row_begin : s.shard_begin, to = row_end < s.shard_end ? row_end : s.shard_end;
  for (int64_t at = from + threadIdx.x; at < to; at += kThreads) {
    const int64_t j = at - row_begin;
    float sum = 0.0f;
    for (int64_t q = k; q < next; ++q) sum += dy[order[q] * s.cols + j];
    grad[at - s.shard_begin] += sum;
  }
}

}  // namespace

void ShardRowsGather(const Place& place, const ShardRowsShape& s, const float* shard, const int64_t* ids, int64_t n, float* out) {
  if (!place.cuda) return ShardRowsGatherReference(s, shard, ids, n, out);
  if (n <= 0 || s.cols <= 0) return;
  if (n > INT_MAX) {
    throw std::invalid_argument("kernels::ShardRowsGather: " + std::to_string(n) + " ids, more than a grid's 2^31 - 1 blocks");
  }
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool vec = s.cols % 4 == 0 && s.shard_begin % 4 == 0 && cuda_util::Aligned16(shard) && cuda_util::Aligned16(out);
  if (vec) {
    ShardRowsGatherKernel<true><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(s, shard, ids, out);
  } else {
    ShardRowsGatherKernel<false><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(s, shard, ids, out);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void ShardRowsScatterAdd(const Place& place, const ShardRowsShape& s, const float* dy, const int64_t* sorted, const int64_t* order,
                         int64_t n, float* grad) {
  if (!place.cuda) return ShardRowsScatterAddReference(s, dy, sorted, order, n, grad);
  if (n <= 0 || s.cols <= 0) return;
  if (n > INT_MAX) {
    throw std::invalid_argument("kernels::ShardRowsScatterAdd: " + std::to_string(n) + " ids, more than a grid's 2^31 - 1 blocks");
  }
  ShardRowsScatterAddKernel<<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(place.stream)>>>(s, dy, sorted, order, n,
                                                                                                               grad);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
