#include "worker/nn/family_llama.h"

#include "worker/nn/fused_ops.h"
#include "worker/nn/torch_compat.h"

namespace strata::worker {

BlockOutputs LlamaFamily::Block(const ParamView& p, const torch::Tensor& x_in, const TensorParallel& tp,
                                const BlockRequest& request) const {
  BlockOutputs out;
  out.resid_pre = Patched(request, "resid_pre", x_in);
  const torch::Tensor& x = out.resid_pre;
  // Unpatched, each norm takes in the residual add beside it (ResidualNorm, AddNorm), so backward
  // sums the residual stream's two gradients in the norm's kernel, not in autograd's adds. A patch
  // may replace resid_mid between its add and its norm: op by op, every site as it always was.
  const bool fuse_residual = !request.patch;
  const NormedResidual first = fuse_residual ? ResidualNorm(x, p("input_layernorm.weight"))
                                             : NormedResidual{x, Norm(x, p("input_layernorm.weight"))};
  out.attn_out = Patched(request, "attn_out", SelfAttention(p, first.normed, x, tp, request, out));
  NormedResidual second;
  if (fuse_residual) {
    second = AddNorm(first.residual, out.attn_out, p("post_attention_layernorm.weight"));
    out.resid_mid = second.residual;
  } else {
    out.resid_mid = Patched(request, "resid_mid", x + out.attn_out);
    second = {out.resid_mid, Norm(out.resid_mid, p("post_attention_layernorm.weight"))};
  }
  out.mlp_out = Patched(request, "mlp_out", Mlp(p, second.normed, tp, request, out));
  out.resid_post = Patched(request, "resid_post", out.resid_mid + out.mlp_out);
  return out;
}

torch::Tensor LlamaFamily::SelfAttention(const ParamView& p, const torch::Tensor& input, const torch::Tensor& residual,
                                         const TensorParallel& tp, const BlockRequest& request,
                                         BlockOutputs& out) const {
  const int64_t hd = spec_.head_size();
  const int64_t heads = spec_.heads / tp.size, kv_heads = spec_.kv_heads / tp.size;
  const torch::ScalarType compute = compat::ComputeType(residual);
  std::vector<torch::Tensor> qkv = tp.enter_linears(p, input,
                                                    {{"self_attn.q_proj.weight", "self_attn.q_proj.bias"},
                                                     {"self_attn.k_proj.weight", "self_attn.k_proj.bias"},
                                                     {"self_attn.v_proj.weight", "self_attn.v_proj.bias"}});
  // The attention's tokens: all of them, where x may hold 1/tp (sequence parallel, model_family.h).
  const int64_t b = qkv[0].size(0), t = qkv[0].size(1);
  auto [cos, sin] = RotaryHalf(residual, t);
  if (spec_.qk_norm() && !spec_.qk_norm_per_head()) {  // OLMo 2: over the whole projection
    qkv[0] = ProjectionNorm(qkv[0], p("self_attn.q_norm.weight"), spec_.heads * hd, tp, compute);
    qkv[1] = ProjectionNorm(qkv[1], p("self_attn.k_norm.weight"), spec_.kv_heads * hd, tp, compute);
  }
  // RoPE on [b, t, heads, hd] as the projections lay it out, then the heads-first view attention takes.
  // Qwen3 normalises each head's q and k first (one weight of hd each, shared by the heads: under
  // tensor parallelism a rank's gradient of it is its heads' part, summed over the ranks).
  torch::Tensor q_heads = qkv[0].view({b, t, heads, hd}), k_heads = qkv[1].view({b, t, kv_heads, hd});
  if (spec_.qk_norm_per_head()) {
    q_heads = Norm(q_heads, p("self_attn.q_norm.weight"));
    k_heads = Norm(k_heads, p("self_attn.k_norm.weight"));
  }
  auto q = FusedRotary(q_heads, cos, sin, spec_.rotary_dims(), compute).transpose(1, 2);
  auto k = FusedRotary(k_heads, cos, sin, spec_.rotary_dims(), compute).transpose(1, 2);
  auto v = qkv[2].view({b, t, kv_heads, hd}).transpose(1, 2);
  out.q = q.transpose(1, 2);
  out.k = k.transpose(1, 2);  // kv_heads, before the repeat below
  out.v = v.transpose(1, 2);
  // Each kv head serves heads / kv_heads consecutive query heads (CausalAttention reads it in place).
  if (request.attn_pattern) {
    out.attn_pattern =
        AttentionPattern(q, kv_heads == heads ? k : k.repeat_interleave(heads / kv_heads, 1), spec_.sliding_window);
  }
  auto y = compat::CausalAttention(q, k, v, spec_.sliding_window).transpose(1, 2).reshape({b, t, heads * hd});
  auto attn = tp.linear_leave(p, y, "self_attn.o_proj.weight");
  if (auto bias = p.Optional("self_attn.o_proj.bias"); bias.defined()) attn = attn + bias;
  return attn;
}

torch::Tensor LlamaFamily::Mlp(const ParamView& p, const torch::Tensor& input, const TensorParallel& tp,
                               const BlockRequest& request, BlockOutputs& out) const {
  const std::vector<torch::Tensor> gate_up = tp.enter_linears(
      p, input, {{"mlp.gate_proj.weight", "mlp.gate_proj.bias"}, {"mlp.up_proj.weight", "mlp.up_proj.bias"}});
  const torch::Tensor &gate = gate_up[0], &up = gate_up[1];
  out.mlp_hidden =
      Patched(request, "mlp_hidden",
              spec_.activation == strata::Activation::kSilu ? FusedSwiGlu(gate, up) : Activation(gate) * up);
  auto mlp = tp.linear_leave(p, out.mlp_hidden, "mlp.down_proj.weight");
  if (auto bias = p.Optional("mlp.down_proj.bias"); bias.defined()) mlp = mlp + bias;
  return mlp;
}

torch::Tensor LlamaFamily::ProjectionNorm(const torch::Tensor& x, const torch::Tensor& weight, int64_t width,
                                          const TensorParallel& tp, torch::ScalarType out_type) const {
  // RMSNorm over the whole projection, of which this rank holds width / tp columns: the sum of
  // squares summed over the ranks, then each rank scales its own columns by its slice of w.
  const torch::Tensor x32 = x.to(torch::kFloat);
  const torch::Tensor squares = tp.sum_over_ranks(x32.pow(2).sum(-1, /*keepdim=*/true));
  const torch::Tensor r = torch::rsqrt(squares / static_cast<double>(width) + spec_.norm_eps);
  return (weight * (x32 * r)).to(out_type);
}

torch::Tensor LlamaFamily::Norm(const torch::Tensor& x, const torch::Tensor& weight) const {
  return FusedRmsNorm(x, weight, spec_.norm_eps, compat::ComputeType(x));
}

NormedResidual LlamaFamily::ResidualNorm(const torch::Tensor& x, const torch::Tensor& weight) const {
  return FusedResidualRmsNorm(x, weight, spec_.norm_eps, compat::ComputeType(x));
}

NormedResidual LlamaFamily::AddNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight) const {
  return FusedAddRmsNorm(x, y, weight, spec_.norm_eps, compat::ComputeType(x));
}

