// Gemma (Gemma Team 2024), version 1: the Llama block (family_llama.h) with RMSNorm
// x_hat * (1 + w) computed in fp32 and cast back after the scale, GeGLU with the tanh GELU,
// head_dim 256 by default, the token embeddings scaled by sqrt(hidden) - a factor rounded to the
// activations' dtype first, as transformers does - and the head tied to the embedding.
#include <cmath>

#include "worker/nn/family_llama.h"

namespace strata::worker {
namespace {

class GemmaFamily : public LlamaFamily {
 public:
  using LlamaFamily::LlamaFamily;

  torch::Tensor Embed(const ParamView& p, const torch::Tensor& tokens, const TensorParallel& tp) const override {
    auto x = p.Lookup("embed_tokens.weight", tokens, tp.lookup);
    auto normalizer = torch::scalar_tensor(std::sqrt(static_cast<double>(spec_.hidden)), x.options());
    return x * normalizer;
  }

 protected:
  torch::Tensor Norm(const torch::Tensor& x, const torch::Tensor& weight) const override {
    return RmsNorm(x, weight, spec_.norm_eps, /*gemma_style=*/true);
  }
  // Gemma's norm has no fused form: the residual adds stay LibTorch's.
  NormedResidual ResidualNorm(const torch::Tensor& x, const torch::Tensor& weight) const override {
    return {x, Norm(x, weight)};
  }
  NormedResidual AddNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight) const override {
    auto sum = x + y;
    return {sum, Norm(sum, weight)};
  }
};

}  // namespace

std::unique_ptr<ModelFamily> CreateGemmaFamily(const ModelSpec& spec) { return std::make_unique<GemmaFamily>(spec); }

}  // namespace strata::worker
