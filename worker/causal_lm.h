// The model families a worker can train, behind one interface: tokens [batch, time] (int64) ->
// logits [batch, time, vocab]. Parameter names follow Hugging Face's layouts (without the
// "transformer." / "model." prefix), so checkpoints map onto safetensors files by name.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "common/run_spec.h"
#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::worker {

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
  virtual torch::Tensor Logits(const torch::Tensor& tokens) = 0;

  // The residual stream as separately runnable (and movable) parts, for activation capture:
  // Embed -> RunBlock(0) -> RunBlock(1) -> ... (no final norm, no head). A model larger than the
  // device runs one part at a time: MoveEmbedding / MoveBlock put a part's weights on a device.
  virtual int64_t num_blocks() const = 0;
  virtual torch::Tensor Embed(const torch::Tensor& tokens) = 0;
  virtual BlockOutputs RunBlock(int64_t layer, const torch::Tensor& x) = 0;
  virtual void MoveEmbedding(const torch::Device& device, torch::ScalarType type) = 0;
  virtual void MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type) = 0;

  // Embedding and blocks 0..last_layer, calling `visit` after each block. Stops early: capturing
  // layer 3 of 48 costs 4 blocks.
  void RunBlocks(const torch::Tensor& tokens, int64_t last_layer, const BlockVisitor& visit) {
    auto x = Embed(tokens);
    for (int64_t i = 0; i <= last_layer && i < num_blocks(); ++i) {
      BlockOutputs out = RunBlock(i, x);
      visit(i, out);
      x = out.resid_post;
    }
  }
};

// Builds the family named by spec.family ("gpt2" or "llama"), initialised from the current
// LibTorch generator (callers seed it).
std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec);

// The model a task starts from: initialised from `seed` (the same on every rank and process),
// then overwritten by spec.init_from's safetensors when set. Errors name the mismatching tensor.
// `for_resume`: every parameter is about to be loaded from a checkpoint, so the model's own
// random initialisation (normal_ of every weight; LibTorch's module defaults still run) and
// init_from are skipped: on a resume they are only time before training again. Nothing after
// the build draws from the generator, so nothing else changes.
Result<std::shared_ptr<CausalLm>> BuildCausalLm(const ModelSpec& spec, int64_t seed, bool for_resume = false);

// True while BuildCausalLm builds for a resume on this thread: the families skip their normal_.
bool RandomInitSkipped();

// A linear layer (y = x W^T + b) and an embedding table whose parameters start uninitialised:
// the family's own initialisation, or the checkpoint / Hugging Face weights loaded next, writes
// every one. torch::nn::Linear and Embedding would first fill them with their default init, one
// random number at a time on one thread (about a third of building a ~1B model on the host),
// only for it to be overwritten. Parameter names are theirs ("weight", "bias").
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(int64_t in, int64_t out, bool with_bias);
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }
  torch::Tensor weight, bias;  // [out, in] and [out]; bias undefined without one
};
TORCH_MODULE(Dense);

class TableImpl : public torch::nn::Module {
 public:
  TableImpl(int64_t rows, int64_t dim) { weight = register_parameter("weight", torch::empty({rows, dim})); }
  torch::Tensor forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }
  torch::Tensor weight;  // [rows, dim]
};
TORCH_MODULE(Table);

// "fp32" / "bf16" / "fp16" (run spec dtype and precision names) as a LibTorch scalar type.
torch::ScalarType ScalarTypeOf(const std::string& name);
// Our store's dtype of a LibTorch scalar type, and a borrowed view of a contiguous CPU tensor.
storage::DType ToStoreDType(torch::ScalarType type);
storage::TensorView ViewOf(const torch::Tensor& cpu_contiguous);

}  // namespace strata::worker
