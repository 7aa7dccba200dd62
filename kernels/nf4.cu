// CUDA version of kernels.h's NF4 kernels (maths there and at the top of quant/nf4.cc).
// Memory-bound passes, sized so that one thread holds 16 weights: 8 code bytes (one 8-byte load or
// store) and a quarter of a 64-weight block.
//   dequantize  thread g decodes weights [16g, 16g + 16): its block's absmax (two rounded float
//               operations), then 16 table lookups (the table in shared memory) times it, stored
//               as two (bf16) or four (fp32) 16-byte writes. 2.5 bytes of traffic a bf16 weight.
//   quantize    a block is four neighbouring lanes of a warp: each takes its 16 weights' largest
//               |w|, two xor-shuffles give the block's, and each lane codes its own 16. The warp
//               walks eight blocks at a time, all 32 lanes together (lanes past the end carry
//               zeros), so the shuffles always have every lane.
//   nest        one warp per group of 256 block scales, eight a lane; a full-warp reduction gives
//               the group's largest |absmax - offset|, then each lane searches the 8-bit map (in
//               shared memory) for its own eight.
// No fast math: the reciprocals are IEEE (1.0f / x) and the products and sums are _rn intrinsics,
// so nothing is fused and every bit is the CPU reference's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/internal.h"
#include "kernels/kernels.h"
#include "quant/nf4_rounding.h"

