// Copies between a worker's device tensors and host buffers for offloaded state ([parallel]
// offload = "optimizer" or "optimizer+params"; internal to worker/, includes LibTorch). On a CUDA device
// each direction has a stream of its own, so a unit's gradient travels to the host while the
// host updates the unit before it and the one before that travels back; the host buffers are
// pinned, so the copies run without staging. On a CPU device a copy is a plain copy, made at
// once (the same code path, tested on CPU workers).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace strata::worker {

class HostCopies {
 public:
  explicit HostCopies(torch::Device device);
  ~HostCopies();
  HostCopies(const HostCopies&) = delete;
  HostCopies& operator=(const HostCopies&) = delete;

  // A host buffer of n fp32 values for `device`'s copies: pinned for a CUDA device, at exactly its
  // size (mapped and registered with CUDA; not LibTorch's power-of-two pinned blocks).
  static torch::Tensor HostBuffer(const torch::Device& device, int64_t n);
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
  struct Streams;  // CUDA streams, and the tickets' events under Streams::mu (CUDA builds)
  torch::Device device_;
  std::unique_ptr<Streams> streams_;
};

// Sums gradients in host memory (offload = "optimizer+params", where no unit's gradient stays on
// the device): each use's gradient is downloaded into a pinned staging buffer, and a thread of its
// own writes it into the unit's host gradient (its step's first use) or adds it, in the order the
// uses were queued - the device's order of the sum, so a CPU worker's sums equal the on-device
// ones bit for bit. Add blocks while every staging buffer is in use (the host's adds bound how far
// the backward runs ahead); memory: `buffers` staging buffers of `length` floats.
class HostGradientSums {
 public:
  HostGradientSums(HostCopies& copies, const torch::Device& device, int64_t length, int buffers = 2);
  ~HostGradientSums();
  HostGradientSums(const HostGradientSums&) = delete;
  HostGradientSums& operator=(const HostGradientSums&) = delete;

  // Queues `device_src` (contiguous fp32, at most `length` values; read after the work queued so
  // far on the device's current stream, kept alive by the copy) into `host_sum`: written when
  // `first`, else added.
  void Add(const torch::Tensor& device_src, const torch::Tensor& host_sum, bool first) STRATA_EXCLUDES(mu_);
  // Blocks until every queued sum is in host memory. Not OK when one failed (the sums are then
  // wrong; later ones were skipped).
  Status Drain() STRATA_EXCLUDES(mu_);

 private:
  void Loop() STRATA_EXCLUDES(mu_);
  struct Job {
    size_t ticket = 0;
    size_t staging = 0;
    torch::Tensor sum;
    int64_t n = 0;
    bool first = false;
  };
  HostCopies& copies_;
  std::vector<torch::Tensor> staging_;
  Mutex mu_;
  CondVar changed_;
  std::vector<size_t> free_ STRATA_GUARDED_BY(mu_);  // staging buffers not in use
  std::deque<Job> queue_ STRATA_GUARDED_BY(mu_);
  int64_t in_flight_ STRATA_GUARDED_BY(mu_) = 0;  // queued and not yet summed
  bool stop_ STRATA_GUARDED_BY(mu_) = false;
  std::string failure_ STRATA_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace strata::worker
