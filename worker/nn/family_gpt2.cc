// GPT-2 (Radford et al. 2019): token + learned position embeddings, pre-LayerNorm blocks
//   x += attn_proj(attn(c_attn(ln_1(x))));  x += mlp_proj(gelu_tanh(c_fc(ln_2(x))))
// with causal multi-head attention (the fused c_attn holds q, k, v), final LayerNorm, LM head
// tied to wte. Initialisation as GPT-2: N(0, 0.02), positions N(0, 0.01), the residual
// projections N(0, 0.02 / sqrt(2 * layers)).
#include <cmath>

#include "worker/nn/fused_ops.h"
#include "worker/nn/model_family.h"
#include "worker/nn/torch_compat.h"

namespace strata::worker {
namespace {

class Gpt2Family : public ModelFamily {
 public:
  using ModelFamily::ModelFamily;

  torch::Tensor Embed(const ParamView& p, const torch::Tensor& tokens, const TensorParallel& tp) const override {
    auto positions = torch::arange(tokens.size(1), torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
    return p.Lookup("wte.weight", tokens, tp.lookup) + p.Lookup("wpe.weight", positions);
  }

  BlockOutputs Block(const ParamView& p, const torch::Tensor& x_in, const TensorParallel& tp,
                     const BlockRequest& request = {}) const override {
    const int64_t hd = spec_.head_size(), heads = spec_.heads / tp.size;
    const double eps = spec_.norm_eps;
    BlockOutputs out;
    out.resid_pre = Patched(request, "resid_pre", x_in);
    const torch::Tensor& x = out.resid_pre;
    const torch::ScalarType compute = compat::ComputeType(x);
    // Unpatched, each LayerNorm takes in the residual add beside it (fused_ops.h), so backward
    // sums the residual stream's two gradients in the norm's kernel, not in autograd's adds. A
    // patch may replace resid_mid between its add and ln_2: op by op, every site as it always was.
    const bool fuse_residual = !request.patch;
    const NormedResidual first =
        fuse_residual ? FusedResidualLayerNorm(x, p("ln_1.weight"), p("ln_1.bias"), eps, compute)
                      : NormedResidual{x, FusedLayerNorm(x, p("ln_1.weight"), p("ln_1.bias"), eps, compute)};
    const torch::Tensor projected = tp.enter_linears(p, first.normed, {{"c_attn.weight", "c_attn.bias"}})[0];
    const int64_t b = projected.size(0), t = projected.size(1);  // all tokens (x may hold 1/tp: sequence parallel)
    // [b, t, 3 * heads * hd] -> 3 x [b, t, heads, hd] by one unbind of the middle dimension, then
    // the heads-first views attention takes. Backward stacks the three gradients along that
    // dimension: one copy, straight into the projection's [b, t, 3 * heads * hd] layout (three
    // indexings would zero-fill and add three buffers; an unbind of a permuted view would stack
    // heads-first and then copy again to undo the permute).
    const auto qkv = projected.view({b, t, 3, heads, hd}).unbind(2);
    const auto q = qkv[0].transpose(1, 2), k = qkv[1].transpose(1, 2), v = qkv[2].transpose(1, 2);
    out.q = qkv[0];
    out.k = qkv[1];
    out.v = qkv[2];
    if (request.attn_pattern) out.attn_pattern = AttentionPattern(q, k);
    auto y = compat::CausalAttention(q, k, v).transpose(1, 2).reshape({b, t, heads * hd});
    out.attn_out = Patched(request, "attn_out", Projected(y, p, "attn_proj", tp));
    NormedResidual second;
    if (fuse_residual) {
      second = FusedAddLayerNorm(first.residual, out.attn_out, p("ln_2.weight"), p("ln_2.bias"), eps, compute);
      out.resid_mid = second.residual;
    } else {
      out.resid_mid = Patched(request, "resid_mid", x + out.attn_out);
      second = {out.resid_mid, FusedLayerNorm(out.resid_mid, p("ln_2.weight"), p("ln_2.bias"), eps, compute)};
    }
    // The bias and the GELU in one kernel each way (kernels.h BiasGelu), after a bias-free matmul.
    const torch::Tensor fc = tp.enter_linears(p, second.normed, {{"c_fc.weight", ""}})[0];
    out.mlp_hidden = Patched(request, "mlp_hidden", FusedBiasGelu(fc, p("c_fc.bias"), /*tanh=*/true));
    out.mlp_out = Patched(request, "mlp_out", Projected(out.mlp_hidden, p, "mlp_proj", tp));
    out.resid_post = Patched(request, "resid_post", out.resid_mid + out.mlp_out);
    return out;
  }

  torch::Tensor FinalNorm(const ParamView& p, const torch::Tensor& x) const override {
    return FusedLayerNorm(x, p("ln_f.weight"), p("ln_f.bias"), spec_.norm_eps, compat::ComputeType(x));
  }

  // A row-split projection and its bias. One rank: the bias goes into the matmul (one kernel,
  // its output in the compute dtype). Tensor parallel: added once after the partial sums meet.
  static torch::Tensor Projected(const torch::Tensor& y, const ParamView& p, const std::string& name,
                                 const TensorParallel& tp) {
    if (tp.size == 1) return p.Linear(y, name + ".weight", name + ".bias");
    return tp.linear_leave(p, y, name + ".weight") + p(name + ".bias");
  }

  InitRule InitialValues(const std::string& name) const override {
    auto ends_with = [&](const char* suffix) {
      const std::string s(suffix);
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("attn_proj.weight") || ends_with("mlp_proj.weight")) {
      return {.drawn = true, .std = 0.02 / std::sqrt(2.0 * static_cast<double>(spec_.layers))};
    }
    if (name == "wpe.weight") return {.drawn = true, .std = 0.01};
    return ModelFamily::InitialValues(name);
  }
};

}  // namespace

std::unique_ptr<ModelFamily> CreateGpt2Family(const ModelSpec& spec) { return std::make_unique<Gpt2Family>(spec); }

}  // namespace strata::worker
