// CUDA version of kernels.h's AdamW8bit (maths there), with the per-element pieces of
// adamw8bit_math.h that the CPU reference uses too, so the two agree bit for bit.
// Memory-bound: a step reads g and p (4 bytes each) and two codes (1 each), and writes p and two
// codes - 16 bytes per element, and 16 per block of 256 for the scales.
//   grid     one warp per quantization block at a time, each lane 8 of its 256 elements in two
//            packs of 4 (elements 4 lane .. 4 lane + 3, and 128 more), so each load or store
//            instruction of a warp covers 512 contiguous bytes of an fp32 array or 128 of a code
//            array; the block's absmax is then shuffles within the warp, no shared memory and
//            no barrier. Where a pointer is not 16-byte (fp32) or 4-byte (codes) aligned, packs
//            of 1: lane l takes elements l, l + 32, ..., l + 224. A thread block of 8 warps
//            stages the tables into shared memory once, and its warps walk the quantization
//            blocks grid-stride, as many thread blocks as fit on the device at once.
//   why 8 a lane: an element costs ~190 instructions (~160 in PTX: two eight-level searches
//            of ~50 each, four correctly rounded divisions and a square root, which expand), about
//            what an H100 SXM issues in the time its memory moves the element's 20 bytes
//            (~30e12 instructions/s against ~3e12 bytes/s). One element per thread would add a
//            block-wide absmax (shuffles, shared memory, a barrier per block) and per-element
//            loads and address arithmetic, for which that budget has no room.
//   tables   passed by value as a kernel parameter (2 KB: nothing to set up per device) and
//            staged into shared memory: sorted (code -> value) and as the search's tree.
// Deterministic: each quantization block is one warp's, and a max has no order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/adamw8bit_math.h"
#include "kernels/adamw_scalars.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_util.cuh"
#include "kernels/kernels.h"

namespace strata::kernels {
namespace {

using adamw8bit::kCodes;
using cuda_util::Pack;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarp * kWarpsPerBlock;
constexpr int kPerLane = static_cast<int>(kAdamW8bitBlock) / kWarp;  // 8
static_assert(kThreads == kCodes, "the threads stage one code each");

struct CodeTable {
  float codes[kCodes];  // sorted
};
struct MomentTables {
  CodeTable m, v;  // signed, unsigned
};

CodeTable TableOf(bool is_signed) {
  CodeTable table;
  std::memcpy(table.codes, AdamW8bitCodeTable(is_signed), sizeof(table.codes));
  return table;
}

// A table staged in shared memory as adamw8bit::NearestCode reads it.
struct Staged {
  float sorted[kCodes + 1];  // C, then C[255] again
  float tree[kCodes];        // heap order, [0] unused
};

// By the thread block's kCodes threads; the caller syncs before reading.
__device__ inline void Stage(const CodeTable& table, Staged& staged) {
  const int t = threadIdx.x;
  staged.sorted[t] = table.codes[t];
  if (t == 0) staged.sorted[kCodes] = table.codes[kCodes - 1];
  if (t > 0) staged.tree[t] = table.codes[adamw8bit::TreePivot(t)];
}

__device__ inline uint8_t QuantizeStaged(const Staged& staged, float x, float absmax) {
  return adamw8bit::Quantize(staged.tree, staged.sorted, x, absmax);
}

// A lane's kPerLane elements of one quantization block, `live` of whose elements exist: packs
// of VEC consecutive elements, a warp's packs side by side. Past `live`, loads give `fill`
// and stores do nothing (only a vector's last block is partial).
template <int VEC, typename T>
__device__ inline void LoadLane(const T* block, int live, int lane, T (&out)[kPerLane], T fill) {
#pragma unroll
  for (int pack = 0; pack < kPerLane / VEC; ++pack) {
    const int first = pack * kWarp * VEC + lane * VEC;
    if (first + VEC <= live) {
      const Pack<T, VEC> in = *reinterpret_cast<const Pack<T, VEC>*>(block + first);
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[pack * VEC + e] = in.x[e];
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[pack * VEC + e] = first + e < live ? block[first + e] : fill;
    }
  }
}

template <int VEC, typename T>
__device__ inline void StoreLane(T* block, int live, int lane, const T (&in)[kPerLane]) {
#pragma unroll
  for (int pack = 0; pack < kPerLane / VEC; ++pack) {
    const int first = pack * kWarp * VEC + lane * VEC;
    if (first + VEC <= live) {
      Pack<T, VEC> out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) out.x[e] = in[pack * VEC + e];
      *reinterpret_cast<Pack<T, VEC>*>(block + first) = out;
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (first + e < live) block[first + e] = in[pack * VEC + e];
      }
    }
  }
}

