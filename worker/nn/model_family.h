// The model-family interface (internal to worker/, includes LibTorch): what one family computes,
// written once and used by every path that runs a model - training under any mesh (StageModel,
// with its tensor-parallel hooks), activation capture and export (CausalLm, tp = 1).
//
// A family computes on parameters it is handed, not on parameters it owns: a ParamView maps the
// names of one unit (the embedding, one block relative to its prefix, the final norm) to
// tensors, which are a CausalLm's own parameters, a rank's tensor-parallel slices, or ZeRO-3's
// gathered copies. Names and shapes come from model/parameters.h.
//
// Tensor parallelism (Megatron's f and g): `enter_linears` is f before the column-parallel
// matmuls (identity forward, all-reduce of the gradient) and the matmuls themselves,
// `linear_leave` a row-parallel matmul and g after it (all-reduce forward); biases of
// row-parallel layers are added after it. Under tp, a block sees heads / tp query and kv_heads /
// tp key/value heads and ffn / tp MLP columns; at tp = 1 both are plain linears. Under sequence
// parallelism (stage_model.h) a block's input holds 1/tp of the tokens: f gathers every token and
// g returns to the rank's, so a block takes its attention's batch and length from what
// `enter_linears` returns, never from its input.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "spec/run_spec.h"
#include "worker/nn/block_io.h"
#include "worker/nn/fused_linear.h"
#include "worker/nn/nf4_linear.h"

namespace strata::worker {

// A parameter a ParamView hands out through a gradient sink (StageModel's, fused_linear.h): the
// tensor the op reads (the parameter or its bf16 working copy) and the parameter itself. Each
// access counts a use with the sink: operator() once per view (autograd sums the view's uses
// before the sink sees them), Linear once per call (its matmul writes the gradient itself).
struct SunkParameter {
  torch::Tensor param;
  GradientSink* sink = nullptr;
  // A matrix read through Linear: where its weight gradient waits for f's backward (null: at once).
  DeferredWeightGradients* defer = nullptr;
};

// Rows of a table for ids of any shape (ids' shape + [columns]): torch::embedding's form.
using TableLookup = std::function<torch::Tensor(const torch::Tensor& table, const torch::Tensor& ids)>;
torch::Tensor PlainLookup(const torch::Tensor& table, const torch::Tensor& ids);

// LoRA on the linears a view holds adapters for (run_spec.h LoraSpec): Linear adds
// scale * (dropout(x) A^T) B^T to x W^T + b where the view has "<stem>.lora_A.weight" and
// "<stem>.lora_B.weight" beside "<stem>.weight". Dropout only while grad mode is on (training).
struct LoraCompute {
  double scale = 1.0;
  double dropout = 0.0;
};

class ParamView {
 public:
  // Rows of the table `name` for ids, where the view holds no tensor of it (ZeRO-3's embedding
  // call looks its rows up in each rank's shard, stage_model.h).
  using RowLookup = std::function<torch::Tensor(const std::string& name, const torch::Tensor& ids)>;

