#include "worker/train/host_copies.h"

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#endif

#include <unordered_map>
#include <vector>

namespace strata::worker {

#ifdef STRATA_WITH_CUDA
struct HostCopies::Streams {
  using Events = std::unordered_map<size_t, std::unique_ptr<at::cuda::CUDAEvent>>;
  c10::cuda::CUDAStream down, up;
  // The tickets: uploads may be queued on another thread than the downloads' (HostCopies::Upload).
  Mutex mu;
  // The copies not yet waited for, by ticket (each is waited for once, then forgotten).
  Events downloaded STRATA_GUARDED_BY(mu), uploaded STRATA_GUARDED_BY(mu);
  size_t next_ticket STRATA_GUARDED_BY(mu) = 0;
  // The event of download or upload `ticket`, taken out: each is waited for once.
  std::unique_ptr<at::cuda::CUDAEvent> TakeDownload(size_t ticket) STRATA_EXCLUDES(mu) {
    MutexLock lock(mu);
    return Take(downloaded, ticket, "download");
  }
  std::unique_ptr<at::cuda::CUDAEvent> TakeUpload(size_t ticket) STRATA_EXCLUDES(mu) {
    MutexLock lock(mu);
    return Take(uploaded, ticket, "upload");
  }
  // The event of `ticket` in `pending` (downloaded or uploaded), taken out.
  std::unique_ptr<at::cuda::CUDAEvent> Take(Events& pending, size_t ticket, const char* what) STRATA_REQUIRES(mu) {
    auto it = pending.find(ticket);
    TORCH_CHECK(it != pending.end(), "HostCopies: ", what, " ticket ", ticket, " is not pending");
    std::unique_ptr<at::cuda::CUDAEvent> event = std::move(it->second);
    pending.erase(it);
    return event;
  }
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

torch::Tensor HostCopies::HostBuffer(const torch::Device& device, int64_t n) {
#ifdef STRATA_WITH_CUDA
  if (device.is_cuda()) {
    // Pinned at exactly its size: LibTorch's pinned allocator rounds every block up to a power of
    // two, so an 832 MiB unit (a Llama 3 8B block) pinned 1 GiB - measured, 12 GiB beyond the
    // planned 108 GiB of an 8B model's offloaded state, which left its 125 GiB host 1 GiB free.
    // Mapped, then registered with CUDA (the copies see page-locked memory and run async).
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "could not map ", bytes,
                " bytes of host memory for offloaded training state: ", std::strerror(errno),
                "; free host memory or set [parallel] offload = \"none\"");
    const cudaError_t pinned = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (pinned != cudaSuccess) {
      munmap(p, bytes);
      (void)cudaGetLastError();  // clear it: the failure is reported here
      TORCH_CHECK(false, "could not pin ", bytes,
                  " bytes of host memory for offloaded training state: ", cudaGetErrorString(pinned),
                  "; free host memory or set [parallel] offload = \"none\"");
    }
    return torch::from_blob(
        p, {n},
        [bytes](void* q) {
          (void)cudaHostUnregister(q);
          munmap(q, bytes);
        },
        torch::TensorOptions().dtype(torch::kFloat));
  }
#endif
  return torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat));
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
    MutexLock lock(streams_->mu);
    const size_t ticket = streams_->next_ticket++;
    streams_->downloaded.emplace(ticket, std::move(done));
    return ticket;
  }
#endif
  host_dst.copy_(device_src);
  return 0;
}

void HostCopies::WaitDownload(size_t ticket) {
#ifdef STRATA_WITH_CUDA
  if (streams_) streams_->TakeDownload(ticket)->synchronize();
#else
  (void)ticket;
#endif
}

void HostCopies::CurrentStreamWaitsDownloads() {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    at::cuda::CUDAEvent done;
    done.record(streams_->down);
    done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
}

