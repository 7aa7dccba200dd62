// model.adapter_from's adapter_config.json (run_spec.h ReadPeftLoraConfig): PEFT's LoraConfig as
// save_pretrained writes it, read into a LoraSpec for a base of the spec's family.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "spec/run_spec.h"

namespace strata {

std::string ShortestNumber(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

Result<LoraSpec> ReadPeftLoraConfig(const std::string& dir, const ModelSpec& model) {
  const std::string path = dir + "/adapter_config.json";
  auto text = ReadSpecFile(path, "PEFT adapter config", 1 << 20);
  if (!text.ok()) {
    return InvalidArgument("run spec: model.adapter_from = \"" + dir + "\": " + text.status().message() +
                           "; point it at a directory saved by PEFT's save_pretrained or `strata export --adapter`");
  }
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return InvalidArgument("run spec: model.adapter_from: " + path + " " + what);
  };
  if (!config.is_object()) return bad("is not a JSON object");
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = config.find(key);
    return it == config.end() || it->is_null() ? nullptr : &*it;
  };
  const nlohmann::json* type = field("peft_type");
  if (!type || !type->is_string() || type->get<std::string>() != "LORA") {
    return bad("has peft_type = " + (type ? type->dump() : std::string("(none)")) +
               "; Strata loads LoRA adapters (peft_type \"LORA\")");
  }
  if (const auto* dora = field("use_dora"); dora && dora->is_boolean() && dora->get<bool>())
    return bad("has use_dora = true; DoRA adapters are not supported (plain LoRA only)");
  if (const auto* bias = field("bias"); bias && (!bias->is_string() || bias->get<std::string>() != "none"))
    return bad("has bias = " + bias->dump() + "; Strata's adapters train no biases (bias \"none\")");
  if (const auto* save = field("modules_to_save"); save && !(save->is_array() && save->empty()))
    return bad("has modules_to_save = " + save->dump() +
               "; modules trained in full beside the adapters are not "
               "built yet");
  LoraSpec lora;
  lora.enabled = true;
  const nlohmann::json* r = field("r");
  if (!r || !r->is_number_integer() || r->get<int64_t>() < 1 || r->get<int64_t>() > spec_bounds::kHidden)
    return bad("has r = " + (r ? r->dump() : std::string("(none)")) + "; a LoRA rank is an integer >= 1");
  lora.rank = r->get<int64_t>();
  if (const auto* alpha = field("lora_alpha")) {
    if (!alpha->is_number() || !std::isfinite(alpha->get<double>()) || !(alpha->get<double>() > 0))
      return bad("has lora_alpha = " + alpha->dump() + "; it must be a number > 0");
    lora.alpha = alpha->get<double>();
  }
  if (const auto* dropout = field("lora_dropout")) {
    if (!dropout->is_number() || !(dropout->get<double>() >= 0 && dropout->get<double>() < 1))
      return bad("has lora_dropout = " + dropout->dump() + "; it must be in [0, 1)");
    lora.dropout = dropout->get<double>();
  }
  if (const auto* rslora = field("use_rslora")) {
    if (!rslora->is_boolean()) return bad("has use_rslora = " + rslora->dump() + "; it must be true or false");
    lora.use_rslora = rslora->get<bool>();
  }
  const std::vector<std::string>& modules = LoraTargetModules(model.family);
  std::string listed;
  for (const auto& m : modules) listed += (listed.empty() ? "" : ", ") + m;
  const std::string family(Name(model.family));
  const nlohmann::json* targets = field("target_modules");
  std::vector<std::string> given;
  if (targets && targets->is_string() && targets->get<std::string>() == "all-linear") {
    given = modules;
  } else if (targets && targets->is_array() && !targets->empty()) {
    for (const auto& t : *targets) {
      if (!t.is_string()) return bad("has a target_modules entry " + t.dump() + " that is no module name");
      const std::string name = t.get<std::string>();
      if (std::find(modules.begin(), modules.end(), name) == modules.end()) {
        return bad("targets \"" + name + "\", which " + family + " has no linear named (its modules: " + listed +
                   "); the adapter was made for another family");
      }
      given.push_back(name);
    }
  } else {
    return bad("has target_modules = " + (targets ? targets->dump() : std::string("(none)")) +
               "; Strata reads a list of module names (" + family + ": " + listed + ") or \"all-linear\"");
  }
  for (const auto& m : modules)  // the family's order, each once (PEFT saves a set)
    if (std::find(given.begin(), given.end(), m) != given.end()) lora.target_modules.push_back(m);
  const int64_t narrowest = LoraNarrowestWidth(model, lora.target_modules);
  if (lora.rank > narrowest) {
    return bad("has r = " + std::to_string(lora.rank) + ", above the narrowest targeted matrix's width of this base, " +
               std::to_string(narrowest) + "; the adapter was made for another base");
  }
  return lora;
}

}  // namespace strata
