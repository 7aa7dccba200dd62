// CUDA version of kernels.h's DrawNormal (the maths in normal_draw_math.h): each thread computes
// values of a grid-stride loop, integer work (three SplitMix64 outputs a value) then two rounded
// float operations, so a value is the CPU's bit for bit. A 70B base is drawn in about a second
// where the host took minutes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/internal.h"
#include "kernels/kernels.h"
#include "kernels/normal_draw_math.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void DrawNormalKernel(uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step) {
    out[j] = __fadd_rn(mean, __fmul_rn(std, draw::StandardAt(stream, static_cast<uint64_t>(first + j))));
  }
}

}  // namespace

void DrawNormal(const Place& place, uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n,
                int threads) {
  if (!place.cuda) return DrawNormalHost(stream, first, mean, std, out, n, threads);
  if (n <= 0) return;
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(std::min<int64_t>(wanted, int64_t{cuda_util::SmCount()} * 16));
  DrawNormalKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(place.stream)>>>(stream, first, mean, std, out, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
