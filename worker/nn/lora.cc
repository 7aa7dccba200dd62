#include "worker/nn/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "model/parameters.h"

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

}  // namespace strata::worker
