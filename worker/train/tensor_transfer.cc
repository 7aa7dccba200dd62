#include "worker/train/tensor_transfer.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace strata::worker {

// ---------------------------------------------------------------- collectives on tensors

namespace {

// Runs `op` on an fp32 contiguous buffer the communicator can use, copying back if staged.
template <typename Op>
void OnBuffer(Communicator& comm, torch::Tensor& t, Op op) {
  if (comm.world_size() == 1) return;
  TORCH_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous(), "collectives take contiguous fp32 tensors");
  const bool direct = t.is_cpu() || comm.device_buffers();
  torch::Tensor buffer = direct ? t : t.to(torch::kCPU);
  ThrowIfFailed(op(buffer.data_ptr<float>(), static_cast<size_t>(buffer.numel())));
  if (!direct) t.copy_(buffer);
}

}  // namespace

void AllReduceTensor(Communicator& comm, torch::Tensor& t) {
  OnBuffer(comm, t, [&](float* p, size_t n) { return comm.AllReduceSum(p, n); });
}
void ReduceScatterTensor(Communicator& comm, torch::Tensor& t) {
  OnBuffer(comm, t, [&](float* p, size_t n) { return comm.ReduceScatterSum(p, n); });
}
void AllGatherTensor(Communicator& comm, torch::Tensor& t) {
  OnBuffer(comm, t, [&](float* p, size_t n) { return comm.AllGather(p, n); });
}

namespace {
// Whether the communicator can take `a` and `b` as they are (no host staging), between ranks.
bool Direct(Communicator& comm, const torch::Tensor& a, const torch::Tensor& b) {
  return comm.world_size() > 1 && a.device() == b.device() && (a.is_cpu() || comm.device_buffers()) &&
         a.is_contiguous() && b.is_contiguous();
}
}  // namespace

void ReduceScatterTensorTo(Communicator& comm, torch::Tensor& t, torch::Tensor& block) {
  const auto [begin, end] = ShardRange(static_cast<size_t>(t.numel()), comm.world_size(), comm.rank());
  TORCH_CHECK(block.numel() == static_cast<int64_t>(end - begin) && block.scalar_type() == torch::kFloat,
              "ReduceScatterTensorTo: the block is this rank's share of the tensor, fp32");
  if (Direct(comm, t, block)) {
    ThrowIfFailed(
        comm.ReduceScatterSumTo(t.data_ptr<float>(), block.data_ptr<float>(), static_cast<size_t>(t.numel())));
    return;
  }
  ReduceScatterTensor(comm, t);
  block.copy_(t.narrow(0, static_cast<int64_t>(begin), static_cast<int64_t>(end - begin)));
}

void AllGatherTensorFrom(Communicator& comm, const torch::Tensor& mine, torch::Tensor& full) {
  const auto [begin, end] = ShardRange(static_cast<size_t>(full.numel()), comm.world_size(), comm.rank());
  const bool bf16 = full.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(mine.numel() == static_cast<int64_t>(end - begin) && mine.scalar_type() == full.scalar_type() &&
                  (bf16 || full.scalar_type() == torch::kFloat),
              "AllGatherTensorFrom: this rank's share of the tensor, fp32 or bf16");
  const auto n = static_cast<size_t>(full.numel());
  if (Direct(comm, mine, full)) {
    if (bf16) {
      ThrowIfFailed(comm.AllGather16From(reinterpret_cast<const uint16_t*>(mine.data_ptr()),
                                         reinterpret_cast<uint16_t*>(full.data_ptr()), n));
    } else {
      ThrowIfFailed(comm.AllGatherFrom(mine.data_ptr<float>(), full.data_ptr<float>(), n));
    }
    return;
  }
  full.narrow(0, static_cast<int64_t>(begin), static_cast<int64_t>(end - begin)).copy_(mine);
  if (comm.world_size() == 1) return;
  if (bf16) {  // 16-bit collectives take the buffer where it is (no host staging path)
    ThrowIfFailed(comm.AllGather16(reinterpret_cast<uint16_t*>(full.data_ptr()), n));
  } else {
    AllGatherTensor(comm, full);
  }
}

