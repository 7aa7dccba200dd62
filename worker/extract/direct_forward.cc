#include "worker/extract/direct_forward.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "worker/nn/causal_lm.h"
#include "worker/token_data.h"

namespace strata::worker {
namespace {

// The model of `spec` (from its seed, as a worker builds it) run over the run's sequences in
// chunks of extract.batch, as workers chunk them: `use(model, tokens)` per chunk, tokens
// [sequences in the chunk, sequence] int64. LibTorch errors come back as Internal.
Status ForEachChunk(const RunSpec& spec, const std::function<Status(CausalLm&, const torch::Tensor&)>& use) {
  try {
    if (spec.worker.threads > 0) torch::set_num_threads(static_cast<int>(spec.worker.threads));
    STRATA_ASSIGN_OR_RETURN(auto model, BuildCausalLm(spec.model, spec.train.seed));
    STRATA_ASSIGN_OR_RETURN(TokenData data, TokenData::Load(spec.data, spec.model.vocab, spec.model.sequence,
                                                            TokenData::Access::kSequential));
    torch::NoGradGuard no_grad;
    model->eval();
    const int64_t t = spec.model.sequence;
    const int64_t sequences = ExtractSequences(spec, static_cast<int64_t>(data.size()));
    for (int64_t begin = 0; begin < sequences; begin += spec.extract.batch) {
      const int64_t end = std::min(begin + spec.extract.batch, sequences);
      auto tokens = torch::empty({end - begin, t}, torch::kLong);
      STRATA_RETURN_IF_ERROR(data.Read(begin * t, (end - begin) * t, tokens.data_ptr<int64_t>()));
      STRATA_RETURN_IF_ERROR(use(*model, tokens));
    }
    return Status::Ok();
  } catch (const c10::Error& e) {
    return Internal(std::string("direct forward pass failed: ") + e.what_without_backtrace());
  }
}

}  // namespace

Result<std::string> DirectForwardActivations(const RunSpec& spec, int64_t layer, const std::string& site) {
  std::vector<std::pair<int64_t, std::string>> names;
  for (const auto& name : ExtractRecordNames(spec)) {
    if (name.first == layer) names.push_back(name);
  }
  if (std::find(names.begin(), names.end(), std::make_pair(layer, site)) == names.end()) {
    return InvalidArgument("the run captures no site " + site + " at layer " + std::to_string(layer));
  }
  std::string out;
  STRATA_RETURN_IF_ERROR(ForEachChunk(spec, [&](CausalLm& model, const torch::Tensor& tokens) {
    model.RunBlocks(
        tokens, layer,
        [&](int64_t l, const BlockOutputs& block) {
          if (l != layer) return;
          std::vector<torch::Tensor> rows = ExtractRows(model, spec, layer, block, tokens);
          for (size_t i = 0; i < names.size(); ++i) {
            if (names[i] != std::make_pair(layer, site)) continue;
            auto r = rows[i].contiguous();
            out.append(static_cast<const char*>(r.data_ptr()), static_cast<size_t>(r.numel() * r.element_size()));
          }
        },
        [&](int64_t l) { return ExtractRequest(spec, l); });
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<float>> DirectForwardPatchedLoss(const RunSpec& spec, const std::vector<float>& mean) {
  const int64_t t = spec.model.sequence;
  std::vector<float> out;
  STRATA_RETURN_IF_ERROR(ForEachChunk(spec, [&](CausalLm& model, const torch::Tensor& tokens) {
    const int64_t n = tokens.size(0);
    // The ablation as a plain loop over the blocks, not through ExtractRequest.
    auto x = model.Embed(tokens);
    for (int64_t layer = 0; layer < spec.model.layers; ++layer) {
      BlockRequest request;
      if (std::binary_search(spec.patch.layers.begin(), spec.patch.layers.end(), layer)) {
        request.patch = [&](const std::string& site, const torch::Tensor& value) {
          const auto& sites = spec.patch.sites;
          if (std::find(sites.begin(), sites.end(), site) == sites.end()) return value;
          if (mean.empty()) return value * 0;
          const torch::Tensor v =
              torch::from_blob(const_cast<float*>(mean.data()), {static_cast<int64_t>(mean.size())}, torch::kFloat);
          if (spec.patch.ablation == Ablation::kSteer) return value + v * spec.patch.alpha;
          return v.expand_as(value);
        };
      }
      x = model.RunBlock(layer, x, request).resid_post;
    }
    auto logits = model.Head(model.FinalNorm(x)).to(torch::kFloat);
    // Cross-entropy of position p predicting token p + 1; the last position has none (NaN).
    auto loss = torch::nn::functional::cross_entropy(
                    logits.narrow(1, 0, t - 1).reshape({-1, logits.size(-1)}), tokens.narrow(1, 1, t - 1).reshape({-1}),
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
                    .reshape({n, t - 1});
    auto rows = torch::cat({loss, torch::full({n, 1}, std::nanf(""))}, 1).reshape({-1}).contiguous();
    out.insert(out.end(), rows.data_ptr<float>(), rows.data_ptr<float>() + rows.numel());
    return Status::Ok();
  }));
  return out;
}

}  // namespace strata::worker
