#include "worker/gpt2.h"

#include <cmath>

#include "worker/torch_compat.h"

namespace strata::worker {

Gpt2BlockImpl::Gpt2BlockImpl(const ModelSpec& spec) : heads_(spec.heads) {
  const int64_t h = spec.hidden;
  ln_1_ = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h}).eps(spec.norm_eps)));
  c_attn_ = register_module("c_attn", Dense(h, 3 * h, true));
  attn_proj_ = register_module("attn_proj", Dense(h, h, true));
  ln_2_ = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({h}).eps(spec.norm_eps)));
  c_fc_ = register_module("c_fc", Dense(h, spec.ffn, true));
  mlp_proj_ = register_module("mlp_proj", Dense(spec.ffn, h, true));
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * spec.layers);
  for (auto* linear : {&c_attn_, &attn_proj_, &c_fc_, &mlp_proj_}) {
    if (RandomInitSkipped()) break;
    const bool residual = linear == &attn_proj_ || linear == &mlp_proj_;
    (*linear)->weight.normal_(0.0, residual ? residual_std : 0.02);
    (*linear)->bias.zero_();
  }
}

torch::Tensor Gpt2BlockImpl::forward(const torch::Tensor& x) { return ForwardParts(x).resid_post; }

BlockOutputs Gpt2BlockImpl::ForwardParts(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  // [b, t, 3c] -> 3 x [b, heads, t, head_dim]
  auto qkv = c_attn_(ln_1_(x)).view({b, t, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4});
  auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]);
  y = y.transpose(1, 2).reshape({b, t, c});
  BlockOutputs out;
  out.attn_out = attn_proj_(y);
  auto h = x + out.attn_out;
  out.mlp_out = mlp_proj_(torch::gelu(c_fc_(ln_2_(h)), "tanh"));
  out.resid_post = h + out.mlp_out;
  return out;
}

Gpt2::Gpt2(const ModelSpec& spec) : spec_(spec) {
  wte_ = register_module("wte", Table(spec.vocab, spec.hidden));
  wpe_ = register_module("wpe", Table(spec.sequence, spec.hidden));
  h_ = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.layers; ++i) h_->push_back(Gpt2Block(spec));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({spec.hidden}).eps(spec.norm_eps)));
  torch::NoGradGuard no_grad;
  if (!RandomInitSkipped()) {
    wte_->weight.normal_(0.0, 0.02);
    wpe_->weight.normal_(0.0, 0.01);
  }
}

torch::Tensor Gpt2::Embed(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  auto positions = torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  return wte_(tokens) + wpe_(positions);
}

BlockOutputs Gpt2::RunBlock(int64_t layer, const torch::Tensor& x) { return h_[layer]->as<Gpt2Block>()->ForwardParts(x); }

void Gpt2::MoveEmbedding(const torch::Device& device, torch::ScalarType type) {
  wte_->to(device, type);
  wpe_->to(device, type);
}

void Gpt2::MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type) { h_[layer]->to(device, type); }

torch::Tensor Gpt2::Logits(const torch::Tensor& tokens) {
  auto x = Embed(tokens);
  for (auto& block : *h_) x = block->as<Gpt2Block>()->forward(x);
  return torch::matmul(ln_f_(x), wte_->weight.t());  // tied LM head
}

}  // namespace strata::worker

