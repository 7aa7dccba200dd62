#include "worker/train/side_stream.h"

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace strata::worker {

#ifdef STRATA_WITH_CUDA
class SideStream::Done {
 public:
  at::cuda::CUDAEvent event;
};

struct SideStream::Impl {
  explicit Impl(torch::Device d)
      : device(d), stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, d.index())) {}
  torch::Device device;
  c10::cuda::CUDAStream stream;
};
#else
class SideStream::Done {};
struct SideStream::Impl {};
#endif

SideStream::SideStream(torch::Device device) {
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) impl_ = std::make_unique<Impl>(device);
#endif
  (void)device;
}

SideStream::~SideStream() = default;

std::shared_ptr<SideStream::Done> SideStream::Run(const std::function<void()>& work) {
#ifdef STRATA_WITH_CUDA
  if (impl_) {
    at::cuda::CUDAEvent handed_over;
    handed_over.record(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
    handed_over.block(impl_->stream);
    {
      c10::cuda::CUDAStreamGuard on_side(impl_->stream);
      work();
    }
    auto done = std::make_shared<Done>();
    done->event.record(impl_->stream);
    return done;
  }
#endif
  work();
  return nullptr;
}

void SideStream::Wait(const std::shared_ptr<Done>& done) {
#ifdef STRATA_WITH_CUDA
  if (impl_ && done) done->event.block(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
#endif
  (void)done;
}

void SideStream::WaitAll() {
#ifdef STRATA_WITH_CUDA
  if (!impl_) return;
  at::cuda::CUDAEvent all;
  all.record(impl_->stream);
  all.block(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
#endif
}

void SideStream::Synchronize() {
#ifdef STRATA_WITH_CUDA
  if (impl_) impl_->stream.synchronize();
#endif
}

void SideStream::KeepUntilDone(const torch::Tensor& t) {
#ifdef STRATA_WITH_CUDA
  if (impl_ && t.defined() && t.is_cuda())
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), impl_->stream);
#endif
  (void)t;
}

}  // namespace strata::worker
