// GPT-NeoX (Black et al. 2022; Pythia): LayerNorm with bias, the fused query_key_value laid out
// per head as [q | k | v] (so a head's rows are contiguous), rotary embeddings on the first
// rotary_pct of each head's dimensions, GELU MLP, and - with use_parallel_residual, as in every
// Pythia - attention and MLP side by side on the same input:
//   x' = x + attn(ln1(x)) + mlp(ln2(x))          (parallel)
//   h = x + attn(ln1(x));  x' = h + mlp(ln2(h))  (sequential)
// The head (embed_out) is untied unless tie_word_embeddings.
#include "worker/nn/fused_ops.h"
#include "worker/nn/model_family.h"
#include "worker/nn/torch_compat.h"

namespace strata::worker {
namespace {

class GptNeoxFamily : public ModelFamily {
 public:
  using ModelFamily::ModelFamily;

  BlockOutputs Block(const ParamView& p, const torch::Tensor& x_in, const TensorParallel& tp,
                     const BlockRequest& request = {}) const override {
    const int64_t hd = spec_.head_size(), heads = spec_.heads / tp.size;
    BlockOutputs out;
    out.resid_pre = Patched(request, "resid_pre", x_in);
    const torch::Tensor& x = out.resid_pre;
    const torch::Tensor projected =
        tp.enter_linears(p, LayerNorm(x, p, "input_layernorm"),
                         {{"attention.query_key_value.weight", "attention.query_key_value.bias"}})[0];
    const int64_t b = projected.size(0), t = projected.size(1);  // all tokens (x may hold 1/tp: sequence parallel)
    auto [cos, sin] = Rotary(x, t);
    auto qkv = projected.view({b, t, heads, 3 * hd}).transpose(1, 2);
    auto parts = qkv.chunk(3, -1);
    auto q = ApplyRotary(parts[0], cos, sin), k = ApplyRotary(parts[1], cos, sin);
    out.q = q.transpose(1, 2);
    out.k = k.transpose(1, 2);
    out.v = parts[2].transpose(1, 2);
    if (request.attn_pattern) out.attn_pattern = AttentionPattern(q, k);
    auto y = compat::CausalAttention(q, k, parts[2]).transpose(1, 2).reshape({b, t, heads * hd});
    auto attn = tp.linear_leave(p, y, "attention.dense.weight");
    if (auto bias = p.Optional("attention.dense.bias"); bias.defined()) attn = attn + bias;
    out.attn_out = Patched(request, "attn_out", attn);
    // resid_mid = x + attn_out under both residuals. Sequential: the MLP's input, as in every
    // other family. Parallel: the MLP reads x itself, and resid_mid is only the partial sum that
    // resid_post completes (resid_post = resid_mid + mlp_out); patching it changes resid_post,
    // not the MLP.
    const torch::Tensor mid = x + out.attn_out;
    out.resid_mid = Patched(request, "resid_mid", mid);
    const torch::Tensor& mlp_in = spec_.parallel_residual ? x : out.resid_mid;
    const torch::Tensor fc =
        tp.enter_linears(p, LayerNorm(mlp_in, p, "post_attention_layernorm"), {{"mlp.dense_h_to_4h.weight", ""}})[0];
    out.mlp_hidden = Patched(
        request, "mlp_hidden",
        FusedBiasGelu(fc, p("mlp.dense_h_to_4h.bias"), /*tanh=*/spec_.activation == strata::Activation::kGeluTanh));
    out.mlp_out = Patched(request, "mlp_out",
                          tp.linear_leave(p, out.mlp_hidden, "mlp.dense_4h_to_h.weight") + p("mlp.dense_4h_to_h.bias"));
    // transformers adds mlp + attn + x (parallel) and mlp + (attn + x) (sequential); kept in
    // that order (fp32 addition is not associative) unless resid_mid was patched.
    const bool mid_patched = !out.resid_mid.is_same(mid);
    out.resid_post =
        Patched(request, "resid_post",
                spec_.parallel_residual && !mid_patched ? out.mlp_out + out.attn_out + x : out.mlp_out + out.resid_mid);
    return out;
  }

  torch::Tensor FinalNorm(const ParamView& p, const torch::Tensor& x) const override {
    return LayerNorm(x, p, "final_layer_norm");
  }

 private:
  torch::Tensor LayerNorm(const torch::Tensor& x, const ParamView& p, const std::string& name) const {
    return FusedLayerNorm(x, p(name + ".weight"), p(name + ".bias"), spec_.norm_eps, compat::ComputeType(x));
  }
};

}  // namespace

std::unique_ptr<ModelFamily> CreateGptNeoxFamily(const ModelSpec& spec) {
  return std::make_unique<GptNeoxFamily>(spec);
}

}  // namespace strata::worker