namespace strata::kernels {
namespace {

using cuda_util::Load;
using cuda_util::Pack;
using cuda_util::Store;

constexpr int kThreads = 256;       // also the dynamic map's 256 entries, loaded a thread each
constexpr int64_t kPerThread = 16;  // weights a thread holds: a quarter of a block
static_assert(quant::kNf4Blocksize == 4 * kPerThread, "four lanes make a block");
static_assert(quant::kNestedBlocksize == 32 * 8, "one warp of eight scales a lane makes a nested group");

struct Nf4Tables {
  float value[16];  // quant::Nf4Table()
  float mid[15];    // quant::Nf4Thresholds()
};

Nf4Tables Tables() {
  Nf4Tables t;
  std::memcpy(t.value, internal::Nf4Values(), sizeof(t.value));
  std::memcpy(t.mid, internal::Nf4Midpoints(), sizeof(t.mid));
  return t;
}

int Blocks(int64_t threads_wanted) {
  const int64_t wanted = (threads_wanted + kThreads - 1) / kThreads;
  const int64_t most = int64_t(cuda_util::SmCount()) * 8;
  return static_cast<int>(wanted < 1 ? 1 : wanted < most ? wanted : most);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    Nf4DequantizeKernel(Nf4Tables tables, const uint8_t* __restrict__ codes, const uint8_t* __restrict__ absmax_codes,
                        const float* __restrict__ nested_absmax, const float* __restrict__ nested_map, float offset,
                        int64_t n, T* __restrict__ out, bool vectorized) {
  __shared__ float table[16];
  if (threadIdx.x < 16) table[threadIdx.x] = tables.value[threadIdx.x];
  __syncthreads();
  const int64_t groups = (n + kPerThread - 1) / kPerThread;
  for (int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * kThreads) {
    const int64_t b = g / 4;
    const float absmax = quant::rounding::DecodeScale(__ldg(nested_map + __ldg(absmax_codes + b)),
                                                      __ldg(nested_absmax + b / quant::kNestedBlocksize), offset);
    const int64_t first = g * kPerThread;
    if (vectorized && first + kPerThread <= n) {
      const uint2 packed = __ldg(reinterpret_cast<const uint2*>(codes) + g);
      constexpr int kVec = 16 / sizeof(T);
      Pack<T, kVec> part[kPerThread / kVec];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t byte = ((k < 4 ? packed.x : packed.y) >> (8 * (k % 4))) & 0xffu;
        Store(part[(2 * k) / kVec].x, (2 * k) % kVec, __fmul_rn(table[byte >> 4], absmax));
        Store(part[(2 * k + 1) / kVec].x, (2 * k + 1) % kVec, __fmul_rn(table[byte & 15u], absmax));
      }
      auto* dst = reinterpret_cast<Pack<T, kVec>*>(out + first);
#pragma unroll
      for (int v = 0; v < kPerThread / kVec; ++v) dst[v] = part[v];
    } else {
      for (int64_t i = first; i < first + kPerThread && i < n; ++i) {
        const uint32_t byte = codes[i / 2];
        Store(out, i, __fmul_rn(table[i % 2 == 0 ? byte >> 4 : byte & 15u], absmax));
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    Nf4QuantizeKernel(Nf4Tables tables, const T* __restrict__ values, int64_t n, uint8_t* __restrict__ codes,
                      float* __restrict__ absmax_out, unsigned long long* __restrict__ first_nonfinite) {
  const int lane = threadIdx.x % 32;
  const int64_t blocks = (n + quant::kNf4Blocksize - 1) / quant::kNf4Blocksize;
  const int64_t warp = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int64_t code_bytes = (n + 1) / 2;
  for (int64_t b0 = warp * 8; b0 < blocks; b0 += warps * 8) {
    const int64_t b = b0 + lane / 4;
    const int64_t first = b * quant::kNf4Blocksize + (lane % 4) * kPerThread;
    float w[kPerThread];
    float largest = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = first + j;
      w[j] = b < blocks && i < n ? Load(values, i) : 0.0f;  // past the end: the zero pad
      if (!isfinite(w[j])) atomicMin(first_nonfinite, static_cast<unsigned long long>(i));
      largest = fmaxf(largest, fabsf(w[j]));
    }
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
    if (b >= blocks) continue;
    if (lane % 4 == 0) absmax_out[b] = largest;
    const float inv = 1.0f / largest;
    uint8_t byte[kPerThread / 2];
#pragma unroll
    for (int k = 0; k < kPerThread / 2; ++k) {
      const uint8_t hi = largest == 0.0f ? 0 : quant::rounding::Nf4Code(tables.mid, __fmul_rn(w[2 * k], inv));
      const uint8_t lo = largest == 0.0f ? 0 : quant::rounding::Nf4Code(tables.mid, __fmul_rn(w[2 * k + 1], inv));
      byte[k] = static_cast<uint8_t>(hi << 4 | lo);
    }
    const int64_t at = first / 2;
    if (at + kPerThread / 2 <= code_bytes) {
      uint2 packed;
      memcpy(&packed, byte, sizeof(packed));
      *reinterpret_cast<uint2*>(codes + at) = packed;
    } else {
      for (int k = 0; k < kPerThread / 2 && at + k < code_bytes; ++k) codes[at + k] = byte[k];
    }
  }
}

struct DynamicMap {
  float value[256];
};

__global__ void __launch_bounds__(kThreads)
    Nf4NestKernel(DynamicMap map, const float* __restrict__ absmax, int64_t blocks, float offset,
                  uint8_t* __restrict__ absmax_codes, float* __restrict__ nested_absmax) {
  __shared__ float code[256];
  code[threadIdx.x] = map.value[threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t groups = (blocks + quant::kNestedBlocksize - 1) / quant::kNestedBlocksize;
  const int64_t warp = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t g = warp; g < groups; g += warps) {
    const int64_t first = g * quant::kNestedBlocksize + lane * 8;
    float centered[8];
    float largest = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      centered[j] = first + j < blocks ? __fsub_rn(absmax[first + j], offset) : 0.0f;
      largest = fmaxf(largest, fabsf(centered[j]));
    }
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, s));
    if (lane == 0) nested_absmax[g] = largest;
    const float inv = 1.0f / largest;
    for (int j = 0; j < 8 && first + j < blocks; ++j)
      absmax_codes[first + j] = largest == 0.0f ? 0 : quant::rounding::DynamicCode(code, __fmul_rn(centered[j], inv));
  }
}

}  // namespace

void Nf4Dequantize(const Place& place, const Nf4Parts& parts, DType out_dtype, void* out) {
  if (!place.cuda) return Nf4DequantizeReference(parts, out_dtype, out);
  if (parts.n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const bool vectorized = cuda_util::Aligned16(out) && (reinterpret_cast<uintptr_t>(parts.codes) & 7u) == 0;
  const int grid = Blocks((parts.n + kPerThread - 1) / kPerThread);
  if (out_dtype == DType::kBFloat16) {
    Nf4DequantizeKernel<<<grid, kThreads, 0, stream>>>(Tables(), parts.codes, parts.absmax_codes, parts.nested_absmax,
                                                       parts.nested_map, parts.offset, parts.n,
                                                       static_cast<__nv_bfloat16*>(out), vectorized);
  } else {
    Nf4DequantizeKernel<<<grid, kThreads, 0, stream>>>(Tables(), parts.codes, parts.absmax_codes, parts.nested_absmax,
                                                       parts.nested_map, parts.offset, parts.n,
                                                       static_cast<float*>(out), vectorized);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void Nf4QuantizeBlocks(const Place& place, DType in_dtype, const void* values, int64_t n, uint8_t* codes, float* absmax,
                       int64_t* first_nonfinite) {
  if (!place.cuda)
    throw std::logic_error("kernels::Nf4QuantizeBlocks runs on a CUDA device (on the host: quant::QuantizeNf4)");
  if (n <= 0) return;
  if ((reinterpret_cast<uintptr_t>(codes) & 7u) != 0)
    throw std::invalid_argument("kernels::Nf4QuantizeBlocks: codes must be 8-byte aligned");
  static_assert(sizeof(int64_t) == sizeof(unsigned long long));
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int64_t blocks = (n + quant::kNf4Blocksize - 1) / quant::kNf4Blocksize;
  const int grid = Blocks((blocks + 7) / 8 * 32);
  auto* flag = reinterpret_cast<unsigned long long*>(first_nonfinite);
  if (in_dtype == DType::kBFloat16) {
    Nf4QuantizeKernel<<<grid, kThreads, 0, stream>>>(Tables(), static_cast<const __nv_bfloat16*>(values), n, codes,
                                                     absmax, flag);
  } else {
    Nf4QuantizeKernel<<<grid, kThreads, 0, stream>>>(Tables(), static_cast<const float*>(values), n, codes, absmax,
                                                     flag);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void Nf4NestAbsmax(const Place& place, const float* absmax, int64_t blocks, float offset, uint8_t* absmax_codes,
                   float* nested_absmax) {
  if (!place.cuda)
    throw std::logic_error("kernels::Nf4NestAbsmax runs on a CUDA device (on the host: quant::QuantizeNf4)");
  if (blocks <= 0) return;
  DynamicMap map;
  std::memcpy(map.value, internal::Nf4DynamicMap(), sizeof(map.value));
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int64_t groups = (blocks + quant::kNestedBlocksize - 1) / quant::kNestedBlocksize;
  Nf4NestKernel<<<Blocks(groups * 32), kThreads, 0, stream>>>(map, absmax, blocks, offset, absmax_codes, nested_absmax);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
