// A whole model of any family (model/parameters.h) as one LibTorch module: tokens [batch, time]
// (int64) -> logits [batch, time, vocab]. Its parameters are the family's table, named as there
// ("h.0.c_attn.weight", "layers.3.self_attn.q_proj.weight"), so checkpoints and Hugging Face
// files map onto it by name; what it computes is the family's (worker/nn/model_family.h), the same
// code a training rank runs on its slices.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/parameters.h"
#include "spec/run_spec.h"
#include "storage/shard_store.h"
#include "worker/nn/block_io.h"
#include "worker/nn/tensor_bytes.h"

namespace strata::worker {

class ModelFamily;
class ParamView;

class CausalLm : public torch::nn::Module {
 public:
  // Parameters uninitialised, allocated with `options` (device, dtype): the caller initialises
  // (Initialize) or loads every one.
  explicit CausalLm(const ModelSpec& spec, const torch::TensorOptions& options = torch::kFloat);
  ~CausalLm() override;

  torch::Tensor Logits(const torch::Tensor& tokens);

  // The residual stream as separately runnable (and movable) parts, for activation capture:
  // Embed -> RunBlock(0) -> RunBlock(1) -> ... (no final norm, no head). A model larger than the
  // device runs one part at a time: MoveEmbedding / MoveBlock put a part's weights on a device.
  int64_t num_blocks() const { return spec_.layers; }
  torch::Tensor Embed(const torch::Tensor& tokens);
  BlockOutputs RunBlock(int64_t layer, const torch::Tensor& x, const BlockRequest& request = {});
  // The final norm of the residual stream after the last block, and the head on it (logits).
  torch::Tensor FinalNorm(const torch::Tensor& x);
  torch::Tensor Head(const torch::Tensor& normed);
  void MoveEmbedding(const torch::Device& device, torch::ScalarType type);
  void MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type);
  void MoveFinal(const torch::Device& device, torch::ScalarType type);  // final norm and head

  // Embedding and blocks 0..last_layer, calling `visit` after each block; `request` (when set)
  // says what each layer's block is asked for. Returns the residual stream after last_layer.
  // Stops early: capturing layer 3 of 48 costs 4 blocks.
  torch::Tensor RunBlocks(const torch::Tensor& tokens, int64_t last_layer, const BlockVisitor& visit,
                          const BlockRequestFn& request = nullptr);

  // Every parameter drawn as ParameterDraw(spec, seed) draws it.
  void Initialize(int64_t seed);
  const ModelSpec& spec() const { return spec_; }

 private:
  ModelSpec spec_;
  std::unique_ptr<ModelFamily> family_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> nodes_;  // "layers", "layers.3", ... -> module
  std::vector<std::string> names_;                                   // the table's order
  std::vector<torch::Tensor> params_;
  std::unique_ptr<ParamView> embedding_, final_norm_;
  std::vector<ParamView> blocks_;
  torch::Tensor head_;
};

// Capture (extract and patch runs), shared by the extractor and the direct forward reference so
// both store the same bytes:
//   ExtractRecordNames   the (layer, site) records of a chunk, in storage order: for each of
//                        extract.layers, its per-block sites; at layer model.layers - 1 also the
//                        model-level ones (final_norm, logits, logits_ids, loss).
//   ExtractRequest       what block `layer` is asked: its attention pattern when captured there,
//                        and (patch runs) patch.sites replaced at patch.layers.
//   ExtractRows          the rows of `layer`'s records from its block outputs, [b * t, row
//                        shape...] in the stored dtype (ExtractSiteDType), on the block's device;
//                        at the last layer the model's final norm and head run on resid_post.
// Model-level sites, from h = resid_post of the last block:
//   final_norm   the final norm of h                                   [hidden]
//   logits       final_norm W_head^T, in the compute dtype, then cast  [vocab], or the top
//                logits_top_k values, descending (torch.topk)          [k]
//   logits_ids   their token ids (int32)                               [k]
//   loss         -log softmax(logits in fp32)[next token] at positions 0..t-2 of each
//                sequence; NaN at its last position, whose next token is not in the sequence [1]
std::vector<std::pair<int64_t, std::string>> ExtractRecordNames(const RunSpec& spec);
BlockRequest ExtractRequest(const RunSpec& spec, int64_t layer);
std::vector<torch::Tensor> ExtractRows(CausalLm& model, const RunSpec& spec, int64_t layer, const BlockOutputs& block,
                                       const torch::Tensor& tokens);

// A model's initial weights one parameter at a time, as a seed-drawn run starts: each parameter
// by its family's rule (ModelFamily::InitialValues) from a stream of its own, so it is the same
// drawn alone on one rank (a pipeline stage's, a frozen base streamed a tensor at a time) or with
// the whole model, and no parameter's values depend on another's. The values come from a
// counter-based generator (kernels/normal_draw_math.h: element i a function of the stream and i),
// drawn where the tensor lives - over the host's cores, or on a GPU in one kernel - with the same
// bits on either and for any thread count (docs/run-spec.md, "Weights").
// A model of `spec` on the host in fp32, drawn from `seed` (tests).
std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec, int64_t seed);

class ParameterDraw {
 public:
  ParameterDraw(const ModelSpec& spec, int64_t seed);
  ~ParameterDraw();
  // `p` (a parameter of spec's table, model/parameters.h) in fp32, drawn on `device`.
  torch::Tensor operator()(const model::Parameter& p, torch::Device device = torch::kCPU) const;
  // Fills `t` (a contiguous fp32 tensor of the parameter's shape, on the host or a GPU) in place.
  void Fill(const std::string& name, torch::Tensor& t) const;

 private:
  std::unique_ptr<ModelFamily> family_;
  int64_t seed_;
};

// The model a task starts from, its parameters placed by `options` (default: host, fp32): read
// from spec.init_from's safetensors when set (one tensor at a time, straight from the mapped file
// to its place: host memory never holds the model twice), else drawn from `seed` (ParameterDraw:
// the same on every rank and process; on the host in fp32, then moved). Errors name the mismatching
// tensor. `for_resume`: every parameter is about to be loaded from a checkpoint, so
// initialisation and init_from are skipped: on a resume they are only time before training again.
Result<std::shared_ptr<CausalLm>> BuildCausalLm(const ModelSpec& spec, int64_t seed, bool for_resume = false,
                                                const torch::TensorOptions& options = torch::kFloat);

}  // namespace strata::worker
