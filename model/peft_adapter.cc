#include "model/peft_adapter.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/parameters.h"

namespace strata::model {

std::string PeftTensorName(const ModelSpec& m, const std::string& ours) {
  return "base_model.model." + ToHuggingFace(m, ours).name;
}

std::string FromPeftTensorName(const ModelSpec& m, const LoraSpec& lora, const std::string& peft) {
  for (const Parameter& p : LoraParameters(m, lora)) {
    if (PeftTensorName(m, p.name) == peft) return p.name;
  }
  return "";
}

std::string PeftAdapterConfigJson(const ModelSpec& m, const LoraSpec& lora) {
  nlohmann::json alpha = lora.alpha;
  if (std::floor(lora.alpha) == lora.alpha && std::abs(lora.alpha) < 1e9) alpha = static_cast<int64_t>(lora.alpha);
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", lora.rank},
      {"lora_alpha", alpha},
      {"lora_dropout", lora.dropout},
      {"target_modules", lora.target_modules},
      {"use_rslora", lora.use_rslora},
      {"bias", "none"},
      {"fan_in_fan_out", m.family == Family::kGpt2},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"base_model_name_or_path", m.init_from},
  };
  return config.dump(2) + "\n";
}

}  // namespace strata::model
