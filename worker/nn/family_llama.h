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
//   olmo2    no pre-norms, RMSNorm on each sublayer's output and over the whole q and k projections:
//              x += norm(o_proj(attn(rope(norm_q(q_proj(x))), rope(norm_k(k_proj(x))), v_proj(x))))
//              x += norm(down_proj(silu(gate_proj(x)) * up_proj(x)))
//            (norm_q's mean of squares spans every head: tensor-parallel ranks sum theirs)
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
  // The attention sublayer of `input` (the first norm's output; OLMo 2's residual itself), its
  // output before any norm: q, k, v, the pattern into `out`. `residual` sets RoPE's device.
  torch::Tensor SelfAttention(const ParamView& p, const torch::Tensor& input, const torch::Tensor& residual,
                              const TensorParallel& tp, const BlockRequest& request, BlockOutputs& out) const;
  // The gated MLP of `input`, mlp_hidden into `out`; its output before any norm.
  torch::Tensor Mlp(const ParamView& p, const torch::Tensor& input, const TensorParallel& tp,
                    const BlockRequest& request, BlockOutputs& out) const;
  // RMSNorm of x [..., width / tp] over the whole `width` (its squares summed over the ranks).
  torch::Tensor ProjectionNorm(const torch::Tensor& x, const torch::Tensor& weight, int64_t width,
                               const TensorParallel& tp, torch::ScalarType out_type) const;
};

}  // namespace strata::worker
