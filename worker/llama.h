// Llama (Touvron et al. 2023) in LibTorch: pre-RMSNorm blocks
//   x += o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   with n = rms_norm(x)
//   x += down_proj(silu(gate_proj(m)) * up_proj(m))                   with m = rms_norm(x)
// Grouped-query attention: kv_heads key/value heads, each shared by heads / kv_heads query heads.
// RoPE as in Hugging Face: inv_freq_i = theta^(-2i/d); q' = q cos + rotate_half(q) sin with
// rotate_half([a, b]) = [-b, a] over the two halves of the head dimension.
// RMSNorm: x / sqrt(mean(x^2) + eps) * w, computed in fp32. No biases; untied LM head.
#pragma once

#include "worker/causal_lm.h"

namespace strata::worker {

class LlamaAttention : public torch::nn::Module {
 public:
  explicit LlamaAttention(const ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  int64_t heads_, kv_heads_, head_dim_;
  Dense q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};

class LlamaMlp : public torch::nn::Module {
 public:
  explicit LlamaMlp(const ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Dense gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};

class RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t hidden, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double eps_;
  torch::Tensor weight_;
};

class LlamaBlock : public torch::nn::Module {
 public:
  explicit LlamaBlock(const ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  BlockOutputs ForwardParts(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  std::shared_ptr<RmsNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMlp> mlp_;
};

class Llama : public CausalLm {
 public:
  explicit Llama(const ModelSpec& spec);
  torch::Tensor Logits(const torch::Tensor& tokens) override;
  int64_t num_blocks() const override { return static_cast<int64_t>(layers_.size()); }
  torch::Tensor Embed(const torch::Tensor& tokens) override { return embed_tokens_(tokens); }
  BlockOutputs RunBlock(int64_t layer, const torch::Tensor& x) override;
  void MoveEmbedding(const torch::Device& device, torch::ScalarType type) override { embed_tokens_->to(device, type); }
  void MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type) override { layers_[layer]->to(device, type); }

 private:
  // The rotary tables (cos, sin) for x's length, on x's device and in its dtype.
  std::pair<torch::Tensor, torch::Tensor> Rotary(const torch::Tensor& x);

  ModelSpec spec_;
  Table embed_tokens_{nullptr};
  torch::nn::ModuleList layer_list_;                // registers the blocks as layers.N
  std::vector<std::shared_ptr<LlamaBlock>> layers_;  // the same blocks, typed
  std::shared_ptr<RmsNorm> norm_;
  Dense lm_head_{nullptr};
  torch::Tensor inv_freq_;  // buffer [head_dim / 2]
};

}  // namespace strata::worker