  ParamView() = default;
  // `names` relative to the unit (the block prefix already removed). `sunk`: empty, or one per
  // name (a null sink: the tensor is handed out as it is). `rows`: for the names whose tensor is
  // undefined, which only Lookup reads.
  ParamView(std::vector<std::string> names, std::vector<torch::Tensor> tensors, std::vector<SunkParameter> sunk = {},
            RowLookup rows = nullptr);
  const torch::Tensor& operator()(const std::string& name) const;  // throws naming a missing one
  torch::Tensor Optional(const std::string& name) const;           // undefined when absent (no bias)
  // The rows of the table `name` for `ids`: lookup(table, ids), or the view's RowLookup where it
  // holds no tensor of the table (its lookup is then the plain one: no vocab-parallel table is
  // looked up that way).
  torch::Tensor Lookup(const std::string& name, const torch::Tensor& ids,
                       const TableLookup& lookup = PlainLookup) const;
  // x W^T + b for the matrix `weight` and the vector `bias` ("" or absent: none): torch::linear,
  // or LinearIntoGradient when the weight goes through a sink.
  // `ahead`: x's rows it names are ready before the others (fused_linear.h's RowsAhead).
  torch::Tensor Linear(const torch::Tensor& x, const std::string& weight, const std::string& bias = "",
                       const RowsAhead* ahead = nullptr) const;
  // The matrix `weight` as Linear reads it through a gradient sink: the tensor read and its
  // SunkParameter; a null second where it has no sink (Linear runs torch::linear).
  std::pair<torch::Tensor, const SunkParameter*> Sunk(const std::string& weight) const;
  // LoRA adapters of this view's linears (null: none; the pointee outlives the view).
  void SetLora(const LoraCompute* lora) { lora_ = lora; }
  // Appends parameters read as they are, through no sink: a frozen base (StageModel under LoRA).
  // `nf4` (empty, or one per name; null for a dense one): QLoRA's NF4 matrices, which Linear
  // dequantizes inside its matmul (their `tensors` entry is undefined).
  void AddFrozen(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                 const std::string& strip = "", const std::vector<std::shared_ptr<Nf4Weight>>& nf4 = {});

 private:
  torch::Tensor PlainLinear(const torch::Tensor& x, const std::string& weight, const std::string& bias,
                            const RowsAhead* ahead) const;
  size_t IndexOf(const std::string& name) const;  // names_.size() when absent
  const torch::Tensor& Get(size_t i) const;

  std::vector<std::string> names_;
  std::vector<torch::Tensor> tensors_;
  std::vector<SunkParameter> sunk_;
  RowLookup rows_;
  mutable std::vector<torch::Tensor> used_;  // operator()'s sink outputs, made on first access
  const LoraCompute* lora_ = nullptr;
  std::vector<const Nf4Weight*> nf4_;  // empty, or one per name (AddFrozen)
};

// A column-parallel projection read through f: its weight's and its bias's names ("": no bias).
struct ProjectionName {
  std::string weight, bias;
};

struct TensorParallel {
  int64_t size = 1;
  // f, then the column-parallel projections of its output: p.Linear(f(x), weight, bias) for each,
  // in order. One call, so that a gather can run beside the first matmul (tensor_parallel.h
  // EnterThenLinears, which StageModel sets under tp > 1).
  std::function<std::vector<torch::Tensor>(const ParamView& p, const torch::Tensor& x,
                                           const std::vector<ProjectionName>& projections)>
      enter_linears = [](const ParamView& p, const torch::Tensor& x, const std::vector<ProjectionName>& projections) {
        std::vector<torch::Tensor> out;
        for (const ProjectionName& projection : projections)
          out.push_back(p.Linear(x, projection.weight, projection.bias));
        return out;
      };
  // The row-parallel projection, then g: g(p.Linear(y, weight)), a bias the caller's, after
  // (tensor_parallel.h LinearThenLeave under tp > 1).
  std::function<torch::Tensor(const ParamView& p, const torch::Tensor& y, const std::string& weight)> linear_leave =
      [](const ParamView& p, const torch::Tensor& y, const std::string& weight) { return p.Linear(y, weight); };
  // x summed over the tensor-parallel ranks, its gradient too (tensor_parallel.h
  // SumOverTensorParallelRanks): a statistic over a dimension the ranks split (OLMo 2's q/k norms
  // over the whole projection). Identity on one rank.
  std::function<torch::Tensor(const torch::Tensor& x)> sum_over_ranks = [](const torch::Tensor& x) { return x; };
  // The token embedding's lookup of `tokens` in `table` (through ParamView::Lookup): the whole
  // table, or (vocab-parallel, shard/layout.h) this rank's rows, with the other ranks' tokens
  // looked up as zeros and the ranks' lookups summed (Megatron's VocabParallelEmbedding).
  TableLookup lookup = PlainLookup;
};

class ModelFamily {
 public:
  explicit ModelFamily(const ModelSpec& spec);
  virtual ~ModelFamily() = default;

