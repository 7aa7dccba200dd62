#include "worker/family_llama.h"

#include "worker/torch_compat.h"

namespace strata::worker {

BlockOutputs LlamaFamily::Block(const ParamView& p, const torch::Tensor& x, const TensorParallel& tp) const {
  const int64_t b = x.size(0), t = x.size(1), hd = spec_.head_size();
  const int64_t heads = spec_.heads / tp.size, kv_heads = spec_.kv_heads / tp.size;
  auto [cos, sin] = Rotary(x);
  auto a = tp.enter(Norm(x, p("input_layernorm.weight")));
  auto q = torch::linear(a, p("self_attn.q_proj.weight"), p.Optional("self_attn.q_proj.bias")).view({b, t, heads, hd}).transpose(1, 2);
  auto k = torch::linear(a, p("self_attn.k_proj.weight"), p.Optional("self_attn.k_proj.bias")).view({b, t, kv_heads, hd}).transpose(1, 2);
  auto v = torch::linear(a, p("self_attn.v_proj.weight"), p.Optional("self_attn.v_proj.bias")).view({b, t, kv_heads, hd}).transpose(1, 2);
  q = ApplyRotary(q, cos, sin);
  k = ApplyRotary(k, cos, sin);
  if (kv_heads != heads) {  // each kv head serves heads / kv_heads consecutive query heads
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  auto y = compat::CausalAttention(q, k, v, spec_.sliding_window).transpose(1, 2).reshape({b, t, heads * hd});
  BlockOutputs out;
  out.attn_out = tp.leave(torch::linear(y, p("self_attn.o_proj.weight")));
  if (auto bias = p.Optional("self_attn.o_proj.bias"); bias.defined()) out.attn_out = out.attn_out + bias;
  auto h = x + out.attn_out;
  auto m = tp.enter(Norm(h, p("post_attention_layernorm.weight")));
  m = Activation(torch::linear(m, p("mlp.gate_proj.weight"), p.Optional("mlp.gate_proj.bias"))) *
      torch::linear(m, p("mlp.up_proj.weight"), p.Optional("mlp.up_proj.bias"));
  out.mlp_out = tp.leave(torch::linear(m, p("mlp.down_proj.weight")));
  if (auto bias = p.Optional("mlp.down_proj.bias"); bias.defined()) out.mlp_out = out.mlp_out + bias;
  out.resid_post = h + out.mlp_out;
  return out;
}

std::unique_ptr<ModelFamily> CreateLlamaFamily(const ModelSpec& spec) { return std::make_unique<LlamaFamily>(spec); }

}  // namespace strata::worker
