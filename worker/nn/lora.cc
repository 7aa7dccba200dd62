#include "worker/nn/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "model/parameters.h"
#include "model/peft_adapter.h"
#include "storage/safetensors.h"

namespace strata::worker {

std::map<std::string, torch::Tensor> InitialLoraAdapters(const ModelSpec& model, const LoraSpec& lora, int64_t seed) {
  // Its own stream (not the global generator the base's initialisation draws from): adding
  // adapters changes no base weight. 0x4c6f5241 is "LoRA".
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(seed) ^ 0x4c6f5241u);
  std::map<std::string, torch::Tensor> out;
  torch::NoGradGuard no_grad;
  for (const model::Parameter& p : model::LoraParameters(model, lora)) {
    torch::Tensor t = torch::zeros(p.shape, torch::kFloat);
    const bool is_a = p.name.size() > 14 && p.name.compare(p.name.size() - 14, 14, ".lora_A.weight") == 0;
    if (is_a) {
      // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      t.uniform_(-bound, bound, generator);
    }
    out.emplace(p.name, t);
  }
  return out;
}

Result<std::map<std::string, torch::Tensor>> ReadPeftAdapter(const std::string& dir, const ModelSpec& model,
                                                             const LoraSpec& lora) {
  STRATA_RETURN_IF_ERROR(model::CheckPeftAdapter(dir, model, lora));
  STRATA_ASSIGN_OR_RETURN(auto file, storage::MappedSafetensors::Open(dir + "/adapter_model.safetensors"));
  std::map<std::string, torch::Tensor> out;
  for (const model::Parameter& p : model::LoraParameters(model, lora)) {
    const storage::TensorView& view = file->tensors().at(model::PeftTensorName(model, p.name));
    const torch::ScalarType type = view.dtype == storage::DType::kF32    ? torch::kFloat
                                   : view.dtype == storage::DType::kBF16 ? torch::kBFloat16
                                                                         : torch::kHalf;
    // A copy out of the mapping (freed with `file`), widened to fp32.
    out.emplace(
        p.name,
        torch::from_blob(const_cast<uint8_t*>(view.bytes.data()), p.shape, type).to(torch::kFloat, false, true));
  }
  return out;
}

Status MergePeftAdapter(const std::string& dir, const ModelSpec& model,
                        const torch::OrderedDict<std::string, torch::Tensor>& params) {
  STRATA_ASSIGN_OR_RETURN(const LoraSpec lora, ReadPeftLoraConfig(dir, model));
  STRATA_ASSIGN_OR_RETURN(auto adapters, ReadPeftAdapter(dir, model, lora));
  torch::NoGradGuard no_grad;
  const double scale = lora.scale();
  for (const model::Parameter& p : model::LoraParameters(model, lora)) {
    constexpr std::string_view kA = ".lora_A.weight";
    if (p.name.size() < kA.size() || p.name.compare(p.name.size() - kA.size(), kA.size(), kA) != 0) continue;
    const std::string stem = p.name.substr(0, p.name.size() - kA.size());
    const torch::Tensor* weight = params.find(stem + ".weight");
    if (!weight) return Internal("the model has no weight " + stem + ".weight for its adapter");
    torch::Tensor w = *weight;
    const torch::Tensor delta =
        torch::matmul(adapters.at(stem + ".lora_B.weight"), adapters.at(p.name)).mul_(scale).to(w.device());
    w.copy_(w.to(torch::kFloat).add_(delta));
  }
  return Status::Ok();
}

}  // namespace strata::worker
