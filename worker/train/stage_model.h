// One rank's part of a model under a dp x pp x tp mesh (internal to worker/, includes LibTorch):
// the layers of its pipeline stage (plus the embedding on the first stage, the final norm and
// head on the last), each sliced for its tensor-parallel rank (shard/layout.h), as flat fp32
// parameter units.
//
// A unit is what is gathered, sharded and updated together: the embedding, one block, the head.
// Its parameters live in one flat tensor and their gradients in another, so a unit costs one
// collective and ZeRO shards are plain ranges. Each parameter is a leaf aliasing its range of
// the flat tensor, with its .grad preset to its range of the gradient buffer: autograd adds into
// the buffer in place (as Megatron's contiguous gradient buffer).
//
// A call runs a function over some units in one of three ways:
//   direct        autograd records everything (activations of the call are kept);
//   recomputed    the forward runs without a graph, keeping only its input; in backward it runs
//                 again with a graph and is differentiated at once (activation recompute; LibTorch
//                 C++ has no checkpoint helper);
//   ZeRO-3        the units are held as this rank's 1/dp shard only. Without recompute (FSDP's
//                 schedule): the forward all-gathers a unit in the compute dtype (bf16 from the
//                 shard's working copy on a bf16 GPU run, else fp32) into a buffer of its own,
//                 runs it as a direct call, and frees the buffer's memory, keeping the tensor
//                 that autograd saved; the backward fills it again with a second gather before
//                 the call's first gradient, and once every parameter of the unit has its
//                 gradient, reduce-scatters the unit's fp32 gradient into the shard's and frees
//                 both. Gathers and reduce-scatters run on a side stream (side_stream.h): the next
//                 call's gather is queued before this call's compute (forward) and the previous
//                 call's before this call's gradients (backward); the stage's last call keeps its
//                 gather into the backward, which starts with it, and so do the stage's last
//                 parallel.keep_gathered layers (no second gather; their memory is held from
//                 forward to backward, per micro-batch in flight). Vectors (norms, biases) are read
//                 in fp32, widened from the gathered bf16 (FSDP's param_dtype convention). On
//                 one tensor-parallel rank without recompute the embedding call gathers no table
//                 where that moves fewer bytes: each rank looks up the rows its shard holds for
//                 every rank's ids, and the lookups are reduce-scattered (stage_model_lookup.cc;
//                 a tied head still gathers its table); otherwise the lookup gathers fp32.
//                 With recompute: as recomputed, the forward
//                 all-gathers fp32 and drops it, the backward all-gathers again, recomputes, and
//                 reduce-scatters.
//   host-streamed ZeRO-3 ([parallel] offload = "optimizer+params", ZeRO-Infinity's schedule without
//                 NVMe): as ZeRO-3 without recompute, but the shard lives in pinned host memory
//                 (fp32, the optimizer's master copy, updated there: optimizer.h) and no gradient
//                 stays on the device: a gather uploads the shard (cast to bf16 on the device for
//                 a bf16 run) before the all-gather, and a use's reduced gradient goes to the host
//                 (the SetHostGradient hook), where the uses are summed. The device holds the
//                 gathered units in flight and the activations, nothing per parameter.
//
// Tensor parallelism inside a block (Megatron's f and g): CopyToTensorParallel is the identity
// forward and an all-reduce of the gradient backward, ReduceFromTensorParallel an all-reduce
// forward and the identity backward. With heads and MLP width split, a block costs two
// all-reduces forward and two backward. Activations cross the ranks in their own dtype: bf16 on a
// bf16 run (half the bytes of fp32; for tp = 2 the same sums as widening first), fp32 otherwise.
// Vocab-parallel (shard/layout.h: the token embedding and the head split by vocabulary rows where
// tp divides the vocabulary): the lookup sums the ranks' masked lookups (one all-reduce forward);
// the loss enters through f (its dx all-reduced in backward) and merges the ranks' row statistics
// (fused_loss.h).
//
// f's backward overlapped with the weight gradients (Megatron's overlap of the column-parallel
// input gradient's collective with the wgrad; parallel.tp_comm_overlap): the matmuls that read f's
// output (split by output rows, shard::ColumnParallel) compute dx in their backward and put dW off
// (fused_linear.h); f's backward then sums dx over the ranks on a side stream while their dW runs
// on the compute stream. Sink units only: not ZeRO-3 shards, whose slots reduce-scatter each use
// once it is complete, nor recomputed blocks, whose matmuls are plain torch::linear.
// Its forward half (tensor_parallel.h EnterThenLinears, LinearThenLeave; the families hand f its
// projections and g its matmul in one call): under sequence parallelism f's all-gather runs on
// the side stream while the first projection multiplies this rank's own tokens; g's sum runs in
// chunks of rows, each beside the next chunk's matmul (and g's backward gather beside the own
// tokens' dx). It needs a matrix read through a gradient sink: ZeRO-3's slots are, and there its
// collectives run beside ZeRO-3's own on another stream (another communicator); recomputed
// blocks are not.
//
// Sequence parallelism (Korthikanti et al. 2022, Megatron's --sequence-parallel; on where tp
// divides model.sequence and parallel.sequence_parallel is not false): between the split matmuls
// - norms, residual adds, the biases of row-parallel layers, and what pipeline stages send - a
// rank holds only its 1/tp of the tokens, a contiguous block of the flattened [b * t] tokens
// (held as [b, t / tp, hidden]). f becomes an all-gather of the tokens (a reduce-scatter in
// backward) and g a reduce-scatter (an all-gather in backward): the same bytes as the two
// all-reduces, with the elementwise work and its activations cut by tp. The embedding's output is
// cut to the rank's tokens (its gradient gathered back, so the lookup's is whole); the head
// gathers every token (vocab-parallel: through f; otherwise keeping this rank's block of the
// gradient, which every rank computes whole). Parameters read with the rank's tokens only get a
// partial gradient (ParamUnit::sequence_partial), summed over the tensor-parallel ranks.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/run_spec.h"
#include "model/parameters.h"
#include "shard/layout.h"
#include "worker/comm/communicator.h"
#include "worker/nn/model_family.h"
#include "worker/train/side_stream.h"
#include "worker/train/tensor_parallel.h"
#include "worker/train/tensor_transfer.h"

