// CPU reference of kernels.h's ShardRows: one element at a time, each row's gradients summed in
// the order of `order` (the stable sort of the ids).
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

void ShardRowsScatterAddReference(const ShardRowsShape& s, const float* dy, const int64_t* sorted, const int64_t* order, int64_t n,
                                  float* grad) {
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
        for (int64_t q = k; q < next; ++q) sum += dy[order[q] * s.cols + j];
        grad[at - s.shard_begin] += sum;
      }
    }
    k = next;
  }
}

#ifndef STRATA_KERNELS_WITH_CUDA
void ShardRowsGather(const Place& place, const ShardRowsShape& s, const float* shard, const int64_t* ids, int64_t n, float* out) {
  if (place.cuda) internal::NoCuda("kernels::ShardRowsGather");
  ShardRowsGatherReference(s, shard, ids, n, out);
}

void ShardRowsScatterAdd(const Place& place, const ShardRowsShape& s, const float* dy, const int64_t* sorted, const int64_t* order,
                         int64_t n, float* grad) {
  if (place.cuda) internal::NoCuda("kernels::ShardRowsScatterAdd");
  ShardRowsScatterAddReference(s, dy, sorted, order, n, grad);
}
#endif

}  // namespace strata::kernels
