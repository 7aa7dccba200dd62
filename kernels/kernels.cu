// CUDA versions of kernels.h. Memory-bound elementwise passes: AdamW moves 28 bytes per element
// (read p, g, m, v; write p, m, v - 4 bytes each), so its time is that
// over HBM bandwidth; bench/kernels_bench measures how close it gets.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/adamw_scalars.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t work) {
  const int sms = cuda_util::SmCount();
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < int64_t(sms) * 8 ? (wanted > 0 ? wanted : 1) : int64_t(sms) * 8);
}

// Four elements per thread per iteration where every pointer is 16-byte aligned; the rest (and
// unaligned shards) one at a time. Same per-element maths either way.
// `p16` (optional): the updated p rounded to bf16, 8 bytes per 4 elements (8-byte aligned).
__global__ void AdamWVec4(AdamWScalars s, float4* p, const float4* g, float4* m, float4* v, uint2* p16, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 pp = p[i], mm = m[i], vv = v[i];
    const float4 gg = g[i];
    AdamWElement(s, pp.x, gg.x, mm.x, vv.x);
    AdamWElement(s, pp.y, gg.y, mm.y, vv.y);
    AdamWElement(s, pp.z, gg.z, mm.z, vv.z);
    AdamWElement(s, pp.w, gg.w, mm.w, vv.w);
    p[i] = pp, m[i] = mm, v[i] = vv;
    if (p16) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(pp.x, pp.y), hi = __floats2bfloat162_rn(pp.z, pp.w);
      uint2 packed;
      memcpy(&packed.x, &lo, 4);
      memcpy(&packed.y, &hi, 4);
      p16[i] = packed;
    }
  }
}

__global__ void AdamWScalar(AdamWScalars s, float* p, const float* g, float* m, float* v, __nv_bfloat16* p16,
                            int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    AdamWElement(s, p[i], g[i], m[i], v[i]);
    if (p16) p16[i] = __float2bfloat16_rn(p[i]);
  }
}

using cuda_util::Aligned16;

// Stage 1: each block sums its grid-stride share (fp32 per thread, then a tree in shared
// memory) into partial[block]. Stage 2: one block sums the partials in a fixed order into *out.
__global__ void SquareSumPartial(const float* g, int64_t n, float* partial) {
  __shared__ float tile[kThreads];
  float sum = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    sum += g[i] * g[i];
  }
  tile[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) tile[threadIdx.x] += tile[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = tile[0];
}

__global__ void SquareSumFinal(const float* partial, int count, float* out) {
  __shared__ double tile[kThreads];
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  tile[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) tile[threadIdx.x] += tile[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out += static_cast<float>(tile[0]);
}

}  // namespace

bool HasCuda() { return true; }

void AdamW(const Place& place, const AdamWArgs& args, float* param, const float* grad, float* exp_avg,
           float* exp_avg_sq, int64_t n, uint16_t* param_bf16) {
  if (!place.cuda) {
    if (param_bf16) return AdamWReference(args, param, grad, exp_avg, exp_avg_sq, n, param_bf16);
    return AdamWHost(args, param, grad, exp_avg, exp_avg_sq, n);
  }
  if (n <= 0) return;
  const AdamWScalars s = ScalarsOf(args);
  auto stream = static_cast<cudaStream_t>(place.stream);
  int64_t done = 0;
  if (Aligned16(param) && Aligned16(grad) && Aligned16(exp_avg) && Aligned16(exp_avg_sq) &&
      (!param_bf16 || (reinterpret_cast<uintptr_t>(param_bf16) & 7u) == 0)) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      AdamWVec4<<<Blocks(n4), kThreads, 0, stream>>>(
          s, reinterpret_cast<float4*>(param), reinterpret_cast<const float4*>(grad),
          reinterpret_cast<float4*>(exp_avg), reinterpret_cast<float4*>(exp_avg_sq),
          reinterpret_cast<uint2*>(param_bf16), n4);
      STRATA_CUDA_CHECK(cudaGetLastError());
    }
    done = n4 * 4;
  }
  if (done < n) {
    AdamWScalar<<<Blocks(n - done), kThreads, 0, stream>>>(
        s, param + done, grad + done, exp_avg + done, exp_avg_sq + done,
        param_bf16 ? reinterpret_cast<__nv_bfloat16*>(param_bf16) + done : nullptr, n - done);
    STRATA_CUDA_CHECK(cudaGetLastError());
  }
}

void SquareSum(const Place& place, const float* grad, int64_t n, float* out, float* scratch) {
  if (!place.cuda) return SquareSumReference(grad, n, out);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int blocks = std::min<int>(Blocks(n), static_cast<int>(SquareSumScratch()));
  SquareSumPartial<<<blocks, kThreads, 0, stream>>>(grad, n, scratch);
  STRATA_CUDA_CHECK(cudaGetLastError());
  SquareSumFinal<<<1, kThreads, 0, stream>>>(scratch, blocks, out);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
