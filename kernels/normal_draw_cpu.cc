// CPU version of kernels.h's DrawNormal (the maths in normal_draw_math.h), split over threads, and
// the dispatch of a build without CUDA kernels. Compiled without contraction (CMakeLists.txt), so
// mean + std * z rounds twice, as the CUDA kernel's _rn intrinsics do.
#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"
#include "kernels/normal_draw_math.h"

namespace strata::kernels {
namespace {

void DrawSpan(uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    out[j] = mean + std * draw::StandardAt(stream, static_cast<uint64_t>(first + j));
  }
}

}  // namespace

void DrawNormalHost(uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n, int threads) {
  // ~1M values are a thread's few milliseconds: below that a thread's start costs more.
  constexpr int64_t kMinPerThread = 1 << 20;
  const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(threads, n / kMinPerThread));
  if (wanted <= 1) return DrawSpan(stream, first, mean, std, out, n);
  const int64_t chunk = (n + wanted - 1) / wanted;
  std::vector<std::thread> pool;
  for (int64_t begin = chunk; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    pool.emplace_back([=] { DrawSpan(stream, first + begin, mean, std, out + begin, len); });
  }
  DrawSpan(stream, first, mean, std, out, std::min(chunk, n));
  for (auto& t : pool) t.join();
}

#ifndef STRATA_KERNELS_WITH_CUDA
void DrawNormal(const Place& place, uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n,
                int threads) {
  if (place.cuda) internal::NoCuda("kernels::DrawNormal");
  DrawNormalHost(stream, first, mean, std, out, n, threads);
}
#endif

}  // namespace strata::kernels