namespace {

// OLMo 2: the block's norms on the sublayers' outputs, none before them, and q and k normalised
// over their whole projections (family_llama.h). attn_out and mlp_out are the attention's and
// the MLP's outputs before their norms (what hooks on transformers' self_attn and mlp return).
class Olmo2Family : public LlamaFamily {
 public:
  using LlamaFamily::LlamaFamily;
  BlockOutputs Block(const ParamView& p, const torch::Tensor& x_in, const TensorParallel& tp,
                     const BlockRequest& request = {}) const override {
    BlockOutputs out;
    out.resid_pre = Patched(request, "resid_pre", x_in);
    const torch::Tensor& x = out.resid_pre;
    out.attn_out = Patched(request, "attn_out", SelfAttention(p, x, x, tp, request, out));
    out.resid_mid = Patched(request, "resid_mid", x + Norm(out.attn_out, p("post_attention_layernorm.weight")));
    out.mlp_out = Patched(request, "mlp_out", Mlp(p, out.resid_mid, tp, request, out));
    out.resid_post =
        Patched(request, "resid_post", out.resid_mid + Norm(out.mlp_out, p("post_feedforward_layernorm.weight")));
    return out;
  }
};

}  // namespace

std::unique_ptr<ModelFamily> CreateLlamaFamily(const ModelSpec& spec) {
  if (spec.post_norms()) return std::make_unique<Olmo2Family>(spec);
  return std::make_unique<LlamaFamily>(spec);
}

}  // namespace strata::worker