namespace strata::worker {

struct HeadGradient;  // fused_loss.h

struct ParamUnit {
  std::string label;                         // "embed", "block 3", "head", "wte (tied copy)"
  std::vector<std::string> names;            // the model's parameter names
  std::vector<std::vector<int64_t>> shapes;  // this rank's tensor-parallel slices
  std::vector<std::vector<int64_t>> full_shapes;
  std::vector<int64_t> offsets;  // of each parameter in the unit's flat vector
  std::vector<bool> replicated;  // the same on every tensor-parallel rank
  // Sequence parallel: replicated, and read with this rank's tokens only (a block's norms and the
  // biases added after its reduce-scatters, the final norm), so its gradient here is this rank's
  // tokens' part: summed over the tensor-parallel ranks before the update (optimizer.h).
  std::vector<bool> sequence_partial;
  // Split by output rows (shard::ColumnParallel). Read through ParamView::Linear, such a matrix
  // reads f's output: its weight gradient can wait for f's backward.
  std::vector<bool> column_parallel;
  int64_t numel = 0;
  int64_t shard_begin = 0, shard_end = 0;  // this data-parallel rank's range of the flat vector
  bool sharded = false;                    // ZeRO-3: `flat` holds [shard_begin, shard_end) only
  bool tied_copy = false;                  // GPT-2's wte on the last stage (the first stage's is the one counted)
  // offload = "optimizer+params": `flat` (this rank's shard) lives in pinned host memory, is no
  // autograd leaf and has no gradient of its own (each use's gradient goes to SetHostGradient).
  bool on_host = false;
  // fp32. ZeRO-3: this rank's shard, a leaf whose gradient is the shard's. Otherwise the whole
  // vector, aliased by one leaf per parameter (`params`), whose gradients are views of `grad`.
  torch::Tensor flat;
  std::vector<torch::Tensor> params;
  torch::Tensor grad;
  // Gradient sink (units that are neither ZeRO-3 shards nor recomputed, nor a one-stage tied
  // embedding, which stays with AccumulateGrad: stage_model.cc says why): every use of a
  // parameter goes through a function whose backward writes the step's first gradient of it
  // into `grad` and adds the later ones, in place of autograd's AccumulateGrad. So `grad` needs
  // no zeroing between steps, and no gradient is widened to fp32 and added to a zero buffer.
  bool sink = false;
  std::vector<int> received;  // this step's gradients per parameter so far (sink units)
  std::vector<int> uses;      // this step's forward uses per parameter so far (sink units)
  // The bf16 working copy of `flat` that the matmuls of a CUDA bf16 run read (sink units, and
  // ZeRO-3 shards without recompute, whose copy is what is gathered; refreshed after every
  // update, StageModel::RefreshWorkingWeights), in place of autograd's cast of every fp32 weight
  // at every use. Undefined otherwise.
  torch::Tensor working;
  std::vector<torch::Tensor> working_params;  // its per-parameter views, made once
};

class StageModel {
 public:
  struct Groups {
    Communicator* dp = nullptr;  // ranks with the same stage and tensor-parallel rank
    Communicator* tp = nullptr;  // ranks with the same stage and data-parallel rank
  };

