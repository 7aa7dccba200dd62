// SquareSumHost (kernels.h) is here too: the other host-side pass over an offloaded gradient.
//
// AdamWHost: kernels.h's AdamW on the CPU, vectorised and split over threads - the optimizer of
// a CPU worker and of an offloaded one ([parallel] offload), where the update of a large model
// runs on the host. Bit-exact with AdamWReference: each lane computes AdamWElement's operations
// in its order, and the vector instructions (mul, add, div, sqrt) round exactly as the scalar
// ones do - this file is compiled with -ffp-contract=off (no fused multiply-adds) and
// -fno-math-errno (so sqrtf vectorises; v >= 0, so no errno would be set), never -ffast-math.
// The element loop is built for AVX-512, AVX2 and plain x86-64 (target_clones; the loader picks
// the best the CPU has).
#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/adamw_scalars.h"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define STRATA_HOST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATA_HOST_CLONES
#endif

STRATA_HOST_CLONES void AdamWSpan(const AdamWScalars s, float* __restrict__ p, const float* __restrict__ g,
                                  float* __restrict__ m, float* __restrict__ v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) AdamWElement(s, p[i], g[i], m[i], v[i]);
}

}  // namespace

void AdamWHost(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               int threads) {
  const AdamWScalars s = ScalarsOf(args);
  // Below ~1M elements a thread's start costs more than its share; chunks are whole cache lines.
  constexpr int64_t kMinPerThread = 1 << 20, kAlign = 16;
  const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(threads, n / kMinPerThread));
  if (wanted <= 1) return AdamWSpan(s, param, grad, exp_avg, exp_avg_sq, n);
  const int64_t chunk = ((n + wanted - 1) / wanted + kAlign - 1) / kAlign * kAlign;
  std::vector<std::thread> pool;
  for (int64_t begin = chunk; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    pool.emplace_back([=] { AdamWSpan(s, param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, len); });
  }
  AdamWSpan(s, param, grad, exp_avg, exp_avg_sq, std::min(chunk, n));
  for (auto& t : pool) t.join();
}

double SquareSumHost(const float* grad, int64_t n, int threads) {
  constexpr int64_t kChunk = 1 << 20;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  auto sum_chunks = [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const float* p = grad + c * kChunk;
      const int64_t len = std::min(kChunk, n - c * kChunk);
      double sum = 0;
      for (int64_t i = 0; i < len; ++i) sum += static_cast<double>(p[i]) * p[i];
      partial[static_cast<size_t>(c)] = sum;
    }
  };
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, chunks));
  const int64_t per = (chunks + workers - 1) / std::max<int64_t>(workers, 1);
  std::vector<std::thread> pool;
  for (int64_t first = per; first < chunks; first += per)
    pool.emplace_back(sum_chunks, first, std::min(chunks, first + per));
  sum_chunks(0, std::min(chunks, per));
  for (auto& t : pool) t.join();
  double total = 0;
  for (double x : partial) total += x;
  return total;
}

}  // namespace strata::kernels
