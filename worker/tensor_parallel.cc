// Megatron's f and g (Shoeybi et al. 2019) for a block whose heads and MLP columns are split
// over the tp ranks: the split matmuls' partial sums meet in g, and f is its transpose. Under
// sequence parallelism (Korthikanti et al. 2022) a rank holds its 1/tp of the tokens between
// them: f all-gathers the tokens and g reduce-scatters them, the same bytes as the all-reduces.
#include "worker/tensor_parallel.h"

#include <stdexcept>

namespace strata::worker {

TensorParallelGroup::TensorParallelGroup(Communicator* comm, torch::Device device, bool overlap, std::function<void(int unit)> announce)
    : comm_(comm), announce_(std::move(announce)) {
  if (overlap) side_ = std::make_unique<SideStream>(device);
}

bool TensorParallelGroup::HoldAnnouncement(int unit) {
  if (!holding_) return false;
  held_.push_back(unit);
  return true;
}

void TensorParallelGroup::DropUnfinished() {
  deferred_.Clear();
  held_.clear();
}

void TensorParallelGroup::Beside(const std::function<void()>& collective) {
  if (!side_ || deferred_.empty()) {
    collective();
    return;
  }
  const std::shared_ptr<SideStream::Done> done = side_->Run(collective);
  {
    // Joined even when a weight gradient throws (out of memory): the buffers the collective reads
    // and writes are freed on the compute stream, after this wait.
    struct Join {
      TensorParallelGroup& group;
      const std::shared_ptr<SideStream::Done>& done;
      ~Join() {
        group.holding_ = false;
        group.side_->Wait(done);
      }
    } join{*this, done};
    holding_ = true;
    weight_gradients_deferred_ += deferred_.RunAll();
  }
  // (With today's families no unit completes beside the collective - a block's last gradient is
  // its input norm's, written after f's backward: a guard.)
  std::vector<int> held;
  held.swap(held_);
  for (int unit : held) announce_(unit);
}

namespace {

TensorParallelGroup* GroupOf(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<TensorParallelGroup*>(ctx->saved_data["group"].toInt());
}

// Activations cross the tensor-parallel ranks as they are computed: bf16 for a bf16 activation
// (half the bytes of widening it; summing two bf16 partial sums in fp32 and rounding once is
// exact to what NCCL's bf16 sum gives for tp = 2), fp32 otherwise. Where the communicator takes
// host buffers only (ZeroMQ) a CUDA activation is staged through the host.
torch::ScalarType WireType(const torch::Tensor& x) { return x.scalar_type() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat; }
torch::Device WireDevice(Communicator& comm, const torch::Tensor& x) {
  return x.is_cpu() || comm.device_buffers() ? x.device() : torch::Device(torch::kCPU);
}
uint16_t* Bits16(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// Sequence parallelism (stage_model.h): a rank's tokens are its block of the flattened [b * t]
// tokens, held as [b, t / tp, hidden] - the elementwise work between the split matmuls does not
// care which tokens are where, and every collective is over contiguous blocks (ShardRange of the
// flattened tensor, tp dividing t).
enum class SumOf { kEveryToken, kMyTokens };

// The sum over the ranks of x (kEveryToken: all-reduced) or of this rank's block of its tokens
// (kMyTokens: reduce-scattered), a new tensor (x is autograd's and stays as it was). kBeside: f's
// backward, run beside the weight gradients put off for it (TensorParallelGroup::Beside).
template <SumOf kWhat, bool kBeside>
torch::Tensor Summed(TensorParallelGroup& group, const torch::Tensor& x) {
  Communicator& comm = group.comm();
  if (comm.world_size() == 1) return x;
  std::vector<int64_t> sizes = x.sizes().vec();
  if (kWhat == SumOf::kMyTokens) {
    TORCH_CHECK(sizes.size() >= 2 && sizes[1] % comm.world_size() == 0, "sequence parallel: ", sizes[1], " tokens a row over tp = ",
                comm.world_size());
    sizes[1] /= comm.world_size();
  }
  // NCCL's reduce-scatter reads its input in place (the check above keeps it off its in-place
  // fallback for a count the ranks do not divide); an all-reduce, or the host ring, sums into its
  // buffer, which must not be autograd's. One copy otherwise, widening or staging as it goes.
  const bool in_place = kWhat == SumOf::kMyTokens && comm.device_buffers() && x.is_cuda() && x.is_contiguous() &&
                        x.scalar_type() == WireType(x);
  torch::Tensor full = in_place ? x : torch::empty(x.sizes(), x.options().dtype(WireType(x)).device(WireDevice(comm, x)));
  if (!in_place) full.copy_(x);
  // Allocated here, on the compute stream, which reads it after Beside's wait.
  torch::Tensor out = kWhat == SumOf::kMyTokens ? torch::empty(sizes, full.options()) : full;
  const auto n = static_cast<size_t>(full.numel());
  const bool bf16 = full.scalar_type() == torch::kBFloat16;
  auto collective = [&] {
    if (kWhat == SumOf::kMyTokens) {
      ThrowIfFailed(bf16 ? comm.ReduceScatterSumBf16To(Bits16(full), Bits16(out), n) : comm.ReduceScatterSumTo(full.data_ptr<float>(), out.data_ptr<float>(), n));
    } else {
      ThrowIfFailed(bf16 ? comm.AllReduceSumBf16(Bits16(full), n) : comm.AllReduceSum(full.data_ptr<float>(), n));
    }
  };
  if (kBeside) {
    group.Beside(collective);
  } else {
    collective();
  }
  return out.to(x.device(), x.scalar_type());
}

torch::Tensor TokensGathered(TensorParallelGroup& group, const torch::Tensor& mine) {
  Communicator& comm = group.comm();
  std::vector<int64_t> sizes = mine.sizes().vec();
  sizes[1] *= comm.world_size();
  const torch::Tensor wire = mine.to(WireDevice(comm, mine), WireType(mine)).contiguous();
  torch::Tensor full = torch::empty(sizes, wire.options());
  const auto n = static_cast<size_t>(full.numel());
  if (wire.scalar_type() == torch::kBFloat16) {
    ThrowIfFailed(comm.AllGather16From(Bits16(wire), Bits16(full), n));
  } else {
    ThrowIfFailed(comm.AllGatherFrom(wire.data_ptr<float>(), full.data_ptr<float>(), n));
  }
  return full.to(mine.device(), mine.scalar_type());
}

// This rank's block of x's tokens (a copy: autograd's output owns its memory).
torch::Tensor TokenBlock(TensorParallelGroup& group, const torch::Tensor& x) {
  Communicator& comm = group.comm();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[1] /= comm.world_size();
  const int64_t block = x.numel() / comm.world_size();
  return x.contiguous().view({-1}).narrow(0, block * comm.rank(), block).view(sizes).clone();
}

torch::Tensor Same(TensorParallelGroup&, const torch::Tensor& x) { return x; }

constexpr auto AllReduced = Summed<SumOf::kEveryToken, false>;
constexpr auto TokensReduceScattered = Summed<SumOf::kMyTokens, false>;
// f's backward, beside the weight gradients of the matmuls that read f's output.
constexpr auto AllReducedBeside = Summed<SumOf::kEveryToken, true>;
constexpr auto TokensReduceScatteredBeside = Summed<SumOf::kMyTokens, true>;

// An activation's way across the tensor-parallel ranks: `Forward` in forward, `Backward` on its
// gradient (the two are each other's transpose). `group` is the rank's TensorParallelGroup*.
template <torch::Tensor (*Forward)(TensorParallelGroup&, const torch::Tensor&),
          torch::Tensor (*Backward)(TensorParallelGroup&, const torch::Tensor&)>
struct TensorParallelFn : torch::autograd::Function<TensorParallelFn<Forward, Backward>> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t group) {
    ctx->saved_data["group"] = group;
    return Forward(*reinterpret_cast<TensorParallelGroup*>(group), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    return {Backward(*GroupOf(ctx), g[0]), torch::Tensor()};
  }
};

// Megatron's f (identity; the gradient all-reduced) and g (all-reduce; the gradient as it is).
using CopyToTensorParallelFn = TensorParallelFn<Same, AllReducedBeside>;
using ReduceFromTensorParallelFn = TensorParallelFn<AllReduced, Same>;
// Sequence parallel f: this rank's tokens -> every token (all-gather); backward, the gradient of
// every token summed over the ranks and cut to this rank's (reduce-scatter).
using GatherFromSequenceParallelFn = TensorParallelFn<TokensGathered, TokensReduceScatteredBeside>;
// Sequence parallel g: the ranks' partial sums over every token -> the sum of this rank's tokens
// (reduce-scatter); backward, every token's gradient (all-gather).
using ReduceScatterToSequenceParallelFn = TensorParallelFn<TokensReduceScattered, TokensGathered>;
// Every token, the same on every rank (the embedding's output) -> this rank's tokens; backward,
// every token's gradient gathered, so what read every token (the lookup) gets all of it.
using ScatterToSequenceParallelFn = TensorParallelFn<TokenBlock, TokensGathered>;
// This rank's tokens -> every token, for a consumer that every rank runs alike on all of them (a
// head not split by vocabulary): each rank's gradient of every token is already the whole one,
// so backward keeps this rank's block.
using GatherForReplicatedFn = TensorParallelFn<TokensGathered, TokenBlock>;

}  // namespace

torch::Tensor EnterTensorParallel(TensorParallelGroup& group, const torch::Tensor& x, bool sequence_parallel) {
  const auto handle = reinterpret_cast<int64_t>(&group);
  return sequence_parallel ? GatherFromSequenceParallelFn::apply(x, handle) : CopyToTensorParallelFn::apply(x, handle);
}

torch::Tensor LeaveTensorParallel(TensorParallelGroup& group, const torch::Tensor& x, bool sequence_parallel) {
  const auto handle = reinterpret_cast<int64_t>(&group);
  return sequence_parallel ? ReduceScatterToSequenceParallelFn::apply(x, handle) : ReduceFromTensorParallelFn::apply(x, handle);
}

torch::Tensor ScatterToSequenceParallel(TensorParallelGroup& group, const torch::Tensor& x) {
  return ScatterToSequenceParallelFn::apply(x, reinterpret_cast<int64_t>(&group));
}

torch::Tensor GatherForReplicated(TensorParallelGroup& group, const torch::Tensor& x) {
  return GatherForReplicatedFn::apply(x, reinterpret_cast<int64_t>(&group));
}

}  // namespace strata::worker
