// CUDA version of kernels.h's ShardRows (the maths there). Both memory-bound.
//   gather       one block a looked-up id, its threads over the row's columns: a warp reads a
//                contiguous stretch of the row from the shard (or writes zeros outside it) and
//                writes one of the output row; 16-byte packs where the shard's start, the row
//                width and the pointers allow, elements one at a time at the shard's edges.
//   scatter-add  two passes over the sorted ids, in chunks of kShardRowsChunk positions. Pass 1:
//                one block a position that starts a part (a run's first position, or a chunk's
//                first inside a run; every other block returns at once) sums the part's rows in
//                order; a run inside one chunk is added into the shard's gradient there, a longer
//                run's parts go to scratch. Pass 2: one block a run that crosses a chunk's end
//                sums its parts in chunk order and adds them. No two blocks write one element and
//                no atomics are needed: the sums are the reference's, in its order, bit for bit,
//                and a run of thousands (a padding token) takes many blocks side by side where
//                one block summed it alone. A thread sums a 16-byte pack of columns where the
//                shapes allow, loading kRunUnroll rows before adding them (in order) so their
//                loads overlap.
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
__global__ void ShardRowsGatherKernel(ShardRowsShape s, const float* __restrict__ shard,
                                      const int64_t* __restrict__ ids, float* __restrict__ out) {
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

// Rows a thread loads before it adds them, in order: their loads are in flight together, where a
// sum that loaded one row at a time waited for each (the kernel was latency-bound at about a
// quarter of the copy peak in the dp=2 ZeRO-3 step's trace on 2x H200, 2026-11-29:
// docs/history/benchmarks-sessions.md, "ZeRO-3 at 95.8% of 2x one GPU").
constexpr int kRunUnroll = 8;

// For the columns [from, to) of the table (flat; row_begin its row's first element), `kWidth` a
// thread at a time (4: 16-byte packs, from and to multiples of 4): the sum in order from 0 of
// `count` rows, row q's values at row_at(q) + column, handed to done(at, pack).
template <int kWidth, typename RowAt, typename Done>
__device__ void SumRows(int64_t count, const RowAt& row_at, int64_t row_begin, int64_t from, int64_t to,
                        const Done& done) {
  using Pack = cuda_util::Pack<float, kWidth>;
  for (int64_t at = from + int64_t(threadIdx.x) * kWidth; at < to; at += int64_t(blockDim.x) * kWidth) {
    const int64_t j = at - row_begin;
    Pack sum;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) sum.x[e] = 0.0f;
    for (int64_t q = 0; q < count; q += kRunUnroll) {
      Pack v[kRunUnroll] = {};
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) {
        if (q + u < count) v[u] = *reinterpret_cast<const Pack*>(row_at(q + u) + j);
      }
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) {
        if (q + u < count) {
#pragma unroll
          for (int e = 0; e < kWidth; ++e) sum.x[e] += v[u].x[e];
        }
      }
    }
    done(at, j, sum);
  }
}

// SumRows over the shard's columns of `row`: packed where `kVec` (cols and shard_begin multiples
// of 4, so packs are 16-byte aligned in every buffer; only a shard's end that cuts the row may
// leave a few elements over, taken one at a time), else element by element.
template <bool kVec, typename RowAt, typename Done>
__device__ void SumRowsOverShard(const ShardRowsShape& s, int64_t row, int64_t count, const RowAt& row_at,
                                 const Done& done) {
  const int64_t row_begin = row * s.cols, row_end = row_begin + s.cols;
  const int64_t from = row_begin > s.shard_begin ? row_begin : s.shard_begin,
                to = row_end < s.shard_end ? row_end : s.shard_end;
  if constexpr (kVec) {
    const int64_t packed_to = from + (to - from) / 4 * 4;
    SumRows<4>(count, row_at, row_begin, from, packed_to, done);
    SumRows<1>(count, row_at, row_begin, packed_to, to, done);
  } else {
    SumRows<1>(count, row_at, row_begin, from, to, done);
  }
}

// SumRows's ends: a sum added into the shard's gradient, or kept in a scratch slot.
struct AddIntoGradient {
  float* grad;
  int64_t shard_begin;
  template <int kWidth>
  __device__ void operator()(int64_t at, int64_t, const cuda_util::Pack<float, kWidth>& sum) const {
    auto* out = reinterpret_cast<cuda_util::Pack<float, kWidth>*>(grad + (at - shard_begin));
    cuda_util::Pack<float, kWidth> g = *out;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) g.x[e] += sum.x[e];
    *out = g;
  }
};
struct KeepInSlot {
  float* slot;
  template <int kWidth>
  __device__ void operator()(int64_t, int64_t j, const cuda_util::Pack<float, kWidth>& sum) const {
    *reinterpret_cast<cuda_util::Pack<float, kWidth>*>(slot + j) = sum;
  }
};

__device__ bool HeldByShard(const ShardRowsShape& s, int64_t row) {
  return row >= s.shard_begin / s.cols && row < (s.shard_end + s.cols - 1) / s.cols;
}

