// The run spec's TOML reading, shared by its parsers (internal to common/: run_spec.cc parses the
// spec, run_spec_sites.cc its [extract] and [patch] tables). Every field is read through Reader,
// which checks its type and bounds and names the field in its message.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::run_spec_internal {

// Allowed keys per table; anything else is an error naming the key.
inline const std::map<std::string, std::set<std::string>>& AllowedKeys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"", {"name", "kind", "model", "data", "train", "parallel", "worker", "extract", "patch", "lora"}},
      {"model", {"family",
                 "layers",
                 "hidden",
                 "heads",
                 "kv_heads",
                 "head_dim",
                 "ffn",
                 "vocab",
                 "sequence",
                 "max_positions",
                 "rope_theta",
                 "rope_scaling",
                 "rotary_pct",
                 "norm_eps",
                 "attention_bias",
                 "mlp_bias",
                 "tie_embeddings",
                 "sliding_window",
                 "parallel_residual",
                 "activation",
                 "init_from",
                 "adapter_from"}},
      {"data", {"path", "format", "documents", "sample_within_documents", "tokenizer"}},
      {"train",
       {"steps", "global_batch", "lr", "lr_schedule", "warmup_steps", "min_lr", "weight_decay", "beta1", "beta2", "eps",
        "grad_clip", "seed", "checkpoint_every", "keep_checkpoints", "precision", "cuda_graphs", "optimizer"}},
      {"parallel",
       {"dp", "pp", "tp", "micro_batch", "zero", "recompute", "keep_gathered", "sequence_parallel", "tp_comm_overlap",
        "stages", "offload"}},
      {"worker", {"threads"}},
      {"extract", {"layers", "sites", "dtype", "precision", "batch", "tokens", "mode", "logits_top_k"}},
      {"patch", {"layers", "sites", "ablation", "source", "alpha", "logits"}},
      {"lora", {"rank", "alpha", "dropout", "target_modules", "use_rslora", "modules_to_save", "base"}},
  };
  return keys;
}

// "gpt2", "llama", ...: every model.family spelling, as the message refusing another lists them.
inline std::string FamilyList() {
  std::string list;
  for (const auto& [_, name] : Choices<Family>::kNames)
    list += (list.empty() ? "\"" : ", \"") + std::string(name) + "\"";
  return list;
}

inline std::string Closest(const std::string& key, const std::set<std::string>& allowed) {
  std::string list;
  for (const auto& k : allowed) list += (list.empty() ? "" : ", ") + k;
  return list;
}

// "run spec: model.layers = 2147483648 is over the bound of 1024; ..." (spec_bounds in run_spec.h).
inline Status OverBound(const std::string& field, const std::string& value, const std::string& bound) {
  return InvalidArgument(
      "run spec: " + field + " = " + value + " is over the bound of " + bound +
      "; Strata refuses larger values (the README's run spec table lists the bounds), use a smaller one");
}

class Reader {
 public:
  explicit Reader(const toml::table& root) : root_(root) {}

  Status CheckKeys() {
    for (const auto& [key, node] : root_) {
      std::string k(key.str());
      const auto& top = AllowedKeys().at("");
      if (!top.count(k)) {
        return InvalidArgument("run spec: unknown key '" + k + "'; top-level keys are: " + Closest(k, top));
      }
      if (k == "name" || k == "kind") continue;
      const toml::table* table = node.as_table();
      if (!table) return InvalidArgument("run spec: '" + k + "' must be a table ([" + k + "])");
      const auto& allowed = AllowedKeys().at(k);
      for (const auto& [sub, _] : *table) {
        std::string s(sub.str());
        if (!allowed.count(s)) {
          return InvalidArgument("run spec: unknown key '" + k + "." + s + "'; keys of [" + k +
                                 "] are: " + Closest(s, allowed));
        }
      }
    }
    return Status::Ok();
  }