void SendTensor(Communicator& comm, const torch::Tensor& t, uint32_t peer) {
  auto buffer = t.detach().to(torch::kFloat).contiguous();
  if (!comm.device_buffers()) buffer = buffer.to(torch::kCPU);
  ThrowIfFailed(comm.Send(buffer.data_ptr(), static_cast<size_t>(buffer.numel()) * sizeof(float), peer));
#ifdef STRATA_WITH_CUDA
  // The compute stream goes on while the send runs on the transfer stream: the buffer's memory
  // is not reused before the transfer stream has sent it, however soon it is dropped here.
  if (void* stream = comm.transfer_stream(); stream && buffer.is_cuda()) {
    c10::cuda::CUDACachingAllocator::recordStream(
        buffer.storage().data_ptr(),
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), buffer.device().index()));
  }
#endif
}

struct PipelineSender::Slot {
  torch::Tensor buffer;
#ifdef STRATA_WITH_CUDA
  std::optional<at::cuda::CUDAEvent> sent;  // the transfer stream's last send from it
#endif
};

PipelineSender::PipelineSender(Communicator* comm, size_t slots) : comm_(comm), slots_(std::max<size_t>(1, slots)) {}
PipelineSender::~PipelineSender() = default;

void PipelineSender::Send(const torch::Tensor& t, uint32_t peer) {
  void* stream = comm_->transfer_stream();
  if (stream == nullptr || !t.is_cuda() || !comm_->device_buffers()) {
    SendTensor(*comm_, t, peer);  // the send copies its buffer at once (ZeroMQ), or no transfer stream
    return;
  }
#ifdef STRATA_WITH_CUDA
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  const auto index = t.device().index();
  if (!slot.buffer.defined() || slot.buffer.sizes() != t.sizes() || slot.buffer.device() != t.device()) {
    slot.buffer = torch::empty(t.sizes(), t.options().dtype(torch::kFloat));
    slot.sent.reset();
  }
  if (slot.sent) slot.sent->block(c10::cuda::getCurrentCUDAStream(index));  // its last send has read it
  {
    torch::NoGradGuard no_grad;
    slot.buffer.copy_(t.detach());
  }
  ThrowIfFailed(comm_->Send(slot.buffer.data_ptr(), static_cast<size_t>(slot.buffer.numel()) * sizeof(float), peer));
  slot.sent.emplace();
  slot.sent->record(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), index));
#else
  (void)peer;
#endif
}

void PipelineSender::Join(const torch::Device& device) {
#ifdef STRATA_WITH_CUDA
  // Nothing sent since the last join (a rank with one stage, or a direction this stage never
  // sends in): nothing to wait for, and no wait may be made. In a CUDA graph's capture, an event
  // recorded on a transfer stream that took no part in it is a dependency on uncaptured work,
  // which CUDA refuses (cudaErrorStreamCaptureIsolation): every data-parallel step's capture
  // failed so on 2x H200 machines of driver 580.159.
  if (std::none_of(slots_.begin(), slots_.end(), [](const Slot& slot) { return slot.sent.has_value(); })) return;
  void* stream = comm_->transfer_stream();
  if (stream == nullptr || !device.is_cuda()) return;
  at::cuda::CUDAEvent all;
  all.record(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), device.index()));
  all.block(c10::cuda::getCurrentCUDAStream(device.index()));
  for (Slot& slot : slots_) slot.sent.reset();  // the wait above covers them
#else
  (void)device;
#endif
}

void PipelineSender::Forget() {
#ifdef STRATA_WITH_CUDA
  for (Slot& slot : slots_) slot.sent.reset();
#endif
}

torch::Tensor RecvTensor(Communicator& comm, const std::vector<int64_t>& shape, const torch::Device& device,
                         uint32_t peer) {
  auto buffer = torch::empty(
      shape, torch::TensorOptions().dtype(torch::kFloat).device(comm.device_buffers() ? device : torch::kCPU));
  ThrowIfFailed(comm.Recv(buffer.data_ptr(), static_cast<size_t>(buffer.numel()) * sizeof(float), peer));
  return buffer.to(device);
}

}  // namespace strata::worker
