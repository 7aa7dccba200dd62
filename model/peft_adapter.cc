#include "model/peft_adapter.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "model/parameters.h"
#include "storage/safetensors.h"

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

Status CheckPeftAdapter(const std::string& dir, const ModelSpec& m, const LoraSpec& lora) {
  const std::string path = dir + "/adapter_model.safetensors";
  auto file = storage::MappedSafetensors::Open(path);
  if (!file.ok()) return InvalidArgument("model.adapter_from: " + file.status().message());
  std::string trained_on = "(not named)";
  if (auto text = ReadSpecFile(dir + "/adapter_config.json", "PEFT adapter config", 1 << 20); text.ok()) {
    const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_object() && config.contains("base_model_name_or_path") &&
        config["base_model_name_or_path"].is_string())
      trained_on = "\"" + config["base_model_name_or_path"].get<std::string>() + "\"";
  }
  const std::string base = m.init_from.empty() ? std::string("the base drawn from train.seed")
                                               : "the base model.init_from = \"" + m.init_from + "\"";
  const auto& tensors = (*file)->tensors();
  std::set<std::string> expected;
  for (const Parameter& p : LoraParameters(m, lora)) {
    const std::string name = PeftTensorName(m, p.name);
    expected.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return InvalidArgument("model.adapter_from: " + path + " has no tensor '" + name +
                             "', which its target_modules imply for " + base + " (" + std::to_string(m.layers) +
                             " layers); the adapter was trained on another base, " + trained_on);
    }
    if (it->second.shape != p.shape) {
      return InvalidArgument("model.adapter_from: " + path + "'s '" + name + "' has shape " +
                             ShapeText(it->second.shape) + " but " + base + " needs " + ShapeText(p.shape) +
                             "; the adapter was trained on another base, " + trained_on);
    }
    const storage::DType d = it->second.dtype;
    if (d != storage::DType::kF32 && d != storage::DType::kBF16 && d != storage::DType::kF16) {
      return InvalidArgument("model.adapter_from: " + path + "'s '" + name + "' has dtype " + storage::DTypeName(d) +
                             "; adapters load from F32, BF16 or F16");
    }
  }
  for (const auto& [name, view] : tensors) {
    if (!expected.count(name) && name.find(".lora_") != std::string::npos) {
      return InvalidArgument("model.adapter_from: " + path + " holds '" + name + "', which adapts no linear of " +
                             base + "; the adapter was trained on another base, " + trained_on);
    }
  }
  return Status::Ok();
}

Status CheckAdapterFrom(const ModelSpec& m, const LoraSpec& run_lora) {
  if (m.adapter_from.empty()) return Status::Ok();
  // A train run's [lora] is the adapter's (ParseLora); others merge the adapter as it was saved.
  LoraSpec lora = run_lora;
  if (!lora.enabled) {
    STRATA_ASSIGN_OR_RETURN(lora, ReadPeftLoraConfig(m.adapter_from, m));
  }
  return CheckPeftAdapter(m.adapter_from, m, lora);
}

}  // namespace strata::model
