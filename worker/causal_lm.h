// A whole model of any family (model/parameters.h) as one LibTorch module: tokens [batch, time]
// (int64) -> logits [batch, time, vocab]. Its parameters are the family's table, named as there
// ("h.0.c_attn.weight", "layers.3.self_attn.q_proj.weight"), so checkpoints and Hugging Face
// files map onto it by name; what it computes is the family's (worker/model_family.h), the same
// code a training rank runs on its slices.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/run_spec.h"
#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::worker {

class ModelFamily;
class ParamView;

// What one transformer block computes, for activation capture: the attention and MLP outputs
// (before they are added to the residual stream) and the block's output (the residual stream
// after it, which Hugging Face returns as hidden_states[layer + 1]).
struct BlockOutputs {
  torch::Tensor attn_out;
  torch::Tensor mlp_out;
  torch::Tensor resid_post;
};
using BlockVisitor = std::function<void(int64_t layer, const BlockOutputs& outputs)>;

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
  BlockOutputs RunBlock(int64_t layer, const torch::Tensor& x);
  void MoveEmbedding(const torch::Device& device, torch::ScalarType type);
  void MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type);

  // Embedding and blocks 0..last_layer, calling `visit` after each block. Stops early: capturing
  // layer 3 of 48 costs 4 blocks.
  void RunBlocks(const torch::Tensor& tokens, int64_t last_layer, const BlockVisitor& visit);

  // Every parameter from the seeded LibTorch generator by the family's rule, in the table's order
  // (GPT-2: its embeddings last).
  void Initialize();
  const ModelSpec& spec() const { return spec_; }

 private:
  ModelSpec spec_;
  std::unique_ptr<ModelFamily> family_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> nodes_;  // "layers", "layers.3", ... -> module
  std::vector<std::string> names_;                                    // the table's order
  std::vector<torch::Tensor> params_;
  std::unique_ptr<ParamView> embedding_, final_norm_;
  std::vector<ParamView> blocks_;
  torch::Tensor head_;
};

// The family named by spec.family, parameters initialised from the current LibTorch generator
// (callers seed it).
std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec);

// The model a task starts from, its parameters placed by `options` (default: host, fp32): read
// from spec.init_from's safetensors when set (one tensor at a time, straight from the mapped file
// to its place: host memory never holds the model twice), else initialised from `seed` (the same
// on every rank and process; drawn on the host in fp32, then moved). Errors name the mismatching
// tensor. `for_resume`: every parameter is about to be loaded from a checkpoint, so
// initialisation and init_from are skipped: on a resume they are only time before training again.
Result<std::shared_ptr<CausalLm>> BuildCausalLm(const ModelSpec& spec, int64_t seed, bool for_resume = false,
                                                const torch::TensorOptions& options = torch::kFloat);

// "fp32" / "bf16" / "fp16" (run spec dtype and precision names) as a LibTorch scalar type.
torch::ScalarType ScalarTypeOf(const std::string& name);
// Our store's dtype of a LibTorch scalar type, and a borrowed view of a contiguous CPU tensor.
storage::DType ToStoreDType(torch::ScalarType type);
storage::TensorView ViewOf(const torch::Tensor& cpu_contiguous);

}  // namespace strata::worker
