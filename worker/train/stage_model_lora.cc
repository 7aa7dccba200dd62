// LoRA's part of StageModel (stage_model.h): the adapters as units, the base frozen beside them.
//
// Every base parameter is loaded once, whole (tp = 1), onto the device and never written again:
// no gradient buffer, no optimizer state, no working copy. The adapters A and B of each targeted
// linear are a block's unit, trained as any unit is (sink, ZeRO-1/2 shards, checkpoints), and
// ParamView::Linear adds their product to the frozen linear's output (model_family.h LoraCompute).
#include <algorithm>
#include <set>

#include "worker/train/stage_model.h"

namespace strata::worker {

void StageModel::BuildLoraUnits(std::map<std::string, model::Parameter> table, int64_t first, int64_t last,
                                const WeightLoader& load, const WeightLoader& base_load) {
  const ModelSpec& m = spec_.model;
  // Only the adapters are units; the base is frozen beside them (FrozenPart). The runs that
  // would shard or split it are refused at submit (run_spec_lora.cc CheckLoraMesh).
  TORCH_CHECK(mesh_.tp == 1 && spec_.parallel.zero < 3 && base_load,
              "LoRA runs on tp = 1 and ZeRO 0-2, with the base's weights to load");
  for (model::Parameter& p : model::LoraParameters(m, spec_.lora)) table.emplace(p.name, std::move(p));
  lora_ = LoraCompute{spec_.lora.scale(), spec_.lora.dropout};
  // The constructor has no Status to return: a weight that cannot be quantized (a NaN in it) is
  // thrown, naming the tensor, and the task fails with that message.
  auto frozen = [&](const std::vector<std::string>& names, bool quantize = false) {
    Result<FrozenPart> part = LoadFrozen(names, table, base_load, quantize);
    TORCH_CHECK(part.ok(), "the frozen base: ", part.status().message());
    return std::move(part).value();
  };
  const bool nf4 = spec_.lora.base == LoraBase::kNf4;
  if (first_stage()) frozen_embed_ = frozen(model::EmbeddingNames(m));
  const std::vector<model::Parameter> block = model::BlockParameters(m);
  const std::vector<model::Parameter> adapters = model::BlockLoraParameters(m, spec_.lora);
  for (int64_t layer = first; layer < last; ++layer) {
    const std::string prefix = model::BlockPrefix(m, layer);
    std::vector<std::string> base, names;
    for (const model::Parameter& p : block) base.push_back(prefix + p.name);
    for (const model::Parameter& p : adapters) names.push_back(prefix + p.name);
    frozen_blocks_.push_back(frozen(base, /*quantize=*/nf4));
    AddUnit("block " + std::to_string(layer) + " (LoRA)", names, table, /*tied_copy=*/false, load);
    block_units_.push_back(static_cast<int>(units_.size() - 1));
  }
  if (last_stage()) {
    std::vector<std::string> names = model::FinalNormNames(m);
    const std::string head = model::HeadWeightName(m);
    frozen_head_ = frozen(names);
    // A tied head on the first stage is the embedding's own tensor.
    const auto& embed = frozen_embed_.names;
    const auto tied = std::find(embed.begin(), embed.end(), head);
    if (tied != embed.end()) {
      frozen_head_.names.push_back(head);
      frozen_head_.tensors.push_back(frozen_embed_.tensors[static_cast<size_t>(tied - embed.begin())]);
    } else {
      FrozenPart weight = frozen({head});
      frozen_head_.names.push_back(head);
      frozen_head_.tensors.push_back(weight.tensors[0]);
    }
  }
}

Result<StageModel::FrozenPart> StageModel::LoadFrozen(const std::vector<std::string>& names,
                                                      const std::map<std::string, model::Parameter>& table,
                                                      const WeightLoader& load, bool quantize) {
  // Matrices (the linears, the embedding tables, the head) in the compute dtype: what the
  // matmuls read, at half fp32's bytes on a bf16 run; the norms' and biases' vectors in fp32, as
  // the fused norms take them. QLoRA's block matrices as NF4, quantized on the host as each one
  // streams from its source (never the whole model in memory).
  const torch::ScalarType matrices =
      spec_.train.precision == Precision::kBf16 && device_.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  FrozenPart part;
  torch::NoGradGuard no_grad;
  for (const std::string& name : names) {
    const model::Parameter& p = table.at(name);
    const bool nf4 = quantize && p.shape.size() == 2;
    torch::Tensor held;
    std::shared_ptr<Nf4Weight> quantized;
    if (!nf4) {
      held = torch::empty(p.shape,
                          torch::TensorOptions().dtype(p.shape.size() == 2 ? matrices : torch::kFloat).device(device_));
    }
    // A loader that failed stops at its first error, leaving the tensor unwritten (as AddUnit's):
    // the caller reports the error before anything runs.
    Status status;
    load(p, [&](const torch::Tensor& whole) {
      if (!nf4) {
        // In the source's dtype to the device, converted there (as AddUnit).
        held.copy_(whole.contiguous().to(held.device()).view(p.shape));
        return;
      }
      auto q = QuantizeNf4Weight(whole.contiguous().view(p.shape), device_, matrices);
      if (!q.ok()) {
        status = InvalidArgument(name + ": " + q.status().message());
        return;
      }
      quantized = std::make_shared<Nf4Weight>(std::move(q).value());
    });
    STRATA_RETURN_IF_ERROR(status);
    part.names.push_back(name);
    part.tensors.push_back(held);
    if (quantize) part.nf4.push_back(quantized);
  }
  return part;
}

std::vector<std::pair<std::string, torch::Tensor>> StageModel::frozen_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::set<std::string> listed;  // a tied head is the embedding's tensor: listed once
  auto add = [&](const FrozenPart& part) {
    for (size_t i = 0; i < part.names.size(); ++i) {
      if (!listed.insert(part.names[i]).second) continue;
      const bool nf4 = !part.nf4.empty() && part.nf4[i] != nullptr;
      out.emplace_back(part.names[i], nf4 ? DequantizeNf4Weight(*part.nf4[i]) : part.tensors[i]);
    }
  };
  add(frozen_embed_);
  for (const FrozenPart& part : frozen_blocks_) add(part);
  add(frozen_head_);
  return out;
}

}  // namespace strata::worker
