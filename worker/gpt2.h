// GPT-2 in LibTorch (Radford et al. 2019): token + learned position embeddings, pre-LayerNorm
// blocks x += attn(ln_1(x)); x += mlp(ln_2(x)) with causal multi-head attention and a
// 4h GELU(tanh) MLP, final LayerNorm, and an LM head tied to the token embedding.
// Initialisation follows GPT-2: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 * layers)).
#pragma once

#include <torch/torch.h>

#include "worker/causal_lm.h"

namespace strata::worker {

class Gpt2BlockImpl : public torch::nn::Module {
 public:
  Gpt2BlockImpl(const ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);
  BlockOutputs ForwardParts(const torch::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Dense c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
};
TORCH_MODULE(Gpt2Block);

class Gpt2 : public CausalLm {
 public:
  explicit Gpt2(const ModelSpec& spec);
  torch::Tensor Logits(const torch::Tensor& tokens) override;
  int64_t num_blocks() const override { return static_cast<int64_t>(h_->size()); }
  torch::Tensor Embed(const torch::Tensor& tokens) override;
  BlockOutputs RunBlock(int64_t layer, const torch::Tensor& x) override;
  void MoveEmbedding(const torch::Device& device, torch::ScalarType type) override;
  void MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type) override;

 private:
  ModelSpec spec_;
  Table wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList h_;
  torch::nn::LayerNorm ln_f_{nullptr};
};

}  // namespace strata::worker
