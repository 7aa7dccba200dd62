// Copies between a worker's device tensors and host buffers for an offloaded optimizer
// ([parallel] offload = "optimizer"; internal to worker/, includes LibTorch). On a CUDA device
// each direction has a stream of its own, so a unit's gradient travels to the host while the
// host updates the unit before it and the one before that travels back; the host buffers are
// pinned, so the copies run without staging. On a CPU device a copy is a plain copy, made at
// once (the same code path, tested on CPU workers).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <memory>

namespace strata::worker {

class HostCopies {
 public:
  explicit HostCopies(torch::Device device);
  ~HostCopies();
  HostCopies(const HostCopies&) = delete;
  HostCopies& operator=(const HostCopies&) = delete;

  // A host buffer of n fp32 values for this device's copies: pinned for a CUDA device.
  torch::Tensor HostBuffer(int64_t n) const;
  // Queues host <- device after the work queued so far on the device's current stream; returns
  // a ticket for WaitDownload. Both must stay alive and unchanged until the copy is waited for.
  size_t Download(const torch::Tensor& device_src, const torch::Tensor& host_dst);
  // Blocks until download `ticket` is in host memory.
  void WaitDownload(size_t ticket);
  // Queues device <- host on the upload stream; the host buffer must not change until
  // CurrentStreamWaitsUploads has been called and the device's stream has passed it.
  void Upload(const torch::Tensor& host_src, const torch::Tensor& device_dst);
  // The device's current stream waits for every upload queued so far (before any reader of the
  // uploaded tensors), and the tickets start again from 0.
  void CurrentStreamWaitsUploads();

 private:
  struct Streams;  // CUDA streams and events (CUDA builds)
  torch::Device device_;
  std::unique_ptr<Streams> streams_;
};

}  // namespace strata::worker
