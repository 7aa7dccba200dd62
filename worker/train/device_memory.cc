#include "worker/train/device_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/log.h"
#include "worker/nn/torch_compat.h"
#include "worker/task.h"

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif
#if STRATA_TORCH_HAS_KINETO
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace strata::worker {

void ResetPeakMemory(const torch::Device& device) {
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return;
  }
#endif
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";  // reset VmHWM to the current resident set
}

int64_t PeakMemory(const torch::Device& device) {
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  return static_cast<int64_t>(ReadCpuPeakBytes());
}

torch::Tensor HostBufferFor(const torch::Device& device, int64_t numel, torch::ScalarType dtype) {
  const auto options = torch::TensorOptions().dtype(dtype);
#ifdef STRATA_WITH_CUDA
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (device.is_cuda() && bytes > 0) {
    void* data = nullptr;
    if (cudaHostAlloc(&data, bytes, cudaHostAllocDefault) == cudaSuccess) {
      return torch::from_blob(
          data, {numel}, [](void* p) { cudaFreeHost(p); }, options);
    }
    cudaGetLastError();  // clear it: page-locking can fail on a host short of memory; pageable works, slower
    STRATA_LOG(kWarn) << "could not page-lock " << (bytes >> 20)
                      << " MiB of host memory; copying through pageable memory";
  }
#endif
  (void)device;
  return torch::empty({numel}, options);
}

void WaitForDevice(const torch::Device& device) {
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
  (void)device;
}

StepProfiler::StepProfiler(std::string path, int64_t first, int64_t last) : first_(first), last_(last) {
  if (path.empty()) return;
#if STRATA_TORCH_HAS_KINETO
  path_ = std::move(path);
#else
  STRATA_LOG(kWarn) << "a profile was asked for, but this LibTorch has no Kineto profiler; not profiling";
#endif
}

namespace {

std::string ProfilePathFromEnvironment(const std::string& run_id, int rank) {
  const char* dir = std::getenv("STRATA_PROFILE_DIR");
  if (!dir || !*dir) return "";
  return std::string(dir) + "/" + run_id + "-rank" + std::to_string(rank) + ".json";
}

int64_t ProfileStepsFromEnvironment() {
  const char* steps = std::getenv("STRATA_PROFILE_STEPS");
  return steps ? std::max(1, std::atoi(steps)) : 2;
}

}  // namespace

// The first two steps are warm-up (allocator growth, cuBLAS heuristics): the window starts at 3.
StepProfiler::StepProfiler(const std::string& run_id, int rank)
    : StepProfiler(ProfilePathFromEnvironment(run_id, rank), 3, 2 + ProfileStepsFromEnvironment()) {}

StepProfiler::~StepProfiler() {
  if (active_) AfterStep(last_);  // the run ended inside the window: save what there is
}

void StepProfiler::BeforeStep(int64_t step) {
#if STRATA_TORCH_HAS_KINETO
  if (path_.empty() || active_ || step != first_) return;
  namespace prof = torch::autograd::profiler;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  const std::set<prof::ActivityType> activities = {prof::ActivityType::CPU, prof::ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  active_ = true;
#else
  (void)step;
#endif
}

void StepProfiler::AfterStep(int64_t step) {
#if STRATA_TORCH_HAS_KINETO
  if (!active_ || step < last_) return;
  active_ = false;
  torch::autograd::profiler::disableProfiler()->save(path_);
  STRATA_LOG(kInfo) << "wrote a profile of steps " << first_ << "-" << last_ << " to " << path_;
#else
  (void)step;
#endif
}

}  // namespace strata::worker
