// Where kernels/ runs for a LibTorch device (internal to worker/'s LibTorch sources): the device's
// current CUDA stream, where LibTorch queues its own work, so kernels and LibTorch ops stay ordered
// without synchronising; the CPU references elsewhere.
#pragma once

#include <torch/torch.h>

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "kernels/kernels.h"

namespace strata::worker {

inline kernels::Place KernelPlace(const torch::Device& device) {
  kernels::Place place;
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) {
    place.cuda = true;
    place.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  }
#else
  (void)device;
#endif
  return place;
}

// kernels/'s name for a storage dtype it takes (fp32 or bf16; callers widen anything else first).
inline kernels::DType KernelType(torch::ScalarType t) {
  return t == torch::kBFloat16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32;
}

}  // namespace strata::worker
