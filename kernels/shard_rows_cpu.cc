// CPU reference of kernels.h's ShardRows: one element at a time, each row's gradients summed in
// the order of `order` (the stable sort of the ids), a chunk of sorted positions at a time.
#include <algorithm>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace strata::kernels {

void ShardRowsGatherReference(const ShardRowsShape& s, const float* shard, const int64_t* ids, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < s.cols; ++j) {
      const int64_t at = ids[i] * s.cols + j;
      out[i * s.cols + j] = ids[i] >= 0 && at >= s.shard_begin && at < s.shard_end ? shard[at - s.shard_begin] : 0.0f;
    }
  }
}

int64_t ShardRowsScatterAddScratch(int64_t n, int64_t cols) {
  // Two parts a chunk at most cross its edges: the run that reaches in from the chunk before,
  // and the one that starts in it and goes on past its end.
  return (n + kShardRowsChunk - 1) / kShardRowsChunk * 2 * cols;
}

void ShardRowsScatterAddReference(const ShardRowsShape& s, const float* dy, const int64_t* sorted, const int64_t* order,
                                  int64_t n, float* grad) {
  const int64_t first_row = s.shard_begin / s.cols, end_row = (s.shard_end + s.cols - 1) / s.cols;
  for (int64_t k = 0; k < n;) {
    const int64_t row = sorted[k];
    int64_t next = k;
    while (next < n && sorted[next] == row) ++next;
    if (row >= first_row && row < end_row) {
      const int64_t from = std::max(row * s.cols, s.shard_begin), to = std::min((row + 1) * s.cols, s.shard_end);
      for (int64_t at = from; at < to; ++at) {
        const int64_t j = at - row * s.cols;
        float sum = 0.0f;
        for (int64_t part = k; part < next;) {
          const int64_t part_end = std::min(next, (part / kShardRowsChunk + 1) * kShardRowsChunk);
          float part_sum = 0.0f;
          for (int64_t q = part; q < part_end; ++q) part_sum += dy[order[q] * s.cols + j];
          sum += part_sum;  // one part: 0 + part_sum, which is part_sum
          part = part_end;
        }
        grad[at - s.shard_begin] += sum;
      }
    }
    k = next;
  }
}

#ifndef STRATA_KERNELS_WITH_CUDA
void ShardRowsGather(const Place& place, const ShardRowsShape& s, const float* shard, const int64_t* ids, int64_t n,
                     float* out) {
  if (place.cuda) internal::NoCuda("kernels::ShardRowsGather");
  ShardRowsGatherReference(s, shard, ids, n, out);
}

void ShardRowsScatterAdd(const Place& place, const ShardRowsShape& s, const float* dy, const int64_t* sorted,
                         const int64_t* order, int64_t n, float* grad, float* /*scratch*/) {
  if (place.cuda) internal::NoCuda("kernels::ShardRowsScatterAdd");
  ShardRowsScatterAddReference(s, dy, sorted, order, n, grad);
}
#endif

}  // namespace strata::kernels
