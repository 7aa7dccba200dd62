// Llama (Touvron et al. 2023) and the families built on its block (internal to worker/):
//   x += o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   with n = norm(x)
//   x += down_proj(act(gate_proj(m)) * up_proj(m))                   with m = norm(x)
// Grouped-query attention: kv_heads key/value heads, each serving heads / kv_heads consecutive
// query heads; heads of head_dim (which may differ from hidden / heads). RoPE as transformers:
// q' = q cos + rotate_half(q) sin, rotate_half([a, b]) = [-b, a] over the head's two halves.
//   llama    RMSNorm w * x_hat, SiLU; optional biases (attention_bias: q/k/v/o, mlp_bias)
//   mistral  llama + sliding-window attention (a query sees the last sliding_window keys)
//   qwen2    llama + biases on q/k/v (not o)
//   qwen3    llama + RMSNorm over each head's q and k before RoPE: q = rope(norm_hd(q_proj(n)))
//   gemma    RMSNorm x_hat * (1 + w), GELU(tanh), embeddings x sqrt(hidden) (family_gemma.cc)
// Tied embeddings (tie_embeddings) make the head the token embedding.
#pragma once

#include "worker/nn/fused_ops.h"
#include "worker/nn/model_family.h"

namespace strata::worker {

class LlamaFamily : public ModelFamily {
 public:
  using ModelFamily::ModelFamily;
  BlockOutputs Block(const ParamView& p, const torch::Tensor& x, const TensorParallel& tp,
                     const BlockRequest& request = {}) const override;
  torch::Tensor FinalNorm(const ParamView& p, const torch::Tensor& x) const override {
    return Norm(x, p("norm.weight"));
  }

 protected:
  // Llama's RMSNorm, fused (fused_ops.h), its output in the compute dtype.
  virtual torch::Tensor Norm(const torch::Tensor& x, const torch::Tensor& weight) const;
  // {x, Norm(x)} and {x + y, Norm(x + y)} with the residual's two gradients summed in the norm's
  // backward kernel (fused_ops.h FusedResidualRmsNorm, FusedAddRmsNorm): the unpatched block's.
  virtual NormedResidual ResidualNorm(const torch::Tensor& x, const torch::Tensor& weight) const;
  virtual NormedResidual AddNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight) const;
};

}  // namespace strata::worker