// Pass 1: one block a sorted position k that starts a part (a run's start, or a chunk's start
// inside a run). It sums the part; a run inside its chunk is added into grad at once, a part of
// a longer run goes to its chunk's slot in scratch (0: the run reaching in from before the chunk,
// 1: the run starting in it and going on past its end).
template <bool kVec>
__global__ void ShardRowsPartsKernel(ShardRowsShape s, const float* __restrict__ dy, const int64_t* __restrict__ sorted,
                                     const int64_t* __restrict__ order, int64_t n, float* __restrict__ grad,
                                     float* __restrict__ scratch) {
  const int64_t k = blockIdx.x;
  const int64_t row = sorted[k];
  const bool run_start = k == 0 || sorted[k - 1] != row;
  if ((!run_start && k % kShardRowsChunk != 0) || !HeldByShard(s, row)) return;
  const int64_t chunk = k / kShardRowsChunk,
                chunk_end = (chunk + 1) * kShardRowsChunk < n ? (chunk + 1) * kShardRowsChunk : n;
  // The part's end: the first later position of the chunk that holds another id, or the chunk's end.
  __shared__ unsigned long long part_end;
  if (threadIdx.x == 0) part_end = static_cast<unsigned long long>(chunk_end);
  __syncthreads();
  for (int64_t p = k + 1 + threadIdx.x; p < chunk_end; p += blockDim.x) {
    if (sorted[p] != row) atomicMin(&part_end, static_cast<unsigned long long>(p));
  }
  __syncthreads();
  const int64_t end = static_cast<int64_t>(part_end);
  const bool goes_on = end == chunk_end && chunk_end < n && sorted[chunk_end] == row;
  auto row_at = [&](int64_t q) { return dy + order[k + q] * s.cols; };
  if (run_start && !goes_on) {  // the whole run: into the gradient
    SumRowsOverShard<kVec>(s, row, end - k, row_at, AddIntoGradient{grad, s.shard_begin});
  } else {
    SumRowsOverShard<kVec>(s, row, end - k, row_at, KeepInSlot{scratch + (chunk * 2 + (run_start ? 1 : 0)) * s.cols});
  }
}

// Pass 2: one block a chunk whose last position's run starts in it and goes on past its end: the
// run's parts, slot 1 of this chunk then slot 0 of each next chunk it reaches, summed in order
// and added into grad. A run of R ids has R / 32 parts, summed one after another (512 at most
// for 16,384 ids).
template <bool kVec>
__global__ void ShardRowsJoinKernel(ShardRowsShape s, const int64_t* __restrict__ sorted, int64_t n,
                                    float* __restrict__ grad, const float* __restrict__ scratch) {
  const int64_t chunk = blockIdx.x, begin = chunk * kShardRowsChunk, end = begin + kShardRowsChunk;
  if (end >= n) return;  // the last chunk: nothing goes on past it
  const int64_t row = sorted[end - 1];
  if (sorted[end] != row || (begin > 0 && sorted[begin - 1] == row) || !HeldByShard(s, row)) return;
  int64_t parts = 1;
  while ((chunk + parts) * kShardRowsChunk < n && sorted[(chunk + parts) * kShardRowsChunk] == row) ++parts;
  auto row_at = [&](int64_t q) { return scratch + ((chunk + q) * 2 + (q == 0 ? 1 : 0)) * s.cols; };
  SumRowsOverShard<kVec>(s, row, parts, row_at, AddIntoGradient{grad, s.shard_begin});
}

}  // namespace

void ShardRowsGather(const Place& place, const ShardRowsShape& s, const float* shard, const int64_t* ids, int64_t n,
                     float* out) {
  if (!place.cuda) return ShardRowsGatherReference(s, shard, ids, n, out);
  if (n <= 0 || s.cols <= 0) return;
  if (n > INT_MAX) {
    throw std::invalid_argument("kernels::ShardRowsGather: " + std::to_string(n) +
                                " ids, more than a grid's 2^31 - 1 blocks");
  }
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool vec =
      s.cols % 4 == 0 && s.shard_begin % 4 == 0 && cuda_util::Aligned16(shard) && cuda_util::Aligned16(out);
  if (vec) {
    ShardRowsGatherKernel<true><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(s, shard, ids, out);
  } else {
    ShardRowsGatherKernel<false><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(s, shard, ids, out);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void ShardRowsScatterAdd(const Place& place, const ShardRowsShape& s, const float* dy, const int64_t* sorted,
                         const int64_t* order, int64_t n, float* grad, float* scratch) {
  if (!place.cuda) return ShardRowsScatterAddReference(s, dy, sorted, order, n, grad);
  if (n <= 0 || s.cols <= 0) return;
  if (n > INT_MAX) {
    throw std::invalid_argument("kernels::ShardRowsScatterAdd: " + std::to_string(n) +
                                " ids, more than a grid's 2^31 - 1 blocks");
  }
  if (scratch == nullptr) {
    throw std::invalid_argument(
        "kernels::ShardRowsScatterAdd: no scratch on the device; pass ShardRowsScatterAddScratch(n, cols) floats");
  }
  auto stream = static_cast<cudaStream_t>(place.stream);
  const unsigned chunks = static_cast<unsigned>((n + kShardRowsChunk - 1) / kShardRowsChunk);
  const bool vec = s.cols % 4 == 0 && s.shard_begin % 4 == 0 && cuda_util::Aligned16(dy) &&
                   cuda_util::Aligned16(grad) && cuda_util::Aligned16(scratch);
  if (vec) {
    // A thread a pack of the row, in whole warps up to kThreads (GPT-2's 768 columns: 192).
    const int threads = static_cast<int>(std::min<int64_t>(kThreads, (s.cols / 4 + 31) / 32 * 32));
    ShardRowsPartsKernel<true>
        <<<static_cast<unsigned>(n), threads, 0, stream>>>(s, dy, sorted, order, n, grad, scratch);
    STRATA_CUDA_CHECK(cudaGetLastError());
    ShardRowsJoinKernel<true><<<chunks, threads, 0, stream>>>(s, sorted, n, grad, scratch);
  } else {
    ShardRowsPartsKernel<false>
        <<<static_cast<unsigned>(n), kThreads, 0, stream>>>(s, dy, sorted, order, n, grad, scratch);
    STRATA_CUDA_CHECK(cudaGetLastError());
    ShardRowsJoinKernel<false><<<chunks, kThreads, 0, stream>>>(s, sorted, n, grad, scratch);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