  // Hands a whole parameter (on the host, in our layout, any float dtype; e.g. a view of a
  // memory-mapped file valid only during the call) to `use`. Called once per parameter this rank
  // holds a part of, one at a time, so host memory stays near one tensor beyond the units.
  // Empty: a resume is about to write every element from a checkpoint, and the units are
  // allocated on `device` uninitialised - no host copies of gigabytes overwritten at once.
  using WeightUse = std::function<void(const torch::Tensor& whole)>;
  using WeightLoader = std::function<void(const model::Parameter& whole, const WeightUse& use)>;

  // Builds this rank's units (the model's parameter table, model/parameters.h, cut for its
  // stage and tensor-parallel rank) on `device`, filled through `load`.
  StageModel(const RunSpec& spec, const shard::MeshShape& mesh, const shard::MeshPosition& position,
             const WeightLoader& load, torch::Device device, Groups groups);
  ~StageModel();

  bool first_stage() const { return position_.stage == 0; }
  bool last_stage() const { return position_.stage == mesh_.pp - 1; }
  std::vector<ParamUnit>& units() { return units_; }
  // The unit holding a tied token embedding on this rank (the first stage's, or the last
  // stage's tied copy); -1 when none.
  int first_wte_unit() const { return wte_unit_; }
  int tied_copy_unit() const { return tied_copy_unit_; }

  // tokens [b, t] -> residual stream [b, t, hidden] (first stage).
  torch::Tensor Embed(const torch::Tensor& tokens);
  // This stage's blocks.
  torch::Tensor Blocks(torch::Tensor x);
  // Residual stream -> logits [b, t, vocab] (last stage; not under a vocab-parallel mesh).
  torch::Tensor Head(const torch::Tensor& x);
  // The mean next-token cross-entropy of the head over x [b, t, hidden] against targets [b, t]
  // (fused_loss.h: logits in row chunks, never whole).
  torch::Tensor HeadLoss(const torch::Tensor& x, const torch::Tensor& targets);

  // `hook(u)` runs before any forward reads unit u's parameters (the offloaded optimizer waits
  // there for the unit's update, optimizer.h).
  void SetBeforeUse(std::function<void(size_t unit)> hook) { before_use_ = std::move(hook); }
  // Host-streamed units (ParamUnit::on_host): `hook(u, g)` takes a use's reduced gradient of unit
  // u's shard (fp32 on the device, on the side stream: the hook queues its copy on the stream
  // current when it is called, and the copy keeps `g`'s memory alive - not its contents: `g` must
  // not be a buffer the caller reuses).
  void SetHostGradient(std::function<void(size_t unit, const torch::Tensor& grad)> hook) {
    host_gradient_ = std::move(hook);
  }

