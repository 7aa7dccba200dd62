// Tensor parallelism's activation collectives as autograd functions (internal to worker/,
// includes LibTorch): Megatron's f and g, their sequence-parallel forms, and f's backward run
// beside the weight gradients put off for it. worker/train/stage_model.h says where each is used and
// why; activations cross the ranks in their own dtype (bf16 or fp32), staged through the host
// where the communicator takes host buffers only.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/nn/fused_linear.h"
#include "worker/nn/model_family.h"
#include "worker/train/side_stream.h"

namespace strata::worker {

// How much of a rank's tensor-parallel communication ran beside its compute since construction.
struct TensorParallelOverlapCounts {
  // Weight gradients put off to an f's backward and run there: beside its collective on a GPU
  // with NCCL; after it where the device has one stream (a CPU) or the collective runs on the
  // host (ZeroMQ staging a CUDA tensor).
  int64_t weight_gradients_deferred = 0;
  // Collectives queued beside a matmul (EnterThenLinears' gathers, LinearThenLeave's chunks and
  // its backward's gather): on a GPU they run on the side stream while the compute stream
  // multiplies; on a CPU at once, in the same order.
  int64_t collectives_beside_matmuls = 0;
};

// A rank's tensor-parallel group as its autograd forms see it. One forward or backward at a time.
class TensorParallelGroup {
 public:
  // `overlap` (parallel.tp_comm_overlap, with tp > 1): f's backward runs its collective on a side
  // stream beside the weight gradients put off for it, and the forward's collectives run beside
  // the matmuls next to them (EnterThenLinears, LinearThenLeave). `announce(u)`: sink unit u's
  // gradient is complete (StageModel's gradient_ready), for the units held meanwhile (Beside).
  TensorParallelGroup(Communicator* comm, torch::Device device, bool overlap, std::function<void(int unit)> announce);

  // Where a matmul that reads f's output puts its weight gradient's write (null: no overlap).
  DeferredWeightGradients* deferred() { return side_ ? &deferred_ : nullptr; }
  // While put-off gradients run beside a collective, the units they complete are held here and
  // announced after the join: a unit's announcement may start a collective of this group (its
  // sum over the tensor-parallel ranks, optimizer.h), and one group's collectives never run on two
  // streams at once. Returns false when nothing is running beside a collective.
  bool HoldAnnouncement(int unit);
  // After each backward: the put-off writes an f's backward did not take (none today; a guard),
  // so each parameter's gradients add in the same order.
  void RunLeftovers() { deferred_.RunAll(); }
  // A backward that failed part-way: its put-off writes and held units are dropped, not run.
  void DropUnfinished();
  const TensorParallelOverlapCounts& overlap_counts() const { return counts_; }
  // Whether a collective over `t` (or tensors like it) can run beside a matmul (Ahead): the
  // overlap on, more than one rank, the communicator taking t's buffers where they are (NCCL, or
  // a CPU tensor), t in its wire dtype (bf16 or fp32: nothing to convert first).
  bool CanRunAhead(const torch::Tensor& t) const;

  Communicator& comm() { return *comm_; }
  // Runs `collective` - a collective of this group over buffers allocated before it - beside the
  // weight gradients put off since the last call: on the side stream while they run on the
  // compute stream, which then waits for it. With nothing put off, or no side stream, it runs
  // here.
  void Beside(const std::function<void()>& collective);
  // A collective beside a matmul, on the side stream after the compute stream's work so far (the
  // rows it reads); `keep` (what it reads or writes that the caller may drop first) lives until
  // Join. Only where CanRunAhead. No other collective of this group - Beside, a unit's
  // announcement - may start before the Join (checked).
  void Ahead(const std::function<void()>& collective, std::vector<torch::Tensor> keep);
  // The compute stream waits for every Ahead collective so far (a no-op when none is pending).
  void Join();

 private:
  Communicator* comm_;
  std::unique_ptr<SideStream> side_;
  DeferredWeightGradients deferred_;
  std::function<void(int unit)> announce_;
  bool holding_ = false;
  std::vector<int> held_;
  bool ahead_pending_ = false;
  std::shared_ptr<SideStream::Done> ahead_;  // the last Ahead collective's end (null on a CPU)
  std::vector<torch::Tensor> ahead_keep_;
  TensorParallelOverlapCounts counts_;
};

// Megatron's f before the split matmuls: identity forward, its gradient all-reduced backward
// (beside the put-off weight gradients). Sequence parallel: this rank's tokens -> every token
// (all-gather), backward reduce-scattered back to this rank's tokens.
torch::Tensor EnterTensorParallel(TensorParallelGroup& group, const torch::Tensor& x, bool sequence_parallel);
// Megatron's g after them: the ranks' partial sums all-reduced forward, identity backward.
// Sequence parallel: reduce-scattered to this rank's tokens, backward all-gathered.
torch::Tensor LeaveTensorParallel(TensorParallelGroup& group, const torch::Tensor& x, bool sequence_parallel);
// EnterTensorParallel(x), then p.Linear of it for each projection, in order. Overlapped under
// sequence parallelism (the group overlapping, its buffers on the device or a CPU, x in its wire
// dtype, the first matrix read through a gradient sink - a ZeRO-3 shard's slot too): the gather
// runs on the side stream while the first matmul multiplies this rank's own tokens, already in
// place (RowsAhead); the other rows wait for it. The first matmul runs over two blocks of rows,
// which a GPU may round otherwise than the whole (bf16 on an H200 did not; fp32 in the last bit).
std::vector<torch::Tensor> EnterThenLinears(TensorParallelGroup& group, const ParamView& p, const torch::Tensor& x,
                                            const std::vector<ProjectionName>& projections, bool sequence_parallel);
// LeaveTensorParallel(p.Linear(y, weight)) for a row-parallel matrix. Overlapped (the group
// overlapping, its buffers on the device or a CPU, the matrix bf16 or fp32 and read through a
// gradient sink, grad mode on): the matmul runs in chunks of rows, and each chunk's sum
// over the ranks (its share of every rank's tokens under sequence parallelism, so that each
// chunk's reduce-scatter lands in one contiguous block of this rank's) runs on the side stream
// while the next chunk multiplies. Backward as the two ops in turn, but that under sequence
// parallelism the gather of every token's gradient runs beside the own tokens' dx.
torch::Tensor LinearThenLeave(TensorParallelGroup& group, const ParamView& p, const torch::Tensor& y,
                              const std::string& weight, bool sequence_parallel);
// Every token, the same on every rank (the embedding's output) -> this rank's tokens; backward,
// every token's gradient gathered, so what read every token (the lookup) gets all of it.
torch::Tensor ScatterToSequenceParallel(TensorParallelGroup& group, const torch::Tensor& x);
// This rank's tokens -> every token, for a consumer that every rank runs alike on all of them (a
// head not split by vocabulary): each rank's gradient of every token is already the whole one,
// so backward keeps this rank's block.
torch::Tensor GatherForReplicated(TensorParallelGroup& group, const torch::Tensor& x);
// x summed over the ranks (all-reduce), and its gradient summed too: for a statistic each rank
// takes over its part of a split dimension and every rank then uses whole (each rank's use of
// the sum contributes to the loss, so the sum's gradient is the sum of theirs).
torch::Tensor SumOverTensorParallelRanks(TensorParallelGroup& group, const torch::Tensor& x);

}  // namespace strata::worker
