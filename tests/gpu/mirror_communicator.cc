#include "tests/gpu/mirror_communicator.h"

#include <algorithm>
#include <atomic>
#include <limits>

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/Sleep.h>
#endif

namespace strata::worker {
namespace {

class MirrorCommunicator final : public Communicator {
 public:
  MirrorCommunicator(uint32_t world, uint32_t rank, torch::Device device)
      : world_(world), rank_(rank), device_(device) {}

  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return world_; }

  Status AllReduceSum(float* data, size_t count) override { return Sum(View(data, count, torch::kFloat)); }
  Status AllReduceSumBf16(uint16_t* data, size_t count) override { return Sum(View(data, count, torch::kBFloat16)); }
  Status ReduceScatterSum(float* data, size_t count) override {
    return Sum(Block(View(data, count, torch::kFloat), rank_));
  }
  Status ReduceScatterSumTo(float* data, float* block, size_t count) override {
    return SumInto(View(data, count, torch::kFloat), block);
  }
  Status ReduceScatterSumBf16To(uint16_t* data, uint16_t* block, size_t count) override {
    return SumInto(View(data, count, torch::kBFloat16), block);
  }
  Status AllGather(float* data, size_t count) override { return Repeat(View(data, count, torch::kFloat)); }
  Status AllGather16(uint16_t* data, size_t count) override { return Repeat(View(data, count, torch::kBFloat16)); }
  Status AllGatherFrom(const float* mine, float* data, size_t count) override {
    return RepeatFrom(mine, View(data, count, torch::kFloat));
  }
  Status AllGather16From(const uint16_t* mine, uint16_t* data, size_t count) override {
    return RepeatFrom(mine, View(data, count, torch::kBFloat16));
  }
  Status Broadcast(float*, size_t, uint32_t) override { return Live(); }  // every copy holds the root's already
  Status Send(const void*, size_t, uint32_t) override { return NoPeer(); }
  Status Recv(void*, size_t, uint32_t) override { return NoPeer(); }
  Result<std::unique_ptr<Communicator>> Split(const std::vector<std::vector<uint32_t>>& groups) override {
    for (const auto& group : groups) {
      const auto at = std::find(group.begin(), group.end(), rank_);
      if (at == group.end()) continue;
      return std::unique_ptr<Communicator>(std::make_unique<MirrorCommunicator>(
          static_cast<uint32_t>(group.size()), static_cast<uint32_t>(at - group.begin()), device_));
    }
    return InvalidArgument("mirror communicator: rank " + std::to_string(rank_) + " is in no group of the split");
  }
  bool device_buffers() const override { return true; }
  void Abort() override { aborted_ = true; }
  Status Check() const override { return aborted_ ? Aborted("mirror communicator aborted") : Status::Ok(); }

 private:
  Status Live() const { return Check(); }
  static Status NoPeer() {
    return InvalidArgument(
        "mirror communicator: pipeline stages need a GPU each (a copy of this rank has nothing to send)");
  }
  torch::Tensor View(const void* data, size_t count, torch::ScalarType type) const {
    return torch::from_blob(const_cast<void*>(data), {static_cast<int64_t>(count)},
                            torch::TensorOptions().dtype(type).device(device_));
  }
  torch::Tensor Block(const torch::Tensor& whole, uint32_t rank) const {
    const auto [begin, end] = ShardRange(static_cast<size_t>(whole.numel()), world_, rank);
    return whole.narrow(0, static_cast<int64_t>(begin), static_cast<int64_t>(end - begin));
  }
  // A collective takes time on its stream, as NCCL's kernels do, and what it will write holds NaN
  // until it does: a reader that did not wait for it reads NaN (or, in place, the value before the
  // sum) whatever the timing, and the test's losses show it.
  void Delay() const {
#ifdef STRATA_WITH_CUDA
    if (device_.is_cuda()) at::cuda::sleep(kDelayCycles);  // about 20 us
#endif
  }
  static void Poison(torch::Tensor t) { t.fill_(std::numeric_limits<double>::quiet_NaN()); }
  Status Sum(torch::Tensor t) const {
    STRATA_RETURN_IF_ERROR(Live());
    Delay();
    t.mul_(static_cast<double>(world_));  // a power of two for 2 and 4: exact in fp32 and bf16
    return Status::Ok();
  }
  Status SumInto(const torch::Tensor& whole, void* block) const {
    STRATA_RETURN_IF_ERROR(Live());
    const torch::Tensor mine = Block(whole, rank_);
    torch::Tensor out = View(block, static_cast<size_t>(mine.numel()), whole.scalar_type());
    const auto* begin = static_cast<const char*>(whole.data_ptr());
    const auto* at = static_cast<const char*>(block);
    if (at < begin || at >= begin + whole.nbytes()) Poison(out);  // (not where it is the input's own block)
    Delay();
    out.copy_(mine).mul_(static_cast<double>(world_));
    return Status::Ok();
  }
  // Every block of `whole` gets this rank's (blocks one element longer get a zero after it).
  Status Repeat(const torch::Tensor& whole) const {
    STRATA_RETURN_IF_ERROR(Live());
    const torch::Tensor mine = Block(whole, rank_);
    for (uint32_t r = 0; r < world_; ++r) {
      if (r != rank_) Poison(Block(whole, r));
    }
    Delay();
    for (uint32_t r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      torch::Tensor other = Block(whole, r);
      const int64_t n = std::min(other.numel(), mine.numel());
      other.narrow(0, 0, n).copy_(mine.narrow(0, 0, n));
      if (other.numel() > n) other.narrow(0, n, other.numel() - n).zero_();
    }
    return Status::Ok();
  }
  Status RepeatFrom(const void* mine, const torch::Tensor& whole) const {
    torch::Tensor own = Block(whole, rank_);
    if (own.data_ptr() != mine) own.copy_(View(mine, static_cast<size_t>(own.numel()), whole.scalar_type()));
    return Repeat(whole);
  }

  static constexpr int64_t kDelayCycles = 40000;
  uint32_t world_, rank_;
  torch::Device device_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Communicator> CreateMirrorCommunicator(uint32_t world, uint32_t rank, torch::Device device) {
  return std::make_unique<MirrorCommunicator>(world, rank, device);
}

}  // namespace strata::worker