  // Releases what recomputed and ZeRO-3 calls hold between forward and backward (after each
  // step, and after a step that failed part-way). With host-streamed units the host also waits
  // for the uploads from their shards, which the optimizer writes next.
  void EndStep();
  // Around one step's forwards and backwards (inside its CUDA graph when there is one): the
  // gradient sink starts counting, and at the end a parameter that received no gradient (none is
  // unused today; a guard) gets a zero one. `forwards`: the step's forwards on this rank; after
  // the last of them has run (ForwardDone), a sink unit whose every parameter has received as
  // many gradients as it had uses is complete, and `gradient_ready(u)` runs (on the thread
  // running the backward, after the unit's last gradient was queued on the device's stream).
  void BeginGradients(int64_t forwards);
  void ForwardDone() { ++forwards_done_; }
  void SetGradientReady(std::function<void(size_t unit)> hook) { gradient_ready_ = std::move(hook); }
  // ZeRO-3 without recompute: also reduce-scatters what a call's backward left incomplete, and
  // the compute stream waits for every reduce-scatter into the shards' gradients.
  void FinishGradients();
  // Copies the fp32 weights into the bf16 working copies (after an update, a load or a resume),
  // but for units whose `fresh[u]` is true (the update wrote their copy itself).
  void RefreshWorkingWeights(const std::vector<bool>& fresh = {});
  // After each backward of the step: the weight gradients put off for an f's backward that did not
  // come (none today; a guard) are written, so each parameter's gradients add in the same order.
  void EndBackward();
  // Tensor-parallel communication run beside the compute (parallel.tp_comm_overlap) since
  // construction (tensor_parallel.h).
  const TensorParallelOverlapCounts& tp_overlap_counts() const;
  // ZeRO-3: whole units gathered since construction (a forward's and a backward's count apart);
  // parallel.keep_gathered lowers it by one per kept layer and micro-batch.
  int64_t unit_gathers() const { return unit_gathers_; }

 private:
  struct Call;
  struct ShardedCall;
  // Where a parameter's gradient of one ZeRO-3 use goes: its view of the use's fp32 gradient
  // buffer (the whole unit's length), written by the first gradient and added to by the rest; once
  // every counted use has arrived, the use is reduce-scattered (stage_model_zero3.cc).
  class ShardSlot final : public GradientSink {
   public:
    ShardSlot(StageModel* model, ShardedCall* call, size_t use, size_t param)
        : model_(model), call_(call), use_(use), param_(param) {}
    torch::Tensor Use(const torch::Tensor& param, const torch::Tensor& value) override;
    void CountUse() override;
    void Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) override;
    // A counted use whose backward brought no gradient.
    void Skip();

   private:
    StageModel* model_;
    ShardedCall* call_;
    size_t use_;
    size_t param_;
  };
  // The slots of the ZeRO-3 call running now (RunSharded), which ViewOfUnit hands out: per unit
  // of the call, one per parameter.
  struct ShardedView {
    const std::vector<int>* units = nullptr;
    std::vector<std::vector<ShardSlot*>> slots;
  };
  friend struct RegatherOnBackward;
  friend struct ShardedWeightFunction;
  friend struct ShardRowsFunction;
  using CallFn =
      std::function<torch::Tensor(const torch::Tensor& x, const std::vector<std::vector<torch::Tensor>>& views)>;
  friend struct UnitCallFunction;

