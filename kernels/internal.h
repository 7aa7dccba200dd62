// Shared by kernels/'s CPU sources: element access in a storage dtype, and the error of a CUDA
// call in a build without CUDA kernels.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/bf16.h"
#include "kernels/kernels.h"

namespace strata::kernels::internal {

inline float Get(DType dtype, const void* base, int64_t i) {
  return dtype == DType::kFloat32 ? static_cast<const float*>(base)[i]
                                  : Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
}

inline void Set(DType dtype, void* base, int64_t i, float value) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(base)[i] = value;
  } else {
    static_cast<uint16_t*>(base)[i] = FloatToBf16(value);
  }
}

// quant/nf4.h's tables, for nf4.cu (which leaves quant's Status-returning header to the host
// compiler): the 16 NF4 values, the 15 midpoints, the 256-entry dynamic map.
const float* Nf4Values();
const float* Nf4Midpoints();
const float* Nf4DynamicMap();

[[noreturn]] inline void NoCuda(const char* what) {
  throw std::logic_error(std::string(what) + ": this build has no CUDA kernels (configure with a CUDA LibTorch)");
}

}  // namespace strata::kernels::internal