// The largest of x over the warp. fmaxf skips NaNs, as the reference's std::fmax does.
__device__ inline float WarpMax(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// The quantization blocks of a vector of n, warp by warp: calls f(block index, first element,
// live elements) for each of this warp's.
template <typename F>
__device__ inline void ForEachWarpBlock(int64_t n, F f) {
  const int64_t blocks = (n + kAdamW8bitBlock - 1) / kAdamW8bitBlock;
  for (int64_t b = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; b < blocks;
       b += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t begin = b * kAdamW8bitBlock;
    f(b, begin, static_cast<int>(min(kAdamW8bitBlock, n - begin)));
  }
}

template <int VEC>
__global__ void __launch_bounds__(kThreads)
    AdamW8bitKernel(AdamWScalars s, MomentTables tables, float* __restrict__ param, const float* __restrict__ grad,
                    uint8_t* __restrict__ m_codes, float* __restrict__ m_scales, uint8_t* __restrict__ v_codes,
                    float* __restrict__ v_scales, int64_t n) {
  __shared__ Staged m_table, v_table;
  Stage(tables.m, m_table);
  Stage(tables.v, v_table);
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  ForEachWarpBlock(n, [&](int64_t b, int64_t begin, int live) {
    float p[kPerLane], g[kPerLane], m[kPerLane], v[kPerLane];
    uint8_t m_code[kPerLane], v_code[kPerLane];
    LoadLane<VEC>(param + begin, live, lane, p, 0.0f);
    LoadLane<VEC>(grad + begin, live, lane, g, 0.0f);
    LoadLane<VEC>(m_codes + begin, live, lane, m_code, adamw8bit::kSignedZeroCode);
    LoadLane<VEC>(v_codes + begin, live, lane, v_code, adamw8bit::kUnsignedZeroCode);
    // Every lane reads the scales before the shuffles (which wait for the whole warp); lane 0
    // writes the new ones after them.
    const float m_scale = m_scales[b], v_scale = v_scales[b];
    // Elements past `live` are all zeros (p, g, codes of 0): m = v = 0 there, which no max
    // sees (or NaN, from an infinite scale, which fmaxf skips).
    float m_max = 0.0f, v_max = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      m[j] = adamw8bit::Mul(m_table.sorted[m_code[j]], m_scale);
      v[j] = adamw8bit::Mul(v_table.sorted[v_code[j]], v_scale);
      AdamWElement(s, p[j], g[j], m[j], v[j]);
      m_max = fmaxf(m_max, fabsf(m[j]));
      v_max = fmaxf(v_max, fabsf(v[j]));
    }
    m_max = WarpMax(m_max);
    v_max = WarpMax(v_max);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      m_code[j] = QuantizeStaged(m_table, m[j], m_max);
      v_code[j] = QuantizeStaged(v_table, v[j], v_max);
    }
    StoreLane<VEC>(param + begin, live, lane, p);
    StoreLane<VEC>(m_codes + begin, live, lane, m_code);
    StoreLane<VEC>(v_codes + begin, live, lane, v_code);
    if (lane == 0) {
      m_scales[b] = m_max;
      v_scales[b] = v_max;
    }
  });
}

template <int VEC>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(CodeTable table, const float* __restrict__ values, uint8_t* __restrict__ codes,
                   float* __restrict__ scales, int64_t n) {
  __shared__ Staged staged;
  Stage(table, staged);
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  ForEachWarpBlock(n, [&](int64_t b, int64_t begin, int live) {
    float x[kPerLane];
    uint8_t code[kPerLane];
    LoadLane<VEC>(values + begin, live, lane, x, 0.0f);
    float absmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) absmax = fmaxf(absmax, fabsf(x[j]));
    absmax = WarpMax(absmax);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) code[j] = QuantizeStaged(staged, x[j], absmax);
    StoreLane<VEC>(codes + begin, live, lane, code);
    if (lane == 0) scales[b] = absmax;
  });
}