  // An integer in [min, max]; `max` is the field's bound from spec_bounds.
  Status Int(const std::string& table, const std::string& key, int64_t* out, int64_t min, int64_t max) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    auto v = node->value<int64_t>();
    if (!node->is_integer() || !v) {
      return InvalidArgument("run spec: " + Path(table, key) + " must be an integer");
    }
    if (*v < min) {
      return InvalidArgument("run spec: " + Path(table, key) + " = " + std::to_string(*v) +
                             " must be >= " + std::to_string(min));
    }
    if (*v > max) return OverBound(Path(table, key), std::to_string(*v), std::to_string(max));
    *out = *v;
    return Status::Ok();
  }

  Status Float(const std::string& table, const std::string& key, double* out, double min, double max) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    auto v = node->value<double>();  // integers convert too
    if (!(node->is_floating_point() || node->is_integer()) || !v) {
      return InvalidArgument("run spec: " + Path(table, key) + " must be a number");
    }
    if (!(*v >= min && *v <= max)) {
      std::ostringstream msg;
      msg << "run spec: " << Path(table, key) << " = " << *v << " must be in [" << min << ", " << max << "]";
      return InvalidArgument(msg.str());
    }
    *out = *v;
    return Status::Ok();
  }

  // An array of integers, or the string `empty_word` (-> empty: "all" layers, "auto" stages).
  Status IntList(const std::string& table, const std::string& key, std::vector<int64_t>* out,
                 const std::string& empty_word = "all") {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    if (node->is_string() && node->value<std::string>() == empty_word) {
      out->clear();
      return Status::Ok();
    }
    const toml::array* array = node->as_array();
    if (!array)
      return InvalidArgument("run spec: " + Path(table, key) + " must be a list of integers or \"" + empty_word + "\"");
    out->clear();
    for (const auto& item : *array) {
      auto v = item.value<int64_t>();
      if (!item.is_integer() || !v)
        return InvalidArgument("run spec: " + Path(table, key) + " must hold integers only");
      out->push_back(*v);
    }
    return Status::Ok();
  }

  Status StringList(const std::string& table, const std::string& key, std::vector<std::string>* out) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    const toml::array* array = node->as_array();
    if (!array) return InvalidArgument("run spec: " + Path(table, key) + " must be a list of strings");
    out->clear();
    for (const auto& item : *array) {
      auto v = item.value<std::string>();
      if (!item.is_string() || !v) return InvalidArgument("run spec: " + Path(table, key) + " must hold strings only");
      out->push_back(*v);
    }
    return Status::Ok();
  }

  // A [parallel] field that may be left to the planner: absent or "auto" adds `key` to
  // `automatic` (and leaves *out); otherwise as Int / Bool.
  bool IsAuto(const std::string& table, const std::string& key, std::set<std::string>* automatic) {
    const toml::node* node = Find(table, key);
    if (node && !(node->is_string() && node->value<std::string>() == "auto")) return false;
    automatic->insert(key);
    return true;
  }
  Status IntOrAuto(const std::string& table, const std::string& key, int64_t* out, int64_t min, int64_t max,
                   std::set<std::string>* automatic) {
    if (IsAuto(table, key, automatic)) return Status::Ok();
    if (Find(table, key)->is_string())
      return InvalidArgument("run spec: " + Path(table, key) + " must be an integer or \"auto\"");
    return Int(table, key, out, min, max);
  }
  Status BoolOrAuto(const std::string& table, const std::string& key, bool* out, std::set<std::string>* automatic) {
    if (IsAuto(table, key, automatic)) return Status::Ok();
    if (Find(table, key)->is_string())
      return InvalidArgument("run spec: " + Path(table, key) + " must be true, false or \"auto\"");
    return Bool(table, key, out);
  }

  bool Has(const std::string& table, const std::string& key) { return Find(table, key) != nullptr; }
  bool IsString(const std::string& table, const std::string& key) {
    const toml::node* node = Find(table, key);
    return node && node->is_string();
  }

  Status Bool(const std::string& table, const std::string& key, bool* out) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    auto v = node->value<bool>();
    if (!node->is_boolean() || !v) return InvalidArgument("run spec: " + Path(table, key) + " must be true or false");
    *out = *v;
    return Status::Ok();
  }

  Status String(const std::string& table, const std::string& key, std::string* out) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    auto v = node->value<std::string>();
    if (!node->is_string() || !v) return InvalidArgument("run spec: " + Path(table, key) + " must be a string");
    *out = *v;
    return Status::Ok();
  }

  // A choice (spec/spec_choices.h), spelled as a string: *out becomes the value it names. Any
  // other string leaves *out as it is and lands in *unknown, for the caller to refuse where its
  // check comes.
  template <SpecChoice E>
  Status Choice(const std::string& table, const std::string& key, E* out, std::optional<std::string>* unknown) {
    if (!Find(table, key)) return Status::Ok();
    std::string text;
    STRATA_RETURN_IF_ERROR(String(table, key, &text));
    if (const std::optional<E> value = ParseChoice<E>(text)) {
      *out = *value;
    } else {
      *unknown = text;
    }
    return Status::Ok();
  }

  // As above, refusing any other string at once with its choices:
  //   run spec: train.optimizer = "sgd" is not supported; use "adamw" or "adamw8bit"
  template <SpecChoice E>
  Status Choice(const std::string& table, const std::string& key, E* out) {
    std::optional<std::string> unknown;
    STRATA_RETURN_IF_ERROR(Choice(table, key, out, &unknown));
    if (unknown) {
      return InvalidArgument("run spec: " + Path(table, key) + " = \"" + *unknown + "\" is not supported; use " +
                             ChoiceList<E>());
    }
    return Status::Ok();
  }

  Status OptionalBool(const std::string& table, const std::string& key, std::optional<bool>* out) {
    if (!Find(table, key)) return Status::Ok();
    bool v = false;
    STRATA_RETURN_IF_ERROR(Bool(table, key, &v));
    *out = v;
    return Status::Ok();
  }

  // The keys present in [table].
  std::set<std::string> Keys(const std::string& table) {
    std::set<std::string> keys;
    if (const toml::table* t = root_[table].as_table()) {
      for (const auto& [key, _] : *t) keys.insert(std::string(key.str()));
    }
    return keys;
  }

  // model.rope_scaling = { type = "llama3", factor = 8.0, low_freq_factor = 1.0,
  //                        high_freq_factor = 4.0, original_max_positions = 8192 }
  // A type that names no RopeScalingType lands in *unknown_type (ValidateModelSpec refuses it).
  Status RopeScalingTable(const std::string& table, const std::string& key, RopeScaling* out,
                          std::optional<std::string>* unknown_type) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    const toml::table* t = node->as_table();
    const std::string path = Path(table, key);
    if (!t) return InvalidArgument("run spec: " + path + " must be a table, e.g. { type = \"llama3\", factor = 8.0 }");
    static const std::set<std::string> allowed = {"type", "factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_positions"};
    for (const auto& [sub, _] : *t) {
      if (!allowed.count(std::string(sub.str()))) {
        return InvalidArgument("run spec: unknown key '" + path + "." + std::string(sub.str()) +
                               "'; keys are: " + Closest("", allowed));
      }
    }
    toml::table wrapped;  // one table named "model.rope_scaling": messages name the field in full
    wrapped.insert(path, *t);
    Reader inner(wrapped);
    STRATA_RETURN_IF_ERROR(inner.Choice(path, "type", &out->type, unknown_type));
    STRATA_RETURN_IF_ERROR(inner.Float(path, "factor", &out->factor, 1.0, 1e6));
    STRATA_RETURN_IF_ERROR(inner.Float(path, "low_freq_factor", &out->low_freq_factor, 1e-6, 1e6));
    STRATA_RETURN_IF_ERROR(inner.Float(path, "high_freq_factor", &out->high_freq_factor, 1e-6, 1e6));
    STRATA_RETURN_IF_ERROR(
        inner.Int(path, "original_max_positions", &out->original_max_positions, 1, spec_bounds::kSequence));
    return Status::Ok();
  }

 private:
  static std::string Path(const std::string& table, const std::string& key) {
    return table.empty() ? key : table + "." + key;
  }
  const toml::node* Find(const std::string& table, const std::string& key) {
    if (table.empty()) return root_.get(key);
    const toml::table* t = root_[table].as_table();
    return t ? t->get(key) : nullptr;
  }
  const toml::table& root_;
};

// [extract] and [patch] (run_spec_sites.cc): read and checked against the model.
Status ParseExtract(Reader& r, RunSpec* spec);
Status ParsePatch(Reader& r, const std::string& base_dir, RunSpec* spec);
// [lora] (run_spec_lora.cc): read and checked against the model and the run's kind and mesh.
// `resolve_config`: model.adapter_from's adapter_config.json supplies what [lora] leaves out.
Status ParseLora(Reader& r, bool present, bool resolve_config, RunSpec* spec);
// The meshes LoRA runs on today: refuses a fixed parallel.tp > 1, zero = 3 or offloaded parameters.
Status CheckLoraMesh(const RunSpec& spec);
// Ablation "mean": patch.source's .npy header against the site it replaces (CheckRunSpecFiles).
Status CheckPatchSource(const RunSpec& spec);

}  // namespace strata::run_spec_internal
