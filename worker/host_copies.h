// Copies between a worker's device tensors and host buffers for an offloaded optimizer
// ([parallel] offload = "optimizer"; internal to worker/, includes LibTorch). On a CUDA device
// each direction has a stream of its own, so a unit's gradient travels to the host while the
// host updates the unit before it and the one before that travels back; the host buffers are
// pinned, so the copies run without staging. On a CPU device a copy is a plain copy, made at
// once (the same code path, tested on CPU workers).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>

namespace strata::worker {

class HostCopies {
 public:
  explicit HostCopies(torch::Device device);
  ~HostCopies();
  HostCopies(const HostCopies&) = delete;
  HostCopies& operator=(const HostCopies&) = delete;

  // A host buffer of n fp32 values for this device's copies: pinned for a CUDA device, at exactly
  // its size (mapped and registered with CUDA; not LibTorch's power-of-two pinned blocks).
  torch::Tensor HostBuffer(int64_t n) const;
  // Queues host <- device after the work queued so far on the device's current stream; returns
  // a ticket for WaitDownload. Both must stay alive and unchanged until the copy is waited for.
  size_t Download(const torch::Tensor& device_src, const torch::Tensor& host_dst);
  // Blocks until download `ticket` is in host memory (once per ticket).
  void WaitDownload(size_t ticket);
  // The device's current stream waits for every download queued so far (before anything writes
  // their sources again); the host does not wait.
  void CurrentStreamWaitsDownloads();
  // Queues device <- host on the upload stream, then `then` (device work on the upload stream
  // that reads the uploaded tensor, such as a cast into a working copy); returns a ticket for
  // CurrentStreamWaitsUpload. The host buffer must not change until the device's stream has
  // passed the upload. Callable from another thread than the downloads' (an update running
  // beside the next forward); the tickets are shared under a lock.
  size_t Upload(const torch::Tensor& host_src, const torch::Tensor& device_dst, const std::function<void()>& then = {});
  // The device's current stream waits for upload `ticket` (and its `then`) before it reads the
  // uploaded tensor (once per ticket); the host does not wait.
  void CurrentStreamWaitsUpload(size_t ticket);
  // The device's current stream waits for every upload queued so far; their tickets are
  // forgotten.
  void CurrentStreamWaitsUploads();
  // Forgets the downloads not waited for (a step dropped before its update).
  void ForgetDownloads();

 private:
  struct Streams;  // CUDA streams and events (CUDA builds)
  torch::Device device_;
  std::unique_ptr<Streams> streams_;
  std::mutex mu_;  // the tickets' events (Streams)
};

}  // namespace strata::worker
