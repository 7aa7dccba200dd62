// A stream beside a device's compute stream for collectives that overlap the compute (ZeRO-3's
// gathers and reduce-scatters; internal to worker/, includes LibTorch). Work queued on it starts
// after everything the compute stream had queued when it was handed over, and the compute stream
// waits for it only where it reads the result (Wait), so a layer's gather runs during the layer
// before it. On a CPU device there is one stream: the work runs at once, in order, and every wait
// is a no-op (the same code path, tested on CPU workers).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

namespace strata::worker {

class SideStream {
 public:
  explicit SideStream(torch::Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // The end of some work on the side stream (null on a CPU device).
  class Done;
  // Runs `work`, which queues device work, with the side stream current, after the work the
  // calling thread's current stream has queued so far. Memory `work` allocates belongs to the
  // side stream: allocate what the compute stream reads first, on the compute stream.
  std::shared_ptr<Done> Run(const std::function<void()>& work);
  // The calling thread's current stream waits for `done` (the host does not).
  void Wait(const std::shared_ptr<Done>& done);
  // ... for everything run so far.
  void WaitAll();
  // The host waits for everything run so far (before it writes host memory that work reads).
  void Synchronize();
  // `t`'s memory, allocated on the compute stream, is not reused before the side stream's work
  // so far is done (the caching allocator's record_stream), however soon `t` is dropped.
  void KeepUntilDone(const torch::Tensor& t);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::worker
