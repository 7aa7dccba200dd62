// ZeRO-3 on one rank (Rajbhandari et al. 2020; FSDP's schedule): every parameter unit
// (param_unit.h) is held as this rank's 1/dp shard, gathered whole for each call that reads it and
// its gradient reduce-scattered back into the shard's. StageModel (stage_model.h) runs its calls
// through here when parallel.zero = 3 and recompute is off; this class owns the shards' in-flight
// state: the gathered buffers, the gradient slots and buffers, the side stream the collectives
// run on, and the embedding's lookups from the shards.
//
// Per call and sharded unit u, with n = u's length and s its shard on this rank:
//   forward    full <- all-gather(working shard, bf16) or all-gather(fp32 shard)   [side stream,
//              queued by the call before]; y = f(x, views of full); free full's memory
//   backward   refill full, all-gather again [side stream; the call before it queued next]; the
//              gradients of f's parameters are written into g (fp32, n; a matmul's weight
//              gradient by the matmul itself, fused_linear.h); once all have:
//              shard gradient += reduce-scatter(g)[s]   [side stream]; free g and full
// The compute stream waits for a gather only before it reads it, and for the reduce-scatters at
// the end of the step's backwards (FinishGradients). The stage's last call keeps its gather into
// the backward, which starts with it, and so do the stage's last parallel.keep_gathered layers
// (no second gather; their memory is held from forward to backward, per micro-batch in flight).
// Vectors (norms, biases) are read in fp32, widened from a bf16 gather (FSDP's param_dtype).
//
// Host-streamed units (offload = "optimizer+params", ZeRO-Infinity's schedule without NVMe): the
// shard lives in pinned host memory (the optimizer's fp32 master); a gather uploads it first and a
// use's reduced gradient goes to the host (SetHostGradient).
//
// The embedding's lookup can read the shards in place instead of gathering its tables
// (zero3_lookup.cc has the maths and when it moves fewer bytes).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/nn/fused_linear.h"
#include "worker/train/param_unit.h"
#include "worker/train/side_stream.h"

namespace strata::worker {

class Zero3Shards {
 public:
  // A call's function: the input and, per unit of the call, its parameters' values.
  using CallFn =
      std::function<torch::Tensor(const torch::Tensor& x, const std::vector<std::vector<torch::Tensor>>& views)>;
  struct Layout {
    std::vector<int> embed_units, block_units;
    // The stage's calls in forward order, and whether each reads bf16 working weights.
    std::vector<std::pair<std::vector<int>, bool>> call_order;
    int64_t keep_gathered = 0;    // parallel.keep_gathered
    bool working_copies = false;  // a bf16 run on a GPU: matmuls read bf16
    // The mesh allows the embedding's lookups from the shards (one tensor-parallel rank, the
    // first stage, no recompute); the tables' shapes are checked here.
    bool lookups_allowed = false;
  };

  // `units` is the stage's (every one sharded); it outlives this.
  Zero3Shards(std::vector<ParamUnit>& units, Communicator& dp, torch::Device device, Layout layout);
  ~Zero3Shards();

  // `hook(u)` runs before a gather reads unit u's shard (the offloaded optimizer's wait).
  void SetBeforeUse(std::function<void(size_t unit)> hook) { before_use_ = std::move(hook); }
  // Host-streamed units: where a use's reduced gradient of unit u's shard goes (stage_model.h).
  void SetHostGradient(std::function<void(size_t unit, const torch::Tensor& grad)> hook) {
    host_gradient_ = std::move(hook);
  }

  // A call over `units` (ZeRO-3 without recompute): gathered, `fn` run over the gathered views,
  // the memory freed or kept for the backward. `micro_batch`: forwards done before it this step.
  torch::Tensor Run(const std::vector<int>& units, const torch::Tensor& x, const CallFn& fn, bool matmul_weights,
                    int64_t micro_batch);
  // While Run's `fn` runs with gradients on: the sink of parameter `param` of `unit` (one of the
  // call's units), and the tensor its autograd node takes as input (the shard, or a host anchor).
  bool running() const { return running_ != nullptr; }
  GradientSink* SlotOf(int unit, size_t param) const;
  const torch::Tensor& AutogradInput(const ParamUnit& unit) const { return unit.on_host ? host_anchor_ : unit.flat; }

  // The embedding's lookups from the shards: whether a call over `tokens` uses them; the rows of
  // `ids` in unit u's table (an autograd function of the shard); and after the embedding's
  // lookups, the first block's gathers queued and then the ids' sorts that the backward reads.
  bool LooksUpRows(const torch::Tensor& tokens) const;
  torch::Tensor LookUpRows(int u, const torch::Tensor& ids);
  void AfterLookups();

  // Around a step's backwards: the shards' reductions counted from zero; at the end what a
  // call's backward left incomplete is reduce-scattered, and the compute stream waits for every
  // reduce-scatter.
  void BeginGradients();
  void FinishGradients();
  // After each step (and a step that failed part-way): nothing in flight, nothing held.
  void EndStep();
  // Whole units gathered since construction (a forward's and a backward's count apart).
  int64_t unit_gathers() const { return unit_gathers_; }

