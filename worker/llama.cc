#include "worker/llama.h"

#include <cmath>

#include "worker/torch_compat.h"

namespace strata::worker {
namespace {

Dense NoBias(int64_t in, int64_t out) {
  Dense linear(in, out, false);
  torch::NoGradGuard no_grad;
  if (!RandomInitSkipped()) linear->weight.normal_(0.0, 0.02);
  return linear;
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

}  // namespace

RmsNorm::RmsNorm(int64_t hidden, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({hidden}));
}

torch::Tensor RmsNorm::forward(const torch::Tensor& x) {
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight_ * normed.to(x.scalar_type());
}

LlamaAttention::LlamaAttention(const ModelSpec& spec)
    : heads_(spec.heads), kv_heads_(spec.kv_heads), head_dim_(spec.hidden / spec.heads) {
  q_proj_ = register_module("q_proj", NoBias(spec.hidden, heads_ * head_dim_));
  k_proj_ = register_module("k_proj", NoBias(spec.hidden, kv_heads_ * head_dim_));
  v_proj_ = register_module("v_proj", NoBias(spec.hidden, kv_heads_ * head_dim_));
  o_proj_ = register_module("o_proj", NoBias(heads_ * head_dim_, spec.hidden));
}

torch::Tensor LlamaAttention::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  auto q = q_proj_(x).view({b, t, heads_, head_dim_}).transpose(1, 2);
  auto k = k_proj_(x).view({b, t, kv_heads_, head_dim_}).transpose(1, 2);
  auto v = v_proj_(x).view({b, t, kv_heads_, head_dim_}).transpose(1, 2);
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;
  if (kv_heads_ != heads_) {  // each kv head serves heads / kv_heads consecutive query heads
    k = k.repeat_interleave(heads_ / kv_heads_, 1);
    v = v.repeat_interleave(heads_ / kv_heads_, 1);
  }
  auto y = compat::CausalAttention(q, k, v).transpose(1, 2).reshape({b, t, heads_ * head_dim_});
  return o_proj_(y);
}

LlamaMlp::LlamaMlp(const ModelSpec& spec) {
  gate_proj_ = register_module("gate_proj", NoBias(spec.hidden, spec.ffn));
  up_proj_ = register_module("up_proj", NoBias(spec.hidden, spec.ffn));
  down_proj_ = register_module("down_proj", NoBias(spec.ffn, spec.hidden));
}

torch::Tensor LlamaMlp::forward(const torch::Tensor& x) {
  return down_proj_(torch::silu(gate_proj_(x)) * up_proj_(x));
}

LlamaBlock::LlamaBlock(const ModelSpec& spec) {
  input_layernorm_ = register_module("input_layernorm", std::make_shared<RmsNorm>(spec.hidden, spec.norm_eps));
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(spec));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<RmsNorm>(spec.hidden, spec.norm_eps));
  mlp_ = register_module("mlp", std::make_shared<LlamaMlp>(spec));
}

torch::Tensor LlamaBlock::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return ForwardParts(x, cos, sin).resid_post;
}

BlockOutputs LlamaBlock::ForwardParts(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  BlockOutputs out;
  out.attn_out = self_attn_->forward(input_layernorm_->forward(x), cos, sin);
  auto h = x + out.attn_out;
  out.mlp_out = mlp_->forward(post_attention_layernorm_->forward(h));
  out.resid_post = h + out.mlp_out;
  return out;
}

Llama::Llama(const ModelSpec& spec) : spec_(spec) {
  embed_tokens_ = register_module("embed_tokens", Table(spec.vocab, spec.hidden));
  {
    torch::NoGradGuard no_grad;
    if (!RandomInitSkipped()) embed_tokens_->weight.normal_(0.0, 0.02);
  }
  layer_list_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.layers; ++i) {
    layers_.push_back(std::make_shared<LlamaBlock>(spec));
    layer_list_->push_back(layers_.back());
  }
  norm_ = register_module("norm", std::make_shared<RmsNorm>(spec.hidden, spec.norm_eps));
  lm_head_ = register_module("lm_head", NoBias(spec.hidden, spec.vocab));
  const int64_t d = spec.hidden / spec.heads;
  // fp32 throughout, as Hugging Face computes its rotary tables. Not a registered buffer: it is
  // derived from the config, so it stays out of checkpoints.
  inv_freq_ = 1.0 / torch::pow(spec.rope_theta, torch::arange(0, d, 2, torch::kFloat) / static_cast<double>(d));
}

std::pair<torch::Tensor, torch::Tensor> Llama::Rotary(const torch::Tensor& x) {
  const int64_t t = x.size(1);
  auto positions = torch::arange(t, torch::TensorOptions().dtype(torch::kFloat).device(x.device()));
  auto freqs = torch::outer(positions, inv_freq_.to(x.device()));
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(x.scalar_type()), emb.sin().to(x.scalar_type())};
}

BlockOutputs Llama::RunBlock(int64_t layer, const torch::Tensor& x) {
  auto [cos, sin] = Rotary(x);
  return layers_[layer]->ForwardParts(x, cos, sin);
}

torch::Tensor Llama::Logits(const torch::Tensor& tokens) {
  auto x = Embed(tokens);
  auto [cos, sin] = Rotary(x);
  for (auto& layer : layers_) x = layer->forward(x, cos, sin);
  return lm_head_(norm_->forward(x));
}

}  // namespace strata::worker
