// The run spec's [lora] table (run_spec.h LoraSpec): LoRA adapters on a family's linears.
#include <algorithm>
#include <cmath>
#include <optional>

#include "spec/run_spec.h"
#include "spec/run_spec_reader.h"

namespace strata {

double LoraSpec::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

const std::vector<std::string>& LoraTargetModules(Family family) {
  static const std::vector<std::string> gpt2 = {"c_attn", "c_proj", "c_fc"};
  static const std::vector<std::string> neox = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};
  static const std::vector<std::string> llama = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  if (family == Family::kGpt2) return gpt2;
  if (family == Family::kGptNeox) return neox;
  return llama;
}

// PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for these model types.
const std::vector<std::string>& DefaultLoraTargets(Family family) {
  static const std::vector<std::string> gpt2 = {"c_attn"};
  static const std::vector<std::string> neox = {"query_key_value"};
  static const std::vector<std::string> llama = {"q_proj", "v_proj"};
  if (family == Family::kGpt2) return gpt2;
  if (family == Family::kGptNeox) return neox;
  return llama;
}

int64_t LoraNarrowestWidth(const ModelSpec& m, const std::vector<std::string>& modules) {
  const int64_t h = m.hidden, f = m.ffn, q = m.heads * m.head_size(), kv = m.kv_heads * m.head_size();
  int64_t narrowest = h;
  for (const std::string& module : modules) {
    if (module == "q_proj" || module == "o_proj") narrowest = std::min(narrowest, q);
    if (module == "k_proj" || module == "v_proj") narrowest = std::min(narrowest, kv);
    if (module == "gate_proj" || module == "up_proj" || module == "down_proj" || module == "c_fc" ||
        module == "c_proj" || module == "dense_h_to_4h" || module == "dense_4h_to_h")
      narrowest = std::min(narrowest, f);
  }
  return narrowest;
}

