// The one place that knows LibTorch versions apart: Debian's LibTorch 1.13 (CPU, CI) and pip
// PyTorch 2.11's LibTorch (CUDA 13, GPU node). Everything else calls these helpers.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#define STRATA_TORCH_HAS_SDPA 1
#else
#define STRATA_TORCH_HAS_SDPA 0
#endif

namespace strata::worker::compat {

// Causal attention over q, k, v of shape [batch, heads, time, head_dim]. LibTorch 2.x uses the
// fused kernel (flash / memory-efficient on GPU); 1.13 has none, so it is spelled out:
// softmax(q k^T / sqrt(d) + causal mask) v.
inline torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if STRATA_TORCH_HAS_SDPA
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  auto mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
#endif
}

}  // namespace strata::worker::compat
