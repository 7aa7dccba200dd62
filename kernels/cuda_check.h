// Every CUDA call checked, naming the file and line: a failed launch is a fault, not a result.
// (CUDA sources of kernels/ only.)
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define STRATA_CUDA_CHECK(call)                                                                 \
  do {                                                                                          \
    cudaError_t strata_cuda_error = (call);                                                     \
    if (strata_cuda_error != cudaSuccess) {                                                     \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) +         \
                               ": " #call " failed: " + cudaGetErrorString(strata_cuda_error)); \
    }                                                                                           \
  } while (0)