  void AddUnit(const std::string& label, const std::vector<std::string>& names,
               const std::map<std::string, model::Parameter>& table, bool tied_copy, const WeightLoader& load);
  torch::Tensor Run(const std::vector<int>& units, const torch::Tensor& x, CallFn fn, bool recompute,
                    bool matmul_weights = true);
  // ZeRO-3 without recompute (the header): a call over sharded units.
  torch::Tensor RunSharded(const std::vector<int>& units, const torch::Tensor& x, const CallFn& fn,
                           bool matmul_weights);
  // The units the forward reads after `units` on this stage (empty after the last), and whether
  // that call reads bf16 working weights.
  std::pair<std::vector<int>, bool> NextCall(const std::vector<int>& units) const;
  // Unit u whole into `full` (allocated on the compute stream, numel elements) in its dtype: bf16
  // from the shard's working copy, fp32 from the shard; on the side stream.
  // A forward's gather also widens the unit's vectors into `wide` (WideBuffer; undefined: none).
  std::shared_ptr<SideStream::Done> GatherInto(int u, const torch::Tensor& full, torch::Tensor wide = {});
  // GatherInto's collective (and a host shard's upload), on the side stream.
  void GatherOnSide(const ParamUnit& unit, const torch::Tensor& shard, torch::Tensor& target);
  // Queues the gathers of `units` for the next call (their buffers kept in prefetched_).
  void Prefetch(const std::vector<int>& units, bool bf16);
  // ZeRO-3's embedding call without its tables gathered (stage_model_lookup.cc): whether this
  // stage's embedding units allow it (one tensor-parallel rank, no recompute, one table each),
  // whether a call over `tokens` moves fewer bytes so than gathering, the call, and its forward
  // and backward for one table (unit u) and ids: this rank's ids' rows (`saved` gets every rank's
  // ids, and buffers for their stable sort, for the backward), and the rows' gradient added into
  // the shard's. The sorts are queued after the first block's gathers (SortLookups).
  struct LookedUpIds {
    torch::Tensor ids, sorted, order;  // every rank's ids; sorted = ids[order], filled on the side stream
  };
  bool CanLookUpShards() const;
  bool LooksUpShards(const torch::Tensor& tokens) const;
  torch::Tensor EmbedFromShards(const torch::Tensor& tokens);
  torch::Tensor LookUpShardRows(int u, const torch::Tensor& ids, LookedUpIds* saved);
  void SortLookups();
  void AddShardRowsGradient(int u, const LookedUpIds& saved, const torch::Tensor& grad);
  // Before a ZeRO-3 call's backward: its units gathered again (waited for), and the call before
  // it in the same micro-batch queued.
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
  // At the end of the step's backwards: what a call left incomplete is reduce-scattered, and the
  // compute stream waits for every reduce-scatter.
  void FinishShardedGradients();
  // What unit u's forward reads: bf16 working copies for matrices when `matmul_weights` and the
  // unit has them, else the parameters. For a sink unit, ViewOfUnit hands them out through its
  // slots (a use counted per access).
  std::vector<torch::Tensor> UnitValues(int u, bool matmul_weights) const;
  // Where one parameter's gradient goes: its view of the unit's gradient buffer (shaped as the
  // parameter), the unit's counts of its uses and of the gradients received this step.
  class GradSlot final : public GradientSink {
   public:
    GradSlot(torch::Tensor grad, int* received, int* uses, StageModel* model, int unit)
        : grad_(std::move(grad)), received_(received), uses_(uses), model_(model), unit_(unit) {}
    torch::Tensor Use(const torch::Tensor& param, const torch::Tensor& value) override;
    void CountUse() override { ++*uses_; }
    void Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) override;

