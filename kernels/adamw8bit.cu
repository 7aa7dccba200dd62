// CUDA version of kernels.h's AdamW8bit (maths there), with the per-element pieces of
// adamw8bit_math.h that the CPU reference uses too, so the two agree bit for bit.
// Memory-bound: a step reads g, p and the decay mask (4 bytes each) and two codes (1 each), and
// writes p and two codes - 20 bytes per element, and 16 per block of 256 for the scales.
//   grid     a thread block of 256 threads takes one quantization block at a time, one element
//            per thread (a warp reads 128 contiguous bytes of each fp32 array and 32 of each
//            code array), and walks the quantization blocks grid-stride with as many thread
//            blocks as fit on the device at once, so the tables are staged into shared memory
//            once per thread block rather than once per 256 elements.
//   absmax   warp shuffles, then the 8 warps' maxima through shared memory: one __syncthreads
//            per quantization block. The maxima go to one of two slots, alternating, so a warp
//            one block ahead cannot overwrite those a slower warp is still reading.
//   tables   passed by value as a kernel parameter (2 KB: nothing to set up per device) and
//            staged into shared memory, sorted (code -> value) and level by level for the
//            search (adamw8bit_math.h says why).
// Deterministic: each quantization block is one thread block's, and a max has no order.
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

constexpr int kThreads = static_cast<int>(kAdamW8bitBlock);  // one element of the block each
constexpr int kWarps = kThreads / 32;
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

// The staged copies of one table: sorted (code -> value) and the search's level order.
struct Staged {
  float sorted[kCodes];
  float tree[kCodes];  // [255] unused
};

// By the block's kCodes threads; the caller syncs before reading.
__device__ inline void Stage(const CodeTable& table, Staged& staged) {
  const int t = threadIdx.x;
  staged.sorted[t] = table.codes[t];
  if (t + 1 < kCodes) staged.tree[t] = table.codes[adamw8bit::TreePivot(t)];
}

__device__ inline uint8_t QuantizeStaged(const Staged& staged, float x, float absmax) {
  return adamw8bit::Quantize(staged.tree, staged.sorted[0], x, absmax);
}

// The largest |a| and the largest |b| over the thread block (lanes past the vector's end pass
// 0). Starts from 0 and skips NaNs (fmaxf), as the reference's std::fmax from 0 does.
__device__ inline float2 BlockAbsMax(float a, float b, float2 (&maxima)[2][kWarps], int slot) {
  a = fabsf(a);
  b = fabsf(b);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, offset));
  }
  if (threadIdx.x % 32 == 0) maxima[slot][threadIdx.x / 32] = make_float2(a, b);
  __syncthreads();
  float2 block = make_float2(0.0f, 0.0f);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    block.x = fmaxf(block.x, maxima[slot][w].x);
    block.y = fmaxf(block.y, maxima[slot][w].y);
  }
  return block;
}

