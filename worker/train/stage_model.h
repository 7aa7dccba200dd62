// One rank's part of a model under a dp x pp x tp mesh (internal to worker/, includes LibTorch):
// the layers of its pipeline stage (plus the embedding on the first stage, the final norm and
// head on the last), each sliced for its tensor-parallel rank (shard/layout.h), as flat fp32
// parameter units.
//
// A unit (param_unit.h) is what is gathered, sharded and updated together: the embedding, one
// block, the head. Each parameter is a leaf aliasing its range of the flat tensor, with its .grad
// preset to its range of the gradient buffer: autograd adds into the buffer in place (as
// Megatron's contiguous gradient buffer).
//
// A call runs a function over some units in one of three ways:
//   direct        autograd records everything (activations of the call are kept);
//   recomputed    the forward runs without a graph, keeping only its input; in backward it runs
//                 again with a graph and is differentiated at once (activation recompute; LibTorch
//                 C++ has no checkpoint helper);
//   ZeRO-3        the units are held as this rank's 1/dp shard only (zero3_shards.h). Without
//                 recompute (FSDP's schedule) the call runs through Zero3Shards: each unit
//                 gathered for the forward, its memory freed and gathered again for the
//                 backward, its gradient reduce-scattered into the shard's, on a side stream;
//                 host-streamed units ([parallel] offload = "optimizer+params") keep the shard in
//                 pinned host memory. With recompute: as recomputed, the forward all-gathers fp32
//                 and drops it, the backward all-gathers again, recomputes, and reduce-scatters.
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
// partial gradient (ParamUnit::tp_partial), summed over the tensor-parallel ranks.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "shard/layout.h"
#include "spec/run_spec.h"
#include "worker/comm/communicator.h"
#include "worker/nn/model_family.h"
#include "worker/train/param_unit.h"
#include "worker/train/tensor_parallel.h"
#include "worker/train/tensor_transfer.h"
#include "worker/train/zero3_shards.h"

namespace strata::worker {

struct HeadGradient;  // fused_loss.h

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
  // Under LoRA (spec.lora) the units hold only the adapters (filled through `load`), and the base
  // - every parameter of the table - is frozen (FrozenPart): filled through `base_load`, held in
  // the compute dtype (bf16 matrices on a bf16 CUDA run), read through no gradient sink.
  StageModel(const RunSpec& spec, const shard::MeshShape& mesh, const shard::MeshPosition& position,
             const WeightLoader& load, torch::Device device, Groups groups, const WeightLoader& base_load = nullptr);
  ~StageModel();

  // The frozen base parameters of a LoRA run this rank holds, by the model's names (empty
  // otherwise): the units are only the adapters.
  std::vector<std::pair<std::string, torch::Tensor>> frozen_parameters() const;

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
  void SetBeforeUse(std::function<void(size_t unit)> hook) {
    if (zero3_) zero3_->SetBeforeUse(hook);
    before_use_ = std::move(hook);
  }
  // Host-streamed units (ParamUnit::on_host): `hook(u, g)` takes a use's reduced gradient of unit
  // u's shard (fp32 on the device, on the side stream: the hook queues its copy on the stream
  // current when it is called, and the copy keeps `g`'s memory alive - not its contents: `g` must
  // not be a buffer the caller reuses).
  void SetHostGradient(std::function<void(size_t unit, const torch::Tensor& grad)> hook) {
    if (zero3_) zero3_->SetHostGradient(std::move(hook));
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
  int64_t unit_gathers() const { return zero3_ ? zero3_->unit_gathers() : 0; }

 private:
  struct Call;
  using CallFn = Zero3Shards::CallFn;
  friend struct UnitCallFunction;

  void AddUnit(const std::string& label, const std::vector<std::string>& names,
               const std::map<std::string, model::Parameter>& table, bool tied_copy, const WeightLoader& load);
  torch::Tensor Run(const std::vector<int>& units, const torch::Tensor& x, CallFn fn, bool recompute,
                    bool matmul_weights = true);
  // ZeRO-3's embedding call with its tables read from the shards (zero3_shards.h).
  torch::Tensor EmbedFromShards(const torch::Tensor& tokens);
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
  // The head's weight with its rows padded to a multiple of 64 (stage_model.cc says why).
  torch::Tensor PaddedHeadWeight(const ParamView& p, HeadGradient* into = nullptr) const;
  // A unit's parameters for the family, names relative to `strip`, and (LoRA) the frozen part
  // `frozen` of the base beside them.
  struct FrozenPart {
    std::vector<std::string> names;
    std::vector<torch::Tensor> tensors;  // undefined where nf4 holds the matrix
    // QLoRA (lora.base = "nf4"): the block's matrices as NF4, one per name (null: dense); empty
    // otherwise.
    std::vector<std::shared_ptr<Nf4Weight>> nf4;
  };
  ParamView ViewOfUnit(const std::vector<int>& units, const std::vector<std::vector<torch::Tensor>>& tensors,
                       const std::string& strip = "", const FrozenPart* frozen = nullptr);
  // LoRA (stage_model_lora.cc): the adapters of layers [first, last) as units (filled through
  // `load`) and the frozen base of this rank (through `base_load`).
  void BuildLoraUnits(std::map<std::string, model::Parameter> table, int64_t first, int64_t last,
                      const WeightLoader& load, const WeightLoader& base_load);
  // LoRA: the frozen base of this rank, `names` loaded through `load` onto the device.
  // `quantize`: its matrices are stored as NF4 (QLoRA's blocks).
  Result<FrozenPart> LoadFrozen(const std::vector<std::string>& names,
                                const std::map<std::string, model::Parameter>& table, const WeightLoader& load,
                                bool quantize = false);

  RunSpec spec_;
  shard::MeshShape mesh_;
  shard::MeshPosition position_;
  torch::Device device_;
  Groups groups_;
  std::vector<ParamUnit> units_;
  // LoRA: the frozen base of the embedding, of each of this stage's blocks, and of the head
  // (final norm and head weight); LoraCompute for the views.
  FrozenPart frozen_embed_, frozen_head_;
  std::vector<FrozenPart> frozen_blocks_;
  LoraCompute lora_;
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
  // parallel.zero = 3: the shards and their gathers (null otherwise).
  std::unique_ptr<Zero3Shards> zero3_;
  std::deque<GradSlot> slots_;       // one per parameter of a sink unit; stable addresses (the sink's handles)
  std::vector<int64_t> slot_begin_;  // per unit: the index of its first parameter's slot
  std::function<void(size_t unit)> before_use_;
  std::function<void(size_t unit)> gradient_ready_;
  bool working_copies_ = false;  // a bf16 run on a GPU: matmuls read bf16 working weights
  int64_t forwards_expected_ = 0, forwards_done_ = 0;
  // Sink unit u complete for this step (BeginGradients): called by GradSlot::Write.
  void MaybeGradientReady(int u);
};

}  // namespace strata::worker
