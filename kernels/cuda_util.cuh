// Device helpers shared by kernels/'s CUDA sources (CUDA builds only): element loads and stores
// in fp32 whatever the storage dtype, 16-byte packs, and the device's SM count for grid sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.h"

namespace strata::kernels::cuda_util {

__device__ inline float Load(const float* p, int64_t i) { return p[i]; }
__device__ inline float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void Store(float* p, int64_t i, float x) { p[i] = x; }
__device__ inline void Store(__nv_bfloat16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }

// VEC elements loaded or stored as one access: 8 bf16 or 4 fp32 in 16 bytes.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T x[VEC];
};

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Streaming multiprocessors of the current device (read once per process: one device per worker).
inline int SmCount() {
  static int sms = [] {
    int device = 0, count = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return sms;
}

}  // namespace strata::kernels::cuda_util
