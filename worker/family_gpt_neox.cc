// GPT-NeoX (Black et al. 2022; Pythia): LayerNorm with bias, the fused query_key_value laid out
// per head as [q | k | v] (so a head's rows are contiguous), rotary embeddings on the first
// rotary_pct of each head's dimensions, GELU MLP, and - with use_parallel_residual, as in every
// Pythia - attention and MLP side by side on the same input:
//   x' = x + attn(ln1(x)) + mlp(ln2(x))          (parallel)
//   h = x + attn(ln1(x));  x' = h + mlp(ln2(h))  (sequential)
// The head (embed_out) is untied unless tie_word_embeddings.
#include "worker/model_family.h"
#include "worker/torch_compat.h"

namespace strata::worker {
namespace {

class GptNeoxFamily : public ModelFamily {
 public:
  using ModelFamily::ModelFamily;

  BlockOutputs Block(const ParamView& p, const torch::Tensor& x, const TensorParallel& tp) const override {
    const int64_t b = x.size(0), t = x.size(1), hd = spec_.head_size(), heads = spec_.heads / tp.size;
    auto [cos, sin] = Rotary(x);
    auto a = tp.enter(LayerNorm(x, p, "input_layernorm"));
    auto qkv = torch::linear(a, p("attention.query_key_value.weight"), p.Optional("attention.query_key_value.bias"))
                   .view({b, t, heads, 3 * hd})
                   .transpose(1, 2);
    auto parts = qkv.chunk(3, -1);
    auto q = ApplyRotary(parts[0], cos, sin), k = ApplyRotary(parts[1], cos, sin);
    auto y = compat::CausalAttention(q, k, parts[2]).transpose(1, 2).reshape({b, t, heads * hd});
    BlockOutputs out;
    out.attn_out = tp.leave(torch::linear(y, p("attention.dense.weight")));
    if (auto bias = p.Optional("attention.dense.bias"); bias.defined()) out.attn_out = out.attn_out + bias;
    const torch::Tensor mlp_in = spec_.parallel_residual ? x : x + out.attn_out;
    auto m = tp.enter(LayerNorm(mlp_in, p, "post_attention_layernorm"));
    m = Activation(torch::linear(m, p("mlp.dense_h_to_4h.weight"), p("mlp.dense_h_to_4h.bias")));
    out.mlp_out = tp.leave(torch::linear(m, p("mlp.dense_4h_to_h.weight"))) + p("mlp.dense_4h_to_h.bias");
    // transformers adds mlp + attn + x (parallel) and mlp + (attn + x) (sequential).
    out.resid_post = spec_.parallel_residual ? out.mlp_out + out.attn_out + x : out.mlp_out + mlp_in;
    return out;
  }

  torch::Tensor FinalNorm(const ParamView& p, const torch::Tensor& x) const override { return LayerNorm(x, p, "final_layer_norm"); }

 private:
  torch::Tensor LayerNorm(const torch::Tensor& x, const ParamView& p, const std::string& name) const {
    return torch::layer_norm(x, {spec_.hidden}, p(name + ".weight"), p(name + ".bias"), spec_.norm_eps);
  }
};

}  // namespace

std::unique_ptr<ModelFamily> CreateGptNeoxFamily(const ModelSpec& spec) { return std::make_unique<GptNeoxFamily>(spec); }

}  // namespace strata::worker
