// GPT-2 (Radford et al. 2019): token + learned position embeddings, pre-LayerNorm blocks
//   x += attn_proj(attn(c_attn(ln_1(x))));  x += mlp_proj(gelu_tanh(c_fc(ln_2(x))))
// with causal multi-head attention (the fused c_attn holds q, k, v), final LayerNorm, LM head
// tied to wte. Initialisation as GPT-2: N(0, 0.02), positions N(0, 0.01), the residual
// projections N(0, 0.02 / sqrt(2 * layers)).
#include <cmath>

#include "worker/model_family.h"
#include "worker/torch_compat.h"

namespace strata::worker {
namespace {

class Gpt2Family : public ModelFamily {
 public:
  using ModelFamily::ModelFamily;

  torch::Tensor Embed(const ParamView& p, const torch::Tensor& tokens) const override {
    auto positions = torch::arange(tokens.size(1), torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
    return torch::embedding(p("wte.weight"), tokens) + torch::embedding(p("wpe.weight"), positions);
  }

  BlockOutputs Block(const ParamView& p, const torch::Tensor& x_in, const TensorParallel& tp,
                     const BlockRequest& request = {}) const override {
    const int64_t b = x_in.size(0), t = x_in.size(1), hd = spec_.head_size(), heads = spec_.heads / tp.size;
    const double eps = spec_.norm_eps;
    BlockOutputs out;
    out.resid_pre = Patched(request, "resid_pre", x_in);
    const torch::Tensor& x = out.resid_pre;
    auto a = tp.enter(torch::layer_norm(x, {spec_.hidden}, p("ln_1.weight"), p("ln_1.bias"), eps));
    // [b, t, 3 * heads * hd] -> 3 x [b, heads, t, hd]
    auto qkv = torch::linear(a, p("c_attn.weight"), p("c_attn.bias")).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    out.q = qkv[0].transpose(1, 2);
    out.k = qkv[1].transpose(1, 2);
    out.v = qkv[2].transpose(1, 2);
    if (request.attn_pattern) out.attn_pattern = AttentionPattern(qkv[0], qkv[1]);
    auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape({b, t, heads * hd});
    out.attn_out = Patched(request, "attn_out", tp.leave(torch::linear(y, p("attn_proj.weight"))) + p("attn_proj.bias"));
    out.resid_mid = Patched(request, "resid_mid", x + out.attn_out);
    auto m = tp.enter(torch::layer_norm(out.resid_mid, {spec_.hidden}, p("ln_2.weight"), p("ln_2.bias"), eps));
    out.mlp_hidden = Patched(request, "mlp_hidden", Activation(torch::linear(m, p("c_fc.weight"), p("c_fc.bias"))));
    out.mlp_out = Patched(request, "mlp_out", tp.leave(torch::linear(out.mlp_hidden, p("mlp_proj.weight"))) + p("mlp_proj.bias"));
    out.resid_post = Patched(request, "resid_post", out.resid_mid + out.mlp_out);
    return out;
  }

  torch::Tensor FinalNorm(const ParamView& p, const torch::Tensor& x) const override {
    return torch::layer_norm(x, {spec_.hidden}, p("ln_f.weight"), p("ln_f.bias"), spec_.norm_eps);
  }

  void Initialize(const std::string& name, torch::Tensor& t) const override {
    torch::NoGradGuard no_grad;
    auto ends_with = [&](const char* suffix) {
      const std::string s(suffix);
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("attn_proj.weight") || ends_with("mlp_proj.weight")) {
      t.normal_(0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(spec_.layers)));
    } else if (name == "wpe.weight") {
      t.normal_(0.0, 0.01);
    } else {
      ModelFamily::Initialize(name, t);
    }
  }
};

}  // namespace

std::unique_ptr<ModelFamily> CreateGpt2Family(const ModelSpec& spec) { return std::make_unique<Gpt2Family>(spec); }

}  // namespace strata::worker
