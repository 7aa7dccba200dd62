#include "worker/direct_forward.h"

#include <torch/torch.h>

#include "worker/causal_lm.h"
#include "worker/token_data.h"

namespace strata::worker {

Result<std::string> DirectForwardActivations(const RunSpec& spec, int64_t layer, const std::string& site) {
  try {
    if (spec.worker.threads > 0) torch::set_num_threads(static_cast<int>(spec.worker.threads));
    STRATA_ASSIGN_OR_RETURN(auto model, BuildCausalLm(spec.model, spec.train.seed));
    STRATA_ASSIGN_OR_RETURN(TokenData data, TokenData::Load(spec.data, spec.model.vocab, spec.model.sequence,
                                                            TokenData::Access::kSequential));
    torch::NoGradGuard no_grad;
    model->eval();
    const torch::ScalarType stored = ScalarTypeOf(spec.extract.dtype);
    const int64_t t = spec.model.sequence;
    const int64_t sequences = ExtractSequences(spec, static_cast<int64_t>(data.size()));
    std::string out;
    for (int64_t begin = 0; begin < sequences; begin += spec.extract.batch) {
      const int64_t end = std::min(begin + spec.extract.batch, sequences);
      auto tokens = torch::empty({end - begin, t}, torch::kLong);
      STRATA_RETURN_IF_ERROR(data.Read(begin * t, (end - begin) * t, tokens.data_ptr<int64_t>()));
      model->RunBlocks(tokens, layer, [&](int64_t l, const BlockOutputs& block) {
        if (l != layer) return;
        const torch::Tensor& v = site == "attn_out" ? block.attn_out : site == "mlp_out" ? block.mlp_out : block.resid_post;
        auto rows = v.reshape({-1, spec.model.hidden}).to(stored).contiguous();
        out.append(static_cast<const char*>(rows.data_ptr()), static_cast<size_t>(rows.numel() * rows.element_size()));
      });
    }
    return out;
  } catch (const c10::Error& e) {
    return Internal(std::string("direct forward pass failed: ") + e.what_without_backtrace());
  }
}

}  // namespace strata::worker
