#include "worker/host_copies.h"

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <vector>

namespace strata::worker {

#ifdef STRATA_WITH_CUDA
struct HostCopies::Streams {
  c10::cuda::CUDAStream down, up;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> downloaded;  // one per ticket
  at::cuda::CUDAEvent uploaded;
  explicit Streams(torch::Device d)
      : down(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())),
        up(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}
};
#else
struct HostCopies::Streams {};
#endif

HostCopies::HostCopies(torch::Device device) : device_(device) {
#ifdef STRATA_WITH_CUDA
  if (device_.is_cuda()) streams_ = std::make_unique<Streams>(device_);
#endif
}

HostCopies::~HostCopies() = default;

torch::Tensor HostCopies::HostBuffer(int64_t n) const {
  return torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(device_.is_cuda()));
}

size_t HostCopies::Download(const torch::Tensor& device_src, const torch::Tensor& host_dst) {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(streams_->down);
    // The source is read on the copy stream: the caching allocator must not hand its memory out
    // again before that stream is past the copy.
    c10::cuda::CUDACachingAllocator::recordStream(device_src.storage().data_ptr(), streams_->down);
    {
      c10::cuda::CUDAStreamGuard on_down(streams_->down);
      host_dst.copy_(device_src, /*non_blocking=*/true);
    }
    auto done = std::make_unique<at::cuda::CUDAEvent>();
    done->record(streams_->down);
    streams_->downloaded.push_back(std::move(done));
    return streams_->downloaded.size() - 1;
  }
#endif
  host_dst.copy_(device_src);
  return 0;
}

void HostCopies::WaitDownload(size_t ticket) {
#ifdef STRATA_WITH_CUDA
  if (streams_) streams_->downloaded.at(ticket)->synchronize();
#else
  (void)ticket;
#endif
}

void HostCopies::Upload(const torch::Tensor& host_src, const torch::Tensor& device_dst) {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    c10::cuda::CUDAGuard guard(device_);
    c10::cuda::CUDACachingAllocator::recordStream(device_dst.storage().data_ptr(), streams_->up);
    c10::cuda::CUDAStreamGuard on_up(streams_->up);
    // device_dst may be a view (a unit's shard): copy_ writes through it.
    device_dst.copy_(host_src, /*non_blocking=*/true);
    return;
  }
#endif
  device_dst.copy_(host_src);
}

void HostCopies::CurrentStreamWaitsUploads() {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    streams_->uploaded.record(streams_->up);
    streams_->uploaded.block(c10::cuda::getCurrentCUDAStream(device_.index()));
    streams_->downloaded.clear();
  }
#endif
}

}  // namespace strata::worker