__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(CodeTable table, const uint8_t* __restrict__ codes, const float* __restrict__ scales,
                     float* __restrict__ out, int64_t n) {
  __shared__ float sorted[kCodes];
  sorted[threadIdx.x] = table.codes[threadIdx.x];
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    out[i] = adamw8bit::Mul(sorted[codes[i]], scales[i / kAdamW8bitBlock]);
  }
}

// Thread blocks for `work` units of `per_block` each, at most as many as are resident on the
// device at once (the kernels walk the rest grid-stride; more would run as a second, unequal
// wave). Read once per kernel (a template argument: kernels of one signature must not share
// the count) and process: one device per worker.
template <auto kKernel>
int GridFor(int64_t work, int64_t per_block) {
  static const int resident = [] {
    int per_sm = 0;
    STRATA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0));
    return std::max(per_sm, 1) * cuda_util::SmCount();
  }();
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + per_block - 1) / per_block, resident)));
}

bool Aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

}  // namespace

void AdamW8bit(const Place& place, const AdamWArgs& args, float* param, const float* grad, uint8_t* exp_avg_codes,
               float* exp_avg_scales, uint8_t* exp_avg_sq_codes, float* exp_avg_sq_scales, int64_t n) {
  if (!place.cuda) {
    return AdamW8bitReference(args, param, grad, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, n);
  }
  if (n <= 0) return;
  static const MomentTables tables{TableOf(true), TableOf(false)};
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int64_t blocks = AdamW8bitBlocks(n);
  if (cuda_util::Aligned16(param) && cuda_util::Aligned16(grad) && Aligned4(exp_avg_codes) &&
      Aligned4(exp_avg_sq_codes)) {
    AdamW8bitKernel<4><<<GridFor<AdamW8bitKernel<4>>(blocks, kWarpsPerBlock), kThreads, 0, stream>>>(
        ScalarsOf(args), tables, param, grad, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, n);
  } else {
    AdamW8bitKernel<1><<<GridFor<AdamW8bitKernel<1>>(blocks, kWarpsPerBlock), kThreads, 0, stream>>>(
        ScalarsOf(args), tables, param, grad, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, n);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void AdamW8bitInit(const Place& place, uint8_t* exp_avg_codes, float* exp_avg_scales, uint8_t* exp_avg_sq_codes,
                   float* exp_avg_sq_scales, int64_t n) {
  if (!place.cuda) return AdamW8bitInitReference(exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, n);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const size_t scale_bytes = sizeof(float) * static_cast<size_t>(AdamW8bitBlocks(n));
  STRATA_CUDA_CHECK(cudaMemsetAsync(exp_avg_codes, adamw8bit::kSignedZeroCode, static_cast<size_t>(n), stream));
  STRATA_CUDA_CHECK(cudaMemsetAsync(exp_avg_sq_codes, adamw8bit::kUnsignedZeroCode, static_cast<size_t>(n), stream));
  STRATA_CUDA_CHECK(cudaMemsetAsync(exp_avg_scales, 0, scale_bytes, stream));  // all-zero bytes: 0.0f
  STRATA_CUDA_CHECK(cudaMemsetAsync(exp_avg_sq_scales, 0, scale_bytes, stream));
}

void Dequantize8bit(const Place& place, bool is_signed, const uint8_t* codes, const float* scales, float* out,
                    int64_t n) {
  if (!place.cuda) return Dequantize8bitReference(is_signed, codes, scales, out, n);
  if (n <= 0) return;
  DequantizeKernel<<<GridFor<DequantizeKernel>(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(place.stream)>>>(
      TableOf(is_signed), codes, scales, out, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void Quantize8bit(const Place& place, bool is_signed, const float* values, uint8_t* codes, float* scales, int64_t n) {
  if (!place.cuda) return Quantize8bitReference(is_signed, values, codes, scales, n);
  if (n <= 0) return;
  auto stream = static_cast<cudaStream_t>(place.stream);
  const int64_t blocks = AdamW8bitBlocks(n);
  if (cuda_util::Aligned16(values) && Aligned4(codes)) {
    QuantizeKernel<4><<<GridFor<QuantizeKernel<4>>(blocks, kWarpsPerBlock), kThreads, 0, stream>>>(
        TableOf(is_signed), values, codes, scales, n);
  } else {
    QuantizeKernel<1><<<GridFor<QuantizeKernel<1>>(blocks, kWarpsPerBlock), kThreads, 0, stream>>>(
        TableOf(is_signed), values, codes, scales, n);
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