namespace run_spec_internal {

Status ParseLora(Reader& r, bool present, bool resolve_config, RunSpec* spec) {
  LoraSpec& l = spec->lora;
  // model.adapter_from: read (and checked) wherever the user's spec is parsed; a train run
  // continues that adapter, so [lora] is implied and its absent fields are the adapter's.
  const std::string& adapter = spec->model.adapter_from;
  std::optional<LoraSpec> config;
  if (!adapter.empty() && resolve_config) {
    auto read = ReadPeftLoraConfig(adapter, spec->model);
    if (!read.ok()) return read.status();
    config = std::move(read).value();
  }
  l.enabled = present || (!adapter.empty() && spec->kind == RunKind::kTrain);
  if (!l.enabled) return Status::Ok();
  if (config) l = *config;
  if (present && spec->kind != RunKind::kTrain) {
    return InvalidArgument("run spec: [lora] applies to train runs (kind = \"train\"); remove it from this " +
                           std::string(Name(spec->kind)) + " run");
  }
  const ModelSpec& m = spec->model;
  const std::string family(Name(m.family));
  const std::vector<std::string>& modules = LoraTargetModules(m.family);
  auto listed = [&] {
    std::string list;
    for (const auto& module : modules) list += (list.empty() ? "" : ", ") + module;
    return list;
  };
  if (r.Has("lora", "modules_to_save")) {
    return InvalidArgument(
        "run spec: lora.modules_to_save is not built yet: every base weight stays frozen under [lora]; remove it "
        "(or train every weight: remove [lora])");
  }
  if (r.IsString("lora", "target_modules")) {
    std::string word;
    STRATA_RETURN_IF_ERROR(r.String("lora", "target_modules", &word));
    if (word != "all-linear") {
      return InvalidArgument("run spec: lora.target_modules = \"" + word +
                             "\" is not a list; give a list of module names (" + family + ": " + listed() +
                             ") or \"all-linear\"");
    }
    l.target_modules = modules;
  } else if (r.Has("lora", "target_modules")) {
    std::vector<std::string> given;
    STRATA_RETURN_IF_ERROR(r.StringList("lora", "target_modules", &given));
    if (given.empty()) {
      return InvalidArgument("run spec: lora.target_modules is empty; name at least one of " + family + "'s linears (" +
                             listed() + ") or \"all-linear\"");
    }
    for (const std::string& name : given) {
      if (std::find(modules.begin(), modules.end(), name) == modules.end()) {
        return InvalidArgument("run spec: lora.target_modules holds \"" + name + "\", which " + family +
                               " has no linear named; its modules are " + listed() + " (or \"all-linear\")");
      }
    }
    // The family's order, each once: one layout of the adapters whatever the spelling.
    l.target_modules.clear();
    for (const auto& module : modules) {
      if (std::find(given.begin(), given.end(), module) != given.end()) l.target_modules.push_back(module);
    }
  } else if (!config) {
    l.target_modules = DefaultLoraTargets(m.family);
  }
  STRATA_RETURN_IF_ERROR(r.Int("lora", "rank", &l.rank, 1, spec_bounds::kHidden));
  const int64_t narrowest = LoraNarrowestWidth(m, l.target_modules);
  if (l.rank > narrowest) {
    return InvalidArgument("run spec: lora.rank = " + std::to_string(l.rank) +
                           " is above the narrowest targeted matrix's width, " + std::to_string(narrowest) +
                           "; an adapter's rank must be at most its matrix's rows and columns (usual ranks are 8-64)");
  }
  STRATA_RETURN_IF_ERROR(r.Float("lora", "alpha", &l.alpha, 0.0, 1e6));
  if (!(l.alpha > 0)) {
    return InvalidArgument("run spec: lora.alpha = 0 must be > 0 (the adapters' output is scaled by alpha / rank)");
  }
  STRATA_RETURN_IF_ERROR(r.Float("lora", "dropout", &l.dropout, 0.0, 1.0));
  if (!(l.dropout < 1.0)) {
    return InvalidArgument("run spec: lora.dropout = 1 would drop every input of the adapters; use [0, 1)");
  }
  STRATA_RETURN_IF_ERROR(r.Bool("lora", "use_rslora", &l.use_rslora));
  std::optional<std::string> unknown_base;
  STRATA_RETURN_IF_ERROR(r.Choice("lora", "base", &l.base, &unknown_base));
  if (unknown_base) {
    return InvalidArgument(
        "run spec: lora.base = \"" + *unknown_base + "\" is not supported; use \"dense\" (the base " +
        "in the compute dtype) or \"nf4\" (QLoRA's 4-bit base)" +
        (*unknown_base == "fp4" || *unknown_base == "int8" ? "; " + *unknown_base + " is not built yet" : ""));
  }
  if (config) {
    // What the spec states must be the adapter's: another rank, scale or set of linears is
    // another function than the one the adapter learned.
    auto disagree = [&](const std::string& field, const std::string& ours, const std::string& theirs,
                        const std::string& key) {
      return InvalidArgument("run spec: lora." + field + " = " + ours + " but model.adapter_from = \"" + adapter +
                             "\" has " + key + " = " + theirs + " in adapter_config.json; remove lora." + field +
                             " (the adapter supplies it) or use an "
                             "adapter trained with " +
                             ours);
    };
    auto list = [](const std::vector<std::string>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", \"" : "\"") + v[i] + "\"";
      return out + "]";
    };
    if (l.rank != config->rank) return disagree("rank", std::to_string(l.rank), std::to_string(config->rank), "r");
    if (l.alpha != config->alpha)
      return disagree("alpha", ShortestNumber(l.alpha), ShortestNumber(config->alpha), "lora_alpha");
    if (l.target_modules != config->target_modules)
      return disagree("target_modules", list(l.target_modules), list(config->target_modules), "target_modules");
    if (l.use_rslora != config->use_rslora) {
      return disagree("use_rslora", l.use_rslora ? "true" : "false", config->use_rslora ? "true" : "false",
                      "use_rslora");
    }
  }
  return Status::Ok();
}

Status CheckLoraMesh(const RunSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  auto fixed = [&](const char* field) { return !p.automatic.count(field); };
  if (fixed("tp") && p.tp > 1) {
    return InvalidArgument("run spec: parallel.tp = " + std::to_string(p.tp) +
                           ": LoRA under tensor parallelism is not built yet; use parallel.tp = 1 (or \"auto\") "
                           "and dp / pp / zero 1-2 to spread the run");
  }
  if (fixed("zero") && p.zero == 3) {
    return InvalidArgument(
        "run spec: parallel.zero = 3: LoRA with sharded parameters is not built yet (the adapters are small; the "
        "frozen base is what ZeRO-3 would shard); use parallel.zero = 0-2 (or \"auto\")");
  }
  if (p.offload == Offload::kOptimizerAndParams) {
    return InvalidArgument(
        "run spec: parallel.offload = \"optimizer+params\" streams ZeRO-3 parameters, which LoRA does not run on yet; "
        "use \"none\" or \"optimizer\" (or \"auto\")");
  }
  return Status::Ok();
}

}  // namespace run_spec_internal
}  // namespace strata