__global__ void __launch_bounds__(kThreads)
    AdamW8bitKernel(AdamWScalars s, MomentTables tables, float* __restrict__ param, const float* __restrict__ grad,
                    uint8_t* __restrict__ m_codes, float* __restrict__ m_scales, uint8_t* __restrict__ v_codes,
                    float* __restrict__ v_scales, const float* __restrict__ decay_mask, int64_t n) {
  __shared__ Staged m_table, v_table;
  __shared__ float2 maxima[2][kWarps];
  Stage(tables.m, m_table);
  Stage(tables.v, v_table);
  __syncthreads();
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  int slot = 0;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x, slot ^= 1) {
    const int64_t i = b * kThreads + threadIdx.x;
    const bool live = i < n;
    float m = 0.0f, v = 0.0f;
    if (live) {
      float p = param[i];
      // Every live thread reads the scales before BlockAbsMax's barrier; thread 0 writes the
      // new ones after it.
      m = adamw8bit::Mul(m_table.sorted[m_codes[i]], m_scales[b]);
      v = adamw8bit::Mul(v_table.sorted[v_codes[i]], v_scales[b]);
      adamw8bit::AdamWElementRounded(s, p, grad[i], m, v, decay_mask[i]);
      param[i] = p;
    }
    const float2 absmax = BlockAbsMax(m, v, maxima, slot);
    if (live) {
      m_codes[i] = QuantizeStaged(m_table, m, absmax.x);
      v_codes[i] = QuantizeStaged(v_table, v, absmax.y);
    }
    if (threadIdx.x == 0) {
      m_scales[b] = absmax.x;
      v_scales[b] = absmax.y;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(CodeTable table, const float* __restrict__ values, uint8_t* __restrict__ codes, float* __restrict__ scales,
                   int64_t n) {
  __shared__ Staged staged;
  __shared__ float2 maxima[2][kWarps];
  Stage(table, staged);
  __syncthreads();
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  int slot = 0;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x, slot ^= 1) {
    const int64_t i = b * kThreads + threadIdx.x;
    const bool live = i < n;
    const float x = live ? values[i] : 0.0f;
    const float absmax = BlockAbsMax(x, 0.0f, maxima, slot).x;
    if (live) codes[i] = QuantizeStaged(staged, x, absmax);
    if (threadIdx.x == 0) scales[b] = absmax;
  }
}

__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(CodeTable table, const uint8_t* __restrict__ codes, const float* __restrict__ scales, float* __restrict__ out,
                     int64_t n) {
  __shared__ float sorted[kCodes];
  sorted[threadIdx.x] = table.codes[threadIdx.x];
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    out[i] = adamw8bit::Mul(sorted[codes[i]], scales[i / kThreads]);
  }
}

// Thread blocks for n elements: one per quantization block, at most as many as are resident
// on the device at once (the kernels walk the rest grid-stride).
template <typename Kernel>
int GridFor(Kernel kernel, int64_t n) {
  static const int resident = [kernel] {
    int per_sm = 0;
    STRATA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    return std::max(per_sm, 1) * cuda_util::SmCount();
  }();
  return static_cast<int>(std::min<int64_t>(AdamW8bitBlocks(n), resident));
}

}  // namespace

void AdamW8bit(const Place& place, const AdamWArgs& args, float* param, const float* grad, uint8_t* exp_avg_codes,
               float* exp_avg_scales, uint8_t* exp_avg_sq_codes, float* exp_avg_sq_scales, const float* decay_mask, int64_t n) {
  if (!place.cuda) {
    return AdamW8bitReference(args, param, grad, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, decay_mask, n);
  }
  if (n <= 0) return;
  static const MomentTables tables{TableOf(true), TableOf(false)};
  AdamW8bitKernel<<<GridFor(AdamW8bitKernel, n), kThreads, 0, static_cast<cudaStream_t>(place.stream)>>>(
      ScalarsOf(args), tables, param, grad, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, decay_mask, n);
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

void Dequantize8bit(const Place& place, bool is_signed, const uint8_t* codes, const float* scales, float* out, int64_t n) {
  if (!place.cuda) return Dequantize8bitReference(is_signed, codes, scales, out, n);
  if (n <= 0) return;
  DequantizeKernel<<<GridFor(DequantizeKernel, n), kThreads, 0, static_cast<cudaStream_t>(place.stream)>>>(TableOf(is_signed), codes,
                                                                                                           scales, out, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void Quantize8bit(const Place& place, bool is_signed, const float* values, uint8_t* codes, float* scales, int64_t n) {
  if (!place.cuda) return Quantize8bitReference(is_signed, values, codes, scales, n);
  if (n <= 0) return;
  QuantizeKernel<<<GridFor(QuantizeKernel, n), kThreads, 0, static_cast<cudaStream_t>(place.stream)>>>(TableOf(is_signed), values, codes,
                                                                                                       scales, n);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