  // tokens [b, t] -> residual stream [b, t, hidden]; `p` is the embedding unit, whose tables
  // are read only through p.Lookup (the token table's with tp.lookup).
  virtual torch::Tensor Embed(const ParamView& p, const torch::Tensor& tokens, const TensorParallel& tp) const;
  // One block: its sites (BlockOutputs), patched as `request` says.
  virtual BlockOutputs Block(const ParamView& p, const torch::Tensor& x, const TensorParallel& tp,
                             const BlockRequest& request = {}) const = 0;
  // The final norm before the head (the head itself, logits = norm(x) W^T, is the caller's).
  virtual torch::Tensor FinalNorm(const ParamView& p, const torch::Tensor& x) const = 0;
  // A parameter's initial values: every element `constant`, or drawn approximately N(0, std^2)
  // (causal_lm.h ParameterDraw draws them).
  struct InitRule {
    bool drawn = true;
    double std = 0.02;    // drawn
    double constant = 0;  // not drawn
  };
  virtual InitRule InitialValues(const std::string& name) const;

  const ModelSpec& spec() const { return spec_; }

 protected:
  // cos and sin [t, rotary_dims] for t = `length` positions (x's length when -1) in x's device
  // and dtype (fp32 frequencies, as transformers computes them, then cast). A block passes the
  // attention's length: under sequence parallelism its input holds 1/tp of the tokens.
  std::pair<torch::Tensor, torch::Tensor> Rotary(const torch::Tensor& x, int64_t length = -1) const;
  // cos and sin [t, rotary_dims / 2] fp32 on x's device: the tables of FusedRotary.
  std::pair<torch::Tensor, torch::Tensor> RotaryHalf(const torch::Tensor& x, int64_t length = -1) const
      STRATA_EXCLUDES(rotary_mutex_);
  // Rotates the first rotary_dims of each head of q or k [b, heads, t, head_dim].
  torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) const;
  torch::Tensor Activation(const torch::Tensor& x) const;
  // request.patch applied to `site`'s value (the value itself when there is no patch).
  static torch::Tensor Patched(const BlockRequest& request, const char* site, const torch::Tensor& value) {
    return request.patch ? request.patch(site, value) : value;
  }
  // Attention probabilities [b, t, heads, t] of q, k [b, heads, t, hd] (k already repeated for
  // GQA) as transformers' eager attention: softmax in fp32 of q k^T / sqrt(hd) with the causal
  // (and sliding-window) mask, cast to q's dtype. The fused attention that computes attn_out is
  // not replaced by this: it stays the same whether or not the pattern is asked.
  torch::Tensor AttentionPattern(const torch::Tensor& q, const torch::Tensor& k, int64_t window = 0) const;

  ModelSpec spec_;
  torch::Tensor inv_freq_;  // [rotary_dims / 2], fp32, host

 private:
  // RotaryHalf's tables by (device, length), built once: every block of every step reads the
  // same ones, and building them copies inv_freq_ from the host, which a CUDA graph capture
  // (step_graph.h) cannot contain. Extraction and training may run on different threads.
  mutable Mutex rotary_mutex_;
  mutable std::map<std::pair<std::string, int64_t>, std::pair<torch::Tensor, torch::Tensor>> rotary_tables_
      STRATA_GUARDED_BY(rotary_mutex_);
};

std::unique_ptr<ModelFamily> CreateModelFamily(const ModelSpec& spec);

// x / sqrt(mean(x^2) + eps) in fp32, then scaled: Llama's w * normed (cast back first), or
// Gemma's normed * (1 + w) (cast back after), exactly as transformers orders them.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps, bool gemma_style = false);

}  // namespace strata::worker