   private:
    torch::Tensor grad_;
    int* received_;
    int* uses_;
    StageModel* model_;
    int unit_;
  };
  std::vector<torch::Tensor> ViewsOf(const ParamUnit& unit, const torch::Tensor& full_flat) const;
  // The head's weight with its rows padded to a multiple of 64 (stage_model.cc says why).
  torch::Tensor PaddedHeadWeight(const ParamView& p, HeadGradient* into = nullptr) const;
  // A unit's parameters for the family, names relative to `strip`.
  ParamView ViewOfUnit(const std::vector<int>& units, const std::vector<std::vector<torch::Tensor>>& tensors,
                       const std::string& strip = "");

  RunSpec spec_;
  shard::MeshShape mesh_;
  shard::MeshPosition position_;
  torch::Device device_;
  Groups groups_;
  std::vector<ParamUnit> units_;
  std::vector<int> embed_units_, block_units_, head_units_;
  int64_t first_layer_ = 0;
  int wte_unit_ = -1, tied_copy_unit_ = -1;
  std::unique_ptr<ModelFamily> family_;
  // Sequence parallel (shard::SequenceParallel): between the split matmuls each tensor-parallel
  // rank holds 1/tp of the tokens (below).
  bool sequence_parallel_ = false;
  TensorParallel tensor_parallel_;
  // The autograd forms' group (tensor_parallel.h). A backward that failed part-way leaves its
  // put-off weight gradients and held announcements there: EndStep and BeginGradients drop them,
  // so the step's replay starts clean.
  std::unique_ptr<TensorParallelGroup> tp_group_;
  // Vocab-parallel: this rank's rows [vocab_begin_, vocab_begin_ + vocab_rows_) of the token
  // embedding and the head (vocab_rows_ = the whole vocabulary otherwise).
  bool vocab_parallel_ = false;
  int64_t vocab_begin_ = 0, vocab_rows_ = 0;
  std::deque<std::shared_ptr<Call>> calls_;
  // ZeRO-3 without recompute: this step's calls in forward order, the gathers queued for the next
  // call (by unit), and the side stream they run on.
  std::vector<std::shared_ptr<ShardedCall>> sharded_calls_;
  std::vector<std::pair<std::vector<int>, bool>> call_order_;  // this stage's calls in forward order (NextCall)
  struct Prefetched {
    torch::Tensor full;
    torch::Tensor wide;  // its vectors widened (GatherInto)
    std::shared_ptr<SideStream::Done> ready;
  };
  std::map<int, Prefetched> prefetched_;
  std::deque<std::deque<ShardSlot>> shard_slots_;  // the gradient handles of this step's calls (stable addresses)
  const ShardedView* sharded_view_ = nullptr;      // set while a ZeRO-3 call's forward runs
  std::vector<int> unit_reductions_;               // per unit: ZeRO-3 uses reduce-scattered this step
  bool looks_up_shards_ = false;                   // CanLookUpShards, decided once built
  std::vector<LookedUpIds> unsorted_lookups_;      // this call's lookups, until SortLookups
  // ZeRO-3 uses' fp32 gradient buffers, reused across uses and steps (TakeGradBuffer).
  struct GradBuffer {
    torch::Tensor buffer;
    std::shared_ptr<SideStream::Done> done;  // the last reduce-scatter that read it
    bool busy = false;                       // a use's gradient is in it
    int64_t released = 0;                    // when it was last freed (releases_ then); 0: not this step
  };
  std::vector<GradBuffer> grad_buffers_;
  int64_t releases_ = 0;  // buffers freed this step
  std::unique_ptr<SideStream> side_;
  std::deque<GradSlot> slots_;       // one per parameter of a sink unit; stable addresses (the sink's handles)
  std::vector<int64_t> slot_begin_;  // per unit: the index of its first parameter's slot
  std::function<void(size_t unit)> before_use_;
  std::function<void(size_t unit)> gradient_ready_;
  std::function<void(size_t unit, const torch::Tensor& grad)> host_gradient_;
  bool working_copies_ = false;  // a bf16 run on a GPU: matmuls read bf16 working weights
  // Host-streamed units: what their gathered parameters' gradient functions take as their autograd
  // input, in place of the shard (a host tensor, no leaf): a device scalar that needs a gradient.
  torch::Tensor host_anchor_;
  int64_t forwards_expected_ = 0, forwards_done_ = 0;
  int64_t unit_gathers_ = 0;
  // ZeRO-3 without recompute: whether a call over `units` keeps its gathered memory for its
  // backward (one of the stage's last parallel.keep_gathered layers).
  bool KeepsGathered(const std::vector<int>& units) const;
  // Sink unit u complete for this step (BeginGradients): called by GradSlot::Write.
  void MaybeGradientReady(int u);
};

}  // namespace strata::worker