 private:
  struct ShardedCall;
  // Where a parameter's gradient of one use goes: its view of the use's fp32 gradient buffer (the
  // whole unit's length), written by the first gradient and added to by the rest; once every
  // counted use has arrived, the use is reduce-scattered.
  class ShardSlot final : public GradientSink {
   public:
    ShardSlot(Zero3Shards* shards, ShardedCall* call, size_t use, size_t param)
        : shards_(shards), call_(call), use_(use), param_(param) {}
    torch::Tensor Use(const torch::Tensor& param, const torch::Tensor& value) override;
    void CountUse() override;
    void Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) override;
    // A counted use whose backward brought no gradient.
    void Skip();

   private:
    Zero3Shards* shards_;
    ShardedCall* call_;
    size_t use_;
    size_t param_;
  };
  // The slots of the call running now: per unit of the call, one per parameter.
  struct RunningCall {
    const std::vector<int>* units = nullptr;
    std::vector<std::vector<ShardSlot*>> slots;
  };
  // A lookup's ids: every rank's, and their stable sort (sorted = ids[order], on the side stream).
  struct LookedUpIds {
    torch::Tensor ids, sorted, order;
  };
  friend struct RegatherOnBackward;
  friend struct ShardedWeightFunction;
  friend struct ShardRowsFunction;

  // The units the forward reads after `units` on this stage (empty after the last), and whether
  // that call reads bf16 working weights.
  std::pair<std::vector<int>, bool> NextCall(const std::vector<int>& units) const;
  // Whether a call over `units` keeps its gathered memory for its backward (one of the stage's
  // last parallel.keep_gathered layers).
  bool KeepsGathered(const std::vector<int>& units) const;
  // Unit u whole into `full` (numel elements, allocated on the compute stream) in its dtype: bf16
  // from the shard's working copy, fp32 from the shard; on the side stream. A forward's gather also
  // widens the unit's vectors into `wide` (undefined: none).
  std::shared_ptr<SideStream::Done> GatherInto(int u, const torch::Tensor& full, torch::Tensor wide = {});
  // GatherInto's collective (and a host shard's upload), on the side stream.
  void GatherOnSide(const ParamUnit& unit, const torch::Tensor& shard, torch::Tensor& target);
  // Queues the gathers of `units` for the next call (their buffers kept in prefetched_).
  void Prefetch(const std::vector<int>& units, bool bf16);
  // Before a call's backward: its units gathered again (waited for), and the call before it in the
  // same micro-batch queued.
  void Regather(ShardedCall& call, bool wait);
  // Unit u's next contribution to its shard's gradient this step: the shard's gradient (made on
  // the first, on the device; undefined for a host-streamed unit) and whether it is the step's
  // first (written, not added). Then, on the side stream, this rank's `part` put there.
  struct ShardGradient {
    torch::Tensor sum;
    bool first = false;
  };
  ShardGradient NextShardGradient(size_t u, const torch::TensorOptions& options);
  void AddToShardGradient(size_t u, const ShardGradient& to, const torch::Tensor& part);
  // Every parameter of the call's k-th unit has its gradient: reduce-scatter it into the shard's.
  void ReduceScatterUse(ShardedCall& call, size_t k);
  // A free gradient buffer at least as long as the use's unit (or a new one) for the use; the
  // calling stream waits until the reduce-scatter that read it last is done.
  void TakeGradBuffer(ShardedCall& call, size_t k);
  // The lookups (zero3_lookup.cc): this rank's ids' rows of unit u's table (`saved` gets every
  // rank's ids, and buffers for their sort), the rows' gradient added into the shard's, the sorts.
  bool CanLookUpRows() const;
  torch::Tensor LookUpShardRows(int u, const torch::Tensor& ids, LookedUpIds* saved);
  void AddShardRowsGradient(int u, const LookedUpIds& saved, const torch::Tensor& grad);
  void SortLookups();

  std::vector<ParamUnit>& units_;
  Communicator& dp_;
  torch::Device device_;
  Layout layout_;
  std::unique_ptr<SideStream> side_;
  std::function<void(size_t unit)> before_use_;
  std::function<void(size_t unit, const torch::Tensor& grad)> host_gradient_;
  // Host-streamed units: what their gathered parameters' gradient functions take as their autograd
  // input, in place of the shard (a host tensor, no leaf): a device scalar that needs a gradient.
  torch::Tensor host_anchor_;
  bool looks_up_rows_ = false;  // CanLookUpRows, decided once built

  // This step's calls in forward order, the gathers queued for the next call (by unit).
  std::vector<std::shared_ptr<ShardedCall>> calls_;
  struct Prefetched {
    torch::Tensor full;
    torch::Tensor wide;  // its vectors widened (GatherInto)
    std::shared_ptr<SideStream::Done> ready;
  };
  std::map<int, Prefetched> prefetched_;
  std::deque<std::deque<ShardSlot>> slots_;    // the gradient handles of this step's calls (stable addresses)
  const RunningCall* running_ = nullptr;       // set while a call's forward runs
  std::vector<int> unit_reductions_;           // per unit: uses reduce-scattered this step
  std::vector<LookedUpIds> unsorted_lookups_;  // this call's lookups, until SortLookups
  // Uses' fp32 gradient buffers, reused across uses and steps (TakeGradBuffer).
  struct GradBuffer {
    torch::Tensor buffer;
    std::shared_ptr<SideStream::Done> done;  // the last reduce-scatter that read it
    bool busy = false;                       // a use's gradient is in it
    int64_t released = 0;                    // when it was last freed (releases_ then); 0: not this step
  };
  std::vector<GradBuffer> grad_buffers_;
  int64_t releases_ = 0;  // buffers freed this step
  int64_t unit_gathers_ = 0;
};

}  // namespace strata::worker