size_t HostCopies::Upload(const torch::Tensor& host_src, const torch::Tensor& device_dst,
                          const std::function<void()>& then) {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    c10::cuda::CUDAGuard guard(device_);
    c10::cuda::CUDACachingAllocator::recordStream(device_dst.storage().data_ptr(), streams_->up);
    auto done = std::make_unique<at::cuda::CUDAEvent>();
    {
      c10::cuda::CUDAStreamGuard on_up(streams_->up);
      // device_dst may be a view (a unit's shard): copy_ writes through it.
      device_dst.copy_(host_src, /*non_blocking=*/true);
      if (then) then();
      done->record(streams_->up);
    }
    MutexLock lock(streams_->mu);
    const size_t ticket = streams_->next_ticket++;
    streams_->uploaded.emplace(ticket, std::move(done));
    return ticket;
  }
#endif
  device_dst.copy_(host_src);
  if (then) then();
  return 0;
}

void HostCopies::CurrentStreamWaitsUpload(size_t ticket) {
#ifdef STRATA_WITH_CUDA
  if (streams_) streams_->TakeUpload(ticket)->block(c10::cuda::getCurrentCUDAStream(device_.index()));
#else
  (void)ticket;
#endif
}

void HostCopies::CurrentStreamWaitsUploads() {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    at::cuda::CUDAEvent done;
    done.record(streams_->up);
    done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
    MutexLock lock(streams_->mu);
    streams_->uploaded.clear();
  }
#endif
}

void HostCopies::ForgetDownloads() {
#ifdef STRATA_WITH_CUDA
  if (streams_) {
    MutexLock lock(streams_->mu);
    streams_->downloaded.clear();
  }
#endif
}

HostGradientSums::HostGradientSums(HostCopies& copies, const torch::Device& device, int64_t length, int buffers)
    : copies_(copies) {
  for (int i = 0; i < buffers; ++i) {
    staging_.push_back(HostCopies::HostBuffer(device, length));
    free_.push_back(static_cast<size_t>(i));
  }
  thread_ = std::thread([this] { Loop(); });
}

HostGradientSums::~HostGradientSums() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  changed_.NotifyAll();
  thread_.join();
}

void HostGradientSums::Add(const torch::Tensor& device_src, const torch::Tensor& host_sum, bool first) {
  const int64_t n = device_src.numel();
  TORCH_CHECK(n <= staging_.front().numel() && n <= host_sum.numel(), "HostGradientSums: ", n,
              " values for a staging buffer of ", staging_.front().numel(), " and a sum of ", host_sum.numel());
  size_t staging = 0;
  {
    MutexLock lock(mu_);
    changed_.Wait(lock, [&]() STRATA_REQUIRES(mu_) { return !free_.empty(); });
    staging = free_.back();
    free_.pop_back();
  }
  // Outside the lock: on a CPU device the copy is made here, at once.
  const size_t ticket = copies_.Download(device_src, staging_[staging].narrow(0, 0, n));
  {
    MutexLock lock(mu_);
    queue_.push_back({ticket, staging, host_sum, n, first});
    ++in_flight_;
  }
  changed_.NotifyAll();
}

void HostGradientSums::Loop() {
  for (;;) {
    Job job;
    bool skip = false;
    {
      MutexLock lock(mu_);
      changed_.Wait(lock, [&]() STRATA_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      skip = !failure_.empty();
    }
    std::string failure;
    try {
      copies_.WaitDownload(job.ticket);
      if (!skip) {
        torch::NoGradGuard no_grad;  // grad mode is per thread
        const torch::Tensor from = staging_[job.staging].narrow(0, 0, job.n), into = job.sum.narrow(0, 0, job.n);
        if (job.first) {
          into.copy_(from);
        } else {
          into.add_(from);
        }
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    {
      MutexLock lock(mu_);
      if (!failure.empty() && failure_.empty()) failure_ = failure;
      free_.push_back(job.staging);
      --in_flight_;
    }
    changed_.NotifyAll();
  }
}

Status HostGradientSums::Drain() {
  MutexLock lock(mu_);
  changed_.Wait(lock, [&]() STRATA_REQUIRES(mu_) { return in_flight_ == 0; });
  if (failure_.empty()) return Status::Ok();
  const std::string failure = failure_;
  failure_.clear();
  return Internal("summing a gradient in host memory failed: " + failure);
}

}  // namespace strata::worker
