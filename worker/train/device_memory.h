// Peak memory of one step phase on a worker's device (internal to worker/, includes LibTorch).
// The planner's estimate (shard/planner.h) is checked against these numbers, so they measure the
// same thing on every device:
//   CUDA: the caching allocator's peak of allocated bytes since the last reset (tensor memory:
//         what the estimate's weights + gradients + optimizer + activations + buffers predict);
//   CPU:  the process's peak resident set since the last reset (Linux: writing 5 to
//         /proc/self/clear_refs resets VmHWM), which also counts code, LibTorch and the data.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace strata::worker {

// Starts a new measurement window on `device`.
void ResetPeakMemory(const torch::Device& device);

// The peak in bytes since the last ResetPeakMemory on `device` (0 when it cannot be read).
int64_t PeakMemory(const torch::Device& device);

// A host tensor of `numel` elements of `dtype`, allocated at exactly that size, for copies to and from `device`:
// page-locked on a GPU (the driver copies it at full link speed, where pageable memory goes through a bounce buffer at
// a tenth of it), plain memory on a CPU. Not LibTorch's pinned allocator: it rounds each block up to a power of two,
// which for a checkpoint of 5 GiB would pin 8.
torch::Tensor HostBufferFor(const torch::Device& device, int64_t numel, torch::ScalarType dtype);

// Waits until the work queued on `device`'s current stream (e.g. non-blocking copies) is done.
void WaitForDevice(const torch::Device& device);

// Opt-in Kineto trace of some steps of a run, for finding where step time goes:
//   STRATA_PROFILE_DIR=DIR  write DIR/<run>-rank<R>.json (chrome trace: CPU ops and GPU kernels)
//   STRATA_PROFILE_STEPS=N  of the N steps after the first two (default 2)
// LibTorch 2.x only; on 1.13 the variables are ignored with a warning.
class StepProfiler {
 public:
  // From the environment above (inactive when STRATA_PROFILE_DIR is unset).
  StepProfiler(const std::string& run_id, int rank);
  // Steps first..last (1-based, as BeforeStep / AfterStep count them) into `path`; inactive
  // when `path` is empty.
  StepProfiler(std::string path, int64_t first, int64_t last);
  ~StepProfiler();
  // Call before and after each step; `step` is the 1-based step about to run / just run.
  void BeforeStep(int64_t step);
  void AfterStep(int64_t step);

 private:
  std::string path_;
  int64_t first_, last_;
  bool active_ = false;
};

}  // namespace strata::worker
