#include "common/run_spec.h"
#include "common/token_file.h"  // [data] file layouts (check_files)

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "common/hf_config.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// Allowed keys per table; anything else is an error naming the key.
const std::map<std::string, std::set<std::string>>& AllowedKeys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"", {"name", "kind", "model", "data", "train", "parallel", "worker", "extract", "patch"}},
      {"model", {"family", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "sequence", "max_positions",
                 "rope_theta", "rope_scaling", "rotary_pct", "norm_eps", "attention_bias", "mlp_bias", "tie_embeddings",
                 "sliding_window", "parallel_residual", "activation", "init_from"}},
      {"data", {"path", "format", "documents", "sample_within_documents", "tokenizer"}},
      {"train", {"steps", "global_batch", "lr", "lr_schedule", "warmup_steps", "min_lr", "weight_decay", "beta1",
                 "beta2", "eps", "grad_clip", "seed", "checkpoint_every", "keep_checkpoints", "precision", "cuda_graphs", "optimizer"}},
      {"parallel", {"dp", "pp", "tp", "micro_batch", "zero", "recompute", "stages", "offload"}},
      {"worker", {"threads"}},
      {"extract", {"layers", "sites", "dtype", "precision", "batch", "tokens", "mode", "logits_top_k"}},
      {"patch", {"layers", "sites", "ablation", "source", "logits"}},
  };
  return keys;
}

std::string FamilyList() {
  std::string list;
  for (const auto& f : ModelFamilies()) list += (list.empty() ? "\"" : ", \"") + f + "\"";
  return list;
}

std::string Closest(const std::string& key, const std::set<std::string>& allowed) {
  std::string list;
  for (const auto& k : allowed) list += (list.empty() ? "" : ", ") + k;
  return list;
}

// "run spec: model.layers = 2147483648 is over the bound of 1024; ..." (spec_bounds in run_spec.h).
Status OverBound(const std::string& field, const std::string& value, const std::string& bound) {
  return InvalidArgument("run spec: " + field + " = " + value + " is over the bound of " + bound +
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
      return InvalidArgument("run spec: " + Path(table, key) + " = " + std::to_string(*v) + " must be >= " +
                             std::to_string(min));
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
  Status IntList(const std::string& table, const std::string& key, std::vector<int64_t>* out, const std::string& empty_word = "all") {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    if (node->is_string() && node->value<std::string>() == empty_word) {
      out->clear();
      return Status::Ok();
    }
    const toml::array* array = node->as_array();
    if (!array) return InvalidArgument("run spec: " + Path(table, key) + " must be a list of integers or \"" + empty_word + "\"");
    out->clear();
    for (const auto& item : *array) {
      auto v = item.value<int64_t>();
      if (!item.is_integer() || !v) return InvalidArgument("run spec: " + Path(table, key) + " must hold integers only");
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
    if (Find(table, key)->is_string()) return InvalidArgument("run spec: " + Path(table, key) + " must be an integer or \"auto\"");
    return Int(table, key, out, min, max);
  }
  Status BoolOrAuto(const std::string& table, const std::string& key, bool* out, std::set<std::string>* automatic) {
    if (IsAuto(table, key, automatic)) return Status::Ok();
    if (Find(table, key)->is_string()) return InvalidArgument("run spec: " + Path(table, key) + " must be true, false or \"auto\"");
    return Bool(table, key, out);
  }

  bool Has(const std::string& table, const std::string& key) { return Find(table, key) != nullptr; }

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
  Status RopeScalingTable(const std::string& table, const std::string& key, RopeScaling* out) {
    const toml::node* node = Find(table, key);
    if (!node) return Status::Ok();
    const toml::table* t = node->as_table();
    const std::string path = Path(table, key);
    if (!t) return InvalidArgument("run spec: " + path + " must be a table, e.g. { type = \"llama3\", factor = 8.0 }");
    static const std::set<std::string> allowed = {"type", "factor", "low_freq_factor", "high_freq_factor", "original_max_positions"};
    for (const auto& [sub, _] : *t) {
      if (!allowed.count(std::string(sub.str()))) {
        return InvalidArgument("run spec: unknown key '" + path + "." + std::string(sub.str()) + "'; keys are: " + Closest("", allowed));
      }
    }
    toml::table wrapped;  // one table named "model.rope_scaling": messages name the field in full
    wrapped.insert(path, *t);
    Reader inner(wrapped);
    STRATA_RETURN_IF_ERROR(inner.String(path, "type", &out->type));
    STRATA_RETURN_IF_ERROR(inner.Float(path, "factor", &out->factor, 1.0, 1e6));
    STRATA_RETURN_IF_ERROR(inner.Float(path, "low_freq_factor", &out->low_freq_factor, 1e-6, 1e6));
    STRATA_RETURN_IF_ERROR(inner.Float(path, "high_freq_factor", &out->high_freq_factor, 1e-6, 1e6));
    STRATA_RETURN_IF_ERROR(inner.Int(path, "original_max_positions", &out->original_max_positions, 1, spec_bounds::kSequence));
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

// The [model] table. With model.init_from (and `resolve_config`), DIR/config.json supplies every
// field the spec leaves out and must agree with every one it gives (ResolveHuggingFaceConfig);
// only model.sequence, the run's window, is the spec's own.
Status ParseModel(Reader& r, const std::string& base_dir, bool resolve_config, ModelSpec* out) {
  ModelSpec& m = *out;
  const std::set<std::string> given = r.Keys("model");
  STRATA_RETURN_IF_ERROR(r.String("model", "family", &m.family));
  if (std::find(ModelFamilies().begin(), ModelFamilies().end(), m.family) == ModelFamilies().end()) {
    return InvalidArgument("run spec: model.family = \"" + m.family + "\" is not supported; use one of " + FamilyList());
  }
  STRATA_RETURN_IF_ERROR(r.Int("model", "layers", &m.layers, 1, spec_bounds::kLayers));
  STRATA_RETURN_IF_ERROR(r.Int("model", "hidden", &m.hidden, 1, spec_bounds::kHidden));
  STRATA_RETURN_IF_ERROR(r.Int("model", "heads", &m.heads, 1, spec_bounds::kHeads));
  STRATA_RETURN_IF_ERROR(r.Int("model", "vocab", &m.vocab, 2, spec_bounds::kVocab));
  STRATA_RETURN_IF_ERROR(r.Int("model", "sequence", &m.sequence, 2, spec_bounds::kSequence));
  STRATA_RETURN_IF_ERROR(r.Int("model", "max_positions", &m.max_positions, 0, spec_bounds::kSequence));
  STRATA_RETURN_IF_ERROR(r.Int("model", "kv_heads", &m.kv_heads, 0, spec_bounds::kHeads));
  STRATA_RETURN_IF_ERROR(r.Int("model", "head_dim", &m.head_dim, 0, spec_bounds::kHidden));
  STRATA_RETURN_IF_ERROR(r.Int("model", "ffn", &m.ffn, 0, spec_bounds::kFfn));
  STRATA_RETURN_IF_ERROR(r.Float("model", "rope_theta", &m.rope_theta, 1.0, 1e12));
  STRATA_RETURN_IF_ERROR(r.RopeScalingTable("model", "rope_scaling", &m.rope_scaling));
  STRATA_RETURN_IF_ERROR(r.Float("model", "rotary_pct", &m.rotary_pct, 0.0, 1.0));
  STRATA_RETURN_IF_ERROR(r.Float("model", "norm_eps", &m.norm_eps, 0.0, 1.0));
  std::optional<bool> attention_bias, tie_embeddings;
  STRATA_RETURN_IF_ERROR(r.OptionalBool("model", "attention_bias", &attention_bias));
  STRATA_RETURN_IF_ERROR(r.Bool("model", "mlp_bias", &m.mlp_bias));
  STRATA_RETURN_IF_ERROR(r.OptionalBool("model", "tie_embeddings", &tie_embeddings));
  STRATA_RETURN_IF_ERROR(r.Int("model", "sliding_window", &m.sliding_window, 0, spec_bounds::kSequence));
  STRATA_RETURN_IF_ERROR(r.Bool("model", "parallel_residual", &m.parallel_residual));
  STRATA_RETURN_IF_ERROR(r.String("model", "activation", &m.activation));
  STRATA_RETURN_IF_ERROR(r.String("model", "init_from", &m.init_from));
  if (m.family == "gpt2" && tie_embeddings == false) {
    return InvalidArgument("run spec: model.tie_embeddings = false: gpt2's head is always its token embedding; remove it");
  }
  // Family defaults for what the spec leaves out.
  m.attention_bias = attention_bias.value_or(m.family == "gpt_neox");
  m.tie_embeddings = tie_embeddings.value_or(m.family == "gpt2" || m.family == "gemma");

  // Fields that mean something to some families only: given to another, they are a mistake.
  static const std::map<std::string, std::set<std::string>> kFamilyOnly = {
      {"kv_heads", {"llama", "mistral", "qwen2", "gemma"}},
      {"head_dim", {"llama", "mistral", "qwen2", "gemma"}},
      {"rope_theta", {"llama", "mistral", "qwen2", "gemma", "gpt_neox"}},
      {"rope_scaling", {"llama", "mistral", "qwen2"}},
      {"rotary_pct", {"gpt_neox"}},
      {"attention_bias", {"llama", "gemma", "gpt_neox"}},
      {"mlp_bias", {"llama"}},
      {"sliding_window", {"mistral"}},
      {"parallel_residual", {"gpt_neox"}},
  };
  for (const auto& [field, families] : kFamilyOnly) {
    if (given.count(field) && !families.count(m.family)) {
      std::string list;
      for (const auto& f : families) list += (list.empty() ? "" : ", ") + f;
      return InvalidArgument("run spec: model." + field + " applies to families " + list + " only; remove it for " + m.family);
    }
  }

  if (!m.init_from.empty()) {
    fs::path init(m.init_from);
    if (init.is_relative() && !base_dir.empty()) init = fs::path(base_dir) / init;
    m.init_from = init.lexically_normal().string();
    if (resolve_config) STRATA_RETURN_IF_ERROR(ResolveHuggingFaceConfig(m.init_from, given, &m));
  }
  return ValidateModelSpec(m, "run spec: ");
}

Status ParseExtract(Reader& r, RunSpec* spec) {
  ExtractSpec& e = spec->extract;
  const int64_t layers = spec->model.layers;
  STRATA_RETURN_IF_ERROR(r.IntList("extract", "layers", &e.layers));
  if (e.layers.empty()) {
    for (int64_t i = 0; i < layers; ++i) e.layers.push_back(i);
  }
  for (int64_t layer : e.layers) {
    if (layer < 0 || layer >= layers) {
      return InvalidArgument("run spec: extract.layers holds " + std::to_string(layer) + ", out of range: model.layers = " +
                             std::to_string(layers) + ", so layers are 0.." + std::to_string(layers - 1));
    }
  }
  std::sort(e.layers.begin(), e.layers.end());
  e.layers.erase(std::unique(e.layers.begin(), e.layers.end()), e.layers.end());
  STRATA_RETURN_IF_ERROR(r.StringList("extract", "sites", &e.sites));
  STRATA_RETURN_IF_ERROR(r.Int("extract", "logits_top_k", &e.logits_top_k, 0, spec->model.vocab));
  std::string site_list;
  for (const auto& site : ExtractSites()) {
    if (site != "logits_ids" && site != "loss") site_list += (site_list.empty() ? "" : ", ") + site;
  }
  if (spec->is_patch()) {
    // What a patch run stores is fixed by [patch]; [extract] only chunks it.
    if (r.Has("extract", "sites") || r.Has("extract", "layers")) {
      return InvalidArgument("run spec: a patch run stores each row's loss (and logits with patch.logits = true), so "
                             "extract.layers and extract.sites do not apply; remove them (the [patch] table names what is replaced)");
    }
    e.sites = {"loss"};
    if (spec->patch.logits) e.sites.push_back("logits");
    e.layers = {layers - 1};
  }
  if (e.sites.empty()) return InvalidArgument("run spec: extract.sites is empty; name at least one of " + site_list);
  for (const auto& site : e.sites) {
    if (std::find(ExtractSites().begin(), ExtractSites().end(), site) == ExtractSites().end()) {
      return InvalidArgument("run spec: extract.sites holds unknown site \"" + site + "\"; sites are " + site_list +
                             " (docs/extract.md defines each)");
    }
    if (site == "loss" && !spec->is_patch()) {
      return InvalidArgument("run spec: extract.sites holds \"loss\", which patch runs store (kind = \"patch\"); remove it");
    }
    if (site == "logits_ids") {
      return InvalidArgument("run spec: extract.sites holds \"logits_ids\", which is stored beside \"logits\" when "
                             "extract.logits_top_k > 0; name \"logits\" and set logits_top_k instead");
    }
  }
  const bool logits = std::find(e.sites.begin(), e.sites.end(), "logits") != e.sites.end();
  if (e.logits_top_k > 0 && !logits) {
    return InvalidArgument("run spec: extract.logits_top_k = " + std::to_string(e.logits_top_k) +
                           " applies to the logits site; add \"logits\" to extract.sites (or patch.logits = true), or remove it");
  }
  if (e.logits_top_k > 0) e.sites.push_back("logits_ids");
  // Storage order, not the user's order: one record layout whatever the spelling.
  std::vector<std::string> ordered;
  for (const auto& site : ExtractSites()) {
    if (std::find(e.sites.begin(), e.sites.end(), site) != e.sites.end()) ordered.push_back(site);
  }
  e.sites = ordered;
  // final_norm and logits are the model's, not a block's: stored once, as layer model.layers - 1
  // (whose output they are computed from), so that layer is captured too.
  if (std::any_of(e.sites.begin(), e.sites.end(), IsModelLevelSite) &&
      !std::binary_search(e.layers.begin(), e.layers.end(), layers - 1)) {
    e.layers.push_back(layers - 1);
  }
  if (std::find(e.sites.begin(), e.sites.end(), "attn_pattern") != e.sites.end() &&
      spec->model.sequence > spec_bounds::kAttnPatternSequence) {
    return InvalidArgument("run spec: extract.sites holds attn_pattern, whose rows are [heads, sequence]; model.sequence = " +
                           std::to_string(spec->model.sequence) + " is over the " + std::to_string(spec_bounds::kAttnPatternSequence) +
                           " it is captured up to; capture it from a run with a shorter model.sequence");
  }
  STRATA_RETURN_IF_ERROR(r.String("extract", "dtype", &e.dtype));
  if (e.dtype != "fp32" && e.dtype != "bf16" && e.dtype != "fp16") {
    return InvalidArgument("run spec: extract.dtype = \"" + e.dtype + "\" is not supported; use \"fp32\", \"bf16\" or \"fp16\"");
  }
  STRATA_RETURN_IF_ERROR(r.String("extract", "precision", &e.precision));
  if (e.precision != "fp32" && e.precision != "bf16") {
    return InvalidArgument("run spec: extract.precision = \"" + e.precision + "\" is not supported; use \"fp32\" or \"bf16\"");
  }
  STRATA_RETURN_IF_ERROR(r.String("extract", "mode", &e.mode));
  if (e.mode != "auto" && e.mode != "whole" && e.mode != "layerwise") {
    return InvalidArgument("run spec: extract.mode = \"" + e.mode + "\" is not supported; use \"auto\", \"whole\" or \"layerwise\"");
  }
  STRATA_RETURN_IF_ERROR(r.Int("extract", "batch", &e.batch, 1, spec_bounds::kExtractBatch));
  STRATA_RETURN_IF_ERROR(r.Int("extract", "tokens", &e.tokens, 0, spec_bounds::kExtractTokens));
  if (e.tokens > 0 && e.tokens < spec->model.sequence) {
    return InvalidArgument("run spec: extract.tokens = " + std::to_string(e.tokens) + " is less than one sequence (model.sequence = " +
                           std::to_string(spec->model.sequence) + "); raise it or set 0 for the whole file");
  }
  // Sites that grow with sequence or vocab (attn_pattern, logits) can make one chunk larger than
  // a worker's host memory holds; the residual-width sites never come near (a 4096-wide fp32 row
  // is 16 KiB), so only those two are checked.
  RunSpec large = *spec;
  large.extract.sites.clear();
  for (const auto& site : e.sites) {
    if (site == "attn_pattern" || site == "logits" || site == "logits_ids") large.extract.sites.push_back(site);
  }
  const uint64_t chunk_bytes = ExtractChunkBytes(large);
  if (chunk_bytes > spec_bounds::kExtractChunkBytes) {
    std::string sites;
    for (const auto& site : large.extract.sites) sites += (sites.empty() ? "" : " + ") + site;
    return InvalidArgument("run spec: one chunk of " + std::to_string(e.batch) + " sequences would hold " +
                           std::to_string(chunk_bytes >> 20) + " MiB of " + sites + " (over " +
                           std::to_string(e.layers.size()) + " layer(s), " + std::to_string(spec->model.sequence) +
                           " tokens each), over the " + std::to_string(spec_bounds::kExtractChunkBytes >> 20) +
                           " MiB a chunk may hold in a worker's memory; lower extract.batch" +
                           (large.extract.sites.size() == 1 && large.extract.sites[0] == "attn_pattern" ? ", capture fewer layers"
                                                                                                          : ", set extract.logits_top_k") +
                           " or use a shorter model.sequence");
  }
  return Status::Ok();
}

Status ParsePatch(Reader& r, const std::string& base_dir, bool check_files, RunSpec* spec) {
  PatchSpec& p = spec->patch;
  const int64_t layers = spec->model.layers;
  STRATA_RETURN_IF_ERROR(r.IntList("patch", "layers", &p.layers));
  STRATA_RETURN_IF_ERROR(r.StringList("patch", "sites", &p.sites));
  STRATA_RETURN_IF_ERROR(r.String("patch", "ablation", &p.ablation));
  STRATA_RETURN_IF_ERROR(r.String("patch", "source", &p.source));
  STRATA_RETURN_IF_ERROR(r.Bool("patch", "logits", &p.logits));
  if (p.layers.empty()) {
    return InvalidArgument("run spec: patch.layers is missing or empty; name the layers whose sites are replaced, e.g. layers = [3]");
  }
  for (int64_t layer : p.layers) {
    if (layer < 0 || layer >= layers) {
      return InvalidArgument("run spec: patch.layers holds " + std::to_string(layer) + ", out of range: model.layers = " +
                             std::to_string(layers) + ", so layers are 0.." + std::to_string(layers - 1));
    }
  }
  std::sort(p.layers.begin(), p.layers.end());
  p.layers.erase(std::unique(p.layers.begin(), p.layers.end()), p.layers.end());
  std::string patchable;
  for (const auto& site : PatchableSites()) patchable += (patchable.empty() ? "" : ", ") + site;
  if (p.sites.empty()) return InvalidArgument("run spec: patch.sites is missing or empty; name at least one of " + patchable);
  for (const auto& site : p.sites) {
    if (std::find(PatchableSites().begin(), PatchableSites().end(), site) == PatchableSites().end()) {
      return InvalidArgument("run spec: patch.sites holds \"" + site + "\", which cannot be replaced; patchable sites are " + patchable);
    }
  }
  std::vector<std::string> ordered;
  for (const auto& site : PatchableSites()) {
    if (std::find(p.sites.begin(), p.sites.end(), site) != p.sites.end()) ordered.push_back(site);
  }
  p.sites = ordered;
  if (p.ablation == "capture") {
    return InvalidArgument("run spec: patch.ablation = \"capture\" is not built yet; use \"zero\", or \"mean\" with "
                           "patch.source = a .npy of the values");
  }
  if (p.ablation != "zero" && p.ablation != "mean") {
    return InvalidArgument("run spec: patch.ablation = \"" + p.ablation + "\" is not supported; use \"zero\" or \"mean\"");
  }
  if (p.ablation == "zero" && !p.source.empty()) {
    return InvalidArgument("run spec: patch.source is the .npy of values for ablation = \"mean\"; remove it for ablation = \"zero\"");
  }
  if (p.ablation == "mean") {
    // One vector replaces the site at every row: the mean of a capture, e.g. numpy's
    // np.load(activations get's .npy).mean(0), saved as fp32.
    if (p.sites.size() != 1 || p.layers.size() != 1) {
      return InvalidArgument("run spec: patch.ablation = \"mean\" replaces one site at one layer with the values in patch.source; "
                             "name exactly one in patch.layers and patch.sites (they hold " + std::to_string(p.layers.size()) +
                             " and " + std::to_string(p.sites.size()) + ")");
    }
    const std::vector<int64_t> shape = ExtractSiteRowShape(*spec, p.sites[0]);
    std::string want;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    if (p.source.empty()) {
      return InvalidArgument("run spec: patch.ablation = \"mean\" needs patch.source, an fp32 .npy of shape (" + want +
                             ") holding the value " + p.sites[0] + " takes at every row (e.g. a capture's mean over its rows)");
    }
    fs::path source(p.source);
    if (source.is_relative() && !base_dir.empty()) source = fs::path(base_dir) / source;
    p.source = source.lexically_normal().string();
    if (check_files) {
      const std::string what = "patch.source = \"" + p.source + "\"";
      std::ifstream in(p.source, std::ios::binary);
      if (!in) return InvalidArgument("run spec: " + what + " does not exist or cannot be read");
      std::string head(4096, '\0');
      in.read(head.data(), static_cast<std::streamsize>(head.size()));
      head.resize(static_cast<size_t>(in.gcount()));
      auto header = ParseNpyHeader(head, what);
      if (!header.ok()) return InvalidArgument("run spec: " + header.status().message());
      std::vector<int64_t> got(header->shape.begin(), header->shape.end());
      if (header->descr != "<f4" || header->fortran_order || got != shape) {
        std::string have;
        for (int64_t d : got) have += (have.empty() ? "" : ", ") + std::to_string(d);
        return InvalidArgument("run spec: " + what + " holds a " + header->descr + " array of shape (" + have + "); " + p.sites[0] +
                               " needs fp32 ('<f4', C order) of shape (" + want + ")");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

const std::vector<std::string>& ExtractSites() {
  // The first three keep the places they had before the others existed.
  static const std::vector<std::string> sites = {"resid_post", "attn_out", "mlp_out", "resid_pre", "resid_mid",
                                                 "q", "k", "v", "attn_pattern", "mlp_hidden",
                                                 "final_norm", "logits", "logits_ids", "loss"};
  return sites;
}

const std::vector<std::string>& PatchableSites() {
  static const std::vector<std::string> sites = {"resid_pre", "attn_out", "resid_mid", "mlp_hidden", "mlp_out", "resid_post"};
  return sites;
}

bool IsModelLevelSite(const std::string& site) {
  return site == "final_norm" || site == "logits" || site == "logits_ids" || site == "loss";
}

std::vector<int64_t> ExtractSiteRowShape(const RunSpec& spec, const std::string& site) {
  const ModelSpec& m = spec.model;
  if (site == "q") return {m.heads, m.head_size()};
  if (site == "k" || site == "v") return {m.kv_heads > 0 ? m.kv_heads : m.heads, m.head_size()};
  if (site == "attn_pattern") return {m.heads, m.sequence};
  if (site == "mlp_hidden") return {m.ffn > 0 ? m.ffn : 4 * m.hidden};
  if (site == "logits" || site == "logits_ids") return {spec.extract.logits_top_k > 0 ? spec.extract.logits_top_k : m.vocab};
  if (site == "loss") return {1};
  return {m.hidden};  // resid_pre, resid_mid, resid_post, attn_out, mlp_out, final_norm
}

std::string ExtractSiteDType(const RunSpec& spec, const std::string& site) {
  return ExtractSiteHoldsIds(site) ? "i32" : spec.extract.dtype;
}

uint64_t ExtractChunkBytes(const RunSpec& spec) {
  const uint64_t rows = static_cast<uint64_t>(spec.extract.batch) * static_cast<uint64_t>(spec.model.sequence);
  uint64_t bytes = 0;
  for (const auto& site : spec.extract.sites) {
    uint64_t row = ExtractSiteDType(spec, site) == "fp32" || ExtractSiteDType(spec, site) == "i32" ? 4 : 2;
    for (int64_t d : ExtractSiteRowShape(spec, site)) row *= static_cast<uint64_t>(d);
    bytes += rows * row * (IsModelLevelSite(site) ? 1 : spec.extract.layers.size());
  }
  return bytes;
}

int64_t ExtractSequences(const RunSpec& spec, int64_t data_tokens) {
  int64_t tokens = data_tokens;
  if (spec.extract.tokens > 0) tokens = std::min(tokens, spec.extract.tokens);
  return tokens / spec.model.sequence;
}

int64_t ExtractChunks(const RunSpec& spec, int64_t data_tokens) {
  const int64_t sequences = ExtractSequences(spec, data_tokens);
  return (sequences + spec.extract.batch - 1) / spec.extract.batch;
}

Status ValidateRunName(const std::string& name) {
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("run spec: name = \"" + EscapeForTerminal(name.size() > 80 ? name.substr(0, 80) + "..." : name) +
                           "\" " + why + "; a run name is 1 to " + std::to_string(spec_bounds::kNameLength) +
                           " characters of A-Z a-z 0-9 . _ - not starting with '.' or '-' (it names files and log lines)");
  };
  if (name.empty()) return refuse("is empty");
  if (name.size() > spec_bounds::kNameLength) return refuse("is " + std::to_string(name.size()) + " bytes long");
  for (unsigned char c : name) {
    if (!std::isalnum(c) && c != '.' && c != '_' && c != '-') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      return refuse(std::string("holds the character ") + (c >= 0x20 && c < 0x7f ? "'" + std::string(1, static_cast<char>(c)) + "'" : hex));
    }
  }
  if (name[0] == '.' || name[0] == '-') return refuse("starts with '" + name.substr(0, 1) + "'");
  return Status::Ok();
}

std::string EscapeForTerminal(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if (c < 0x20 || c == 0x7f || c == '\\') {
      hex(c);
    } else if (c == 0xC2 && next >= 0x80 && next <= 0x9F) {  // U+0080..U+009F: C1 controls (CSI is U+009B)
      hex(c), hex(next), ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Result<std::string> ReadSpecFile(const std::string& path, const std::string& what, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    return InvalidArgument("cannot read " + what + " " + path + ": " + std::strerror(err) + (err == ENOENT ? "; check the path" : ""));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + what + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file";
    return InvalidArgument(what + " " + path + " is " + kind + "; give a regular file (TOML, at most " +
                           std::to_string(max_bytes >> 10) + " KiB)");
  }
  auto too_big = [&] {
    return InvalidArgument(what + " " + path + " is larger than " + std::to_string(max_bytes >> 10) +
                           " KiB; a run spec is a few lines of TOML, check the path");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_big();
  // Read to the end, but never past the limit (a file that grows while it is read).
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read " + what + " " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) return too_big();
  }
  return text;
}

const std::vector<std::string>& ModelFamilies() {
  static const std::vector<std::string> families = {"gpt2", "llama", "mistral", "qwen2", "gemma", "gpt_neox"};
  return families;
}

int64_t ModelSpec::rotary_dims() const {
  if (!rotary()) return 0;
  const int64_t dims = static_cast<int64_t>(static_cast<double>(head_size()) * rotary_pct);  // as transformers: int(head_size * pct)
  return dims - dims % 2;
}

Status ValidateModelSpec(ModelSpec& m, const std::string& context) {
  const auto msg = [&](const std::string& text) { return InvalidArgument(context + text); };
  const auto str = [](int64_t v) { return std::to_string(v); };
  const bool grouped = m.family != "gpt2" && m.family != "gpt_neox";  // families with kv_heads and head_dim
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.ffn == 0) m.ffn = 4 * m.hidden;
  if (m.norm_eps == 0.0) m.norm_eps = m.rms_norm() ? 1e-6 : 1e-5;
  if (m.activation.empty()) m.activation = m.family == "gpt_neox" ? "gelu" : m.rms_norm() && m.family != "gemma" ? "silu" : "gelu_tanh";
  if (m.family == "gpt2" && m.max_positions == 0) m.max_positions = m.sequence;
  if (!grouped || m.head_dim == 0) {
    if (m.hidden % m.heads != 0) {
      return msg("model.heads = " + str(m.heads) + " does not divide model.hidden = " + str(m.hidden) +
                 "; choose heads so that hidden % heads == 0" + (grouped ? " (or set model.head_dim)" : ""));
    }
    if (m.head_dim != 0 && m.head_dim != m.hidden / m.heads) {
      return msg("model.head_dim = " + str(m.head_dim) + " but " + m.family + " heads are hidden / heads = " + str(m.hidden / m.heads));
    }
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0) {
    return msg("model.kv_heads = " + str(m.kv_heads) + " does not divide model.heads = " + str(m.heads) +
               "; each key/value head must serve a whole number of query heads");
  }
  if (!grouped && m.kv_heads != m.heads) {
    return msg("model.kv_heads applies to families llama, mistral, qwen2, gemma only; remove it for " + m.family);
  }
  if (m.heads * m.head_dim > spec_bounds::kFfn) return msg("model.heads x model.head_dim = " + str(m.heads * m.head_dim) + " is over the bound of " + str(spec_bounds::kFfn));
  if (m.rotary() && (m.rotary_dims() < 2 || m.rotary_dims() % 2 != 0 || (m.rotary_pct == 1.0 && m.head_size() % 2 != 0))) {
    return msg("the rotary part of a head is " + str(m.rotary_dims()) + " dimensions (model.head_dim " + str(m.head_size()) +
               (m.family == "gpt_neox" ? " x model.rotary_pct" : "") + "); rotary embeddings need an even number >= 2");
  }
  static const std::map<std::string, std::set<std::string>> kActivations = {
      {"gpt2", {"gelu_tanh"}}, {"llama", {"silu"}}, {"mistral", {"silu"}}, {"qwen2", {"silu"}},
      {"gemma", {"gelu_tanh", "gelu"}}, {"gpt_neox", {"gelu", "gelu_tanh"}}};
  if (!kActivations.at(m.family).count(m.activation)) {
    std::string list;
    for (const auto& a : kActivations.at(m.family)) list += (list.empty() ? "\"" : ", \"") + a + "\"";
    return msg("model.activation = \"" + m.activation + "\" is not supported for " + m.family + "; use " + list);
  }
  if (m.family == "gpt2") m.tie_embeddings = true;  // its head is always the token embedding
  const RopeScaling& rs = m.rope_scaling;
  if (rs.type != "none" && rs.type != "linear" && rs.type != "llama3") {
    return msg("model.rope_scaling.type = \"" + rs.type + "\" is not supported; use \"none\", \"linear\" or \"llama3\"");
  }
  if (rs.type == "llama3" && !(rs.high_freq_factor > rs.low_freq_factor)) {
    return msg("model.rope_scaling.high_freq_factor must be larger than low_freq_factor (Llama 3.1: 4.0 and 1.0)");
  }
  if (m.max_positions > 0 && m.sequence > m.max_positions) {
    return msg("model.sequence = " + str(m.sequence) + " exceeds model.max_positions = " + str(m.max_positions) +
               (m.family == "gpt2" ? " (gpt2's learned positions)" : " (the positions the model was trained for)") +
               "; shorten model.sequence");
  }
  return Status::Ok();
}

namespace {
Result<RunSpec> Parse(const std::string& toml_text, const std::string& base_dir, bool check_files, bool check_name);
}  // namespace

Result<RunSpec> ParseRunSpec(const std::string& toml_text, const std::string& base_dir, bool check_files) {
  return Parse(toml_text, base_dir, check_files, /*check_name=*/true);
}

Result<RunSpec> ParseStoredRunSpec(const std::string& toml_text) {
  return Parse(toml_text, "", /*check_files=*/false, /*check_name=*/false);
}

namespace {
Result<RunSpec> Parse(const std::string& toml_text, const std::string& base_dir, bool check_files, bool check_name) {
  toml::table root;
  try {
    root = toml::parse(toml_text);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "run spec is not valid TOML at line " << e.source().begin.line << ", column "
        << e.source().begin.column << ": " << e.description();
    return InvalidArgument(msg.str());
  }
  Reader r(root);
  STRATA_RETURN_IF_ERROR(r.CheckKeys());

  RunSpec spec;
  STRATA_RETURN_IF_ERROR(r.String("", "name", &spec.name));
  if (spec.name.empty()) spec.name = "run";
  if (check_name) STRATA_RETURN_IF_ERROR(ValidateRunName(spec.name));
  STRATA_RETURN_IF_ERROR(r.String("", "kind", &spec.kind));
  if (spec.kind != "train" && spec.kind != "extract" && spec.kind != "patch") {
    return InvalidArgument("run spec: kind = \"" + spec.kind + "\" is not supported; use \"train\", \"extract\" or \"patch\"");
  }
  if (root.contains("patch") && !spec.is_patch()) {
    return InvalidArgument("run spec: a [patch] table needs kind = \"patch\" at the top of the spec");
  }
  if (root.contains("extract") && !spec.is_extract()) {
    return InvalidArgument("run spec: an [extract] table needs kind = \"extract\" at the top of the spec");
  }

  ModelSpec& m = spec.model;
  // A stored spec (ParseStoredRunSpec) carries every field already; its init_from may be gone.
  STRATA_RETURN_IF_ERROR(ParseModel(r, base_dir, /*resolve_config=*/check_name, &m));

  STRATA_RETURN_IF_ERROR(r.String("data", "path", &spec.data.path));
  STRATA_RETURN_IF_ERROR(r.String("data", "format", &spec.data.format));
  STRATA_RETURN_IF_ERROR(r.String("data", "documents", &spec.data.documents));
  STRATA_RETURN_IF_ERROR(r.Bool("data", "sample_within_documents", &spec.data.sample_within_documents));
  STRATA_RETURN_IF_ERROR(r.String("data", "tokenizer", &spec.data.tokenizer));
  const bool text = spec.data.format == "text";
  if (!spec.data.tokenizer.empty() && !text) {
    return InvalidArgument("run spec: data.tokenizer applies to data.format = \"text\" only; remove it, or set the format");
  }
  if (text && spec.data.tokenizer.empty()) spec.data.tokenizer = m.init_from;
  if (text && spec.data.tokenizer.empty()) {
    return InvalidArgument("run spec: data.format = \"text\" needs a tokenizer: set data.tokenizer to a model directory with "
                           "tokenizer.json or tokenizer.model (or model.init_from, whose tokenizer is the default)");
  }
  if (spec.data.path.empty()) {
    return InvalidArgument("run spec: data.path is missing; set it to a text file (format = \"bytes\") or a token file (\"u16\", \"u32\", \"npy\")");
  }
  if (!IsTokenFormat(spec.data.format) && !text) {
    return InvalidArgument("run spec: data.format = \"" + spec.data.format + "\" is not supported; use " + kTokenFormats +
                           ", or \"text\" with data.tokenizer");
  }
  if (spec.data.format == "bytes" && m.vocab < 256) {
    return InvalidArgument("run spec: model.vocab = " + std::to_string(m.vocab) +
                           " is too small for data.format = \"bytes\"; byte tokens need vocab >= 256");
  }
  if (spec.data.sample_within_documents && spec.data.documents.empty()) {
    return InvalidArgument("run spec: data.sample_within_documents = true needs data.documents, a file of document start offsets "
                           "(little-endian u64, or a .npy of int64)");
  }
  if (!spec.data.documents.empty() && !spec.data.sample_within_documents && !spec.is_extract()) {
    return InvalidArgument("run spec: data.documents is read only with data.sample_within_documents = true (or by extract "
                           "runs, to number the rows' documents); set it, or remove data.documents");
  }
  if (spec.data.sample_within_documents && spec.is_extract()) {
    return InvalidArgument("run spec: data.sample_within_documents applies to train runs; an extract run captures the file's "
                           "sequences in order, so remove it (data.documents alone numbers the rows' documents)");
  }
  auto absolute = [&](const std::string& path) {
    fs::path p(path);
    if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
    return p.lexically_normal().string();
  };
  spec.data.path = absolute(spec.data.path);
  if (!spec.data.documents.empty()) spec.data.documents = absolute(spec.data.documents);
  if (!spec.data.tokenizer.empty()) spec.data.tokenizer = absolute(spec.data.tokenizer);
  if (check_files && text) {
    std::error_code ec;
    if (!fs::is_regular_file(spec.data.path, ec)) {
      return InvalidArgument("run spec: data.path = \"" + spec.data.path + "\" does not exist or is not a file");
    }
    if (!fs::is_regular_file(spec.data.tokenizer + "/tokenizer.json", ec) && !fs::is_regular_file(spec.data.tokenizer + "/tokenizer.model", ec)) {
      return InvalidArgument("run spec: data.tokenizer = \"" + spec.data.tokenizer + "\" holds neither tokenizer.json nor tokenizer.model");
    }
  } else if (check_files) {
    std::error_code ec;
    if (!fs::is_regular_file(spec.data.path, ec)) {
      return InvalidArgument("run spec: data.path = \"" + spec.data.path + "\" does not exist or is not a file");
    }
    auto layout = ReadTokenFileLayout(spec.data.path, spec.data.format);
    if (!layout.ok()) return InvalidArgument("run spec: " + layout.status().message());
    if (layout->tokens < static_cast<uint64_t>(m.sequence + 1)) {
      return InvalidArgument("run spec: data.path = \"" + spec.data.path + "\" holds " + std::to_string(layout->tokens) +
                             " tokens, fewer than model.sequence + 1 = " + std::to_string(m.sequence + 1) +
                             "; use a larger file or a shorter sequence");
    }
    if (!spec.data.documents.empty()) {
      if (!fs::is_regular_file(spec.data.documents, ec)) {
        return InvalidArgument("run spec: data.documents = \"" + spec.data.documents + "\" does not exist or is not a file");
      }
      // The size and header here; the offsets themselves when a worker loads them (TokenData).
      auto documents = ReadDocumentsLayout(spec.data.documents);
      if (!documents.ok()) return InvalidArgument("run spec: " + documents.status().message());
    }
  }

  TrainSpec& t = spec.train;
  STRATA_RETURN_IF_ERROR(r.Int("train", "steps", &t.steps, 1, spec_bounds::kSteps));
  STRATA_RETURN_IF_ERROR(r.Int("train", "global_batch", &t.global_batch, 1, spec_bounds::kGlobalBatch));
  STRATA_RETURN_IF_ERROR(r.Float("train", "lr", &t.lr, 0.0, 10.0));
  STRATA_RETURN_IF_ERROR(r.Float("train", "weight_decay", &t.weight_decay, 0.0, 10.0));
  STRATA_RETURN_IF_ERROR(r.Float("train", "beta1", &t.beta1, 0.0, 0.999999));
  STRATA_RETURN_IF_ERROR(r.Float("train", "beta2", &t.beta2, 0.0, 0.999999));
  STRATA_RETURN_IF_ERROR(r.Float("train", "eps", &t.eps, 0.0, spec_bounds::kMaxEps));
  if (!(t.eps > 0)) {
    return InvalidArgument("run spec: train.eps = 0 must be > 0 (AdamW divides by sqrt(v) + eps); the default is 1e-8");
  }
  STRATA_RETURN_IF_ERROR(r.Float("train", "grad_clip", &t.grad_clip, 0.0, 1e9));
  STRATA_RETURN_IF_ERROR(r.Int("train", "seed", &t.seed, 0, std::numeric_limits<int64_t>::max()));
  STRATA_RETURN_IF_ERROR(r.Int("train", "checkpoint_every", &t.checkpoint_every, 0, spec_bounds::kSteps));
  // Retention: the newest N complete checkpoints are kept (0: all). A million is more than any
  // disk holds of a model worth checkpointing.
  STRATA_RETURN_IF_ERROR(r.Int("train", "keep_checkpoints", &t.keep_checkpoints, 0, 1000000));
  if (t.lr <= 0) return InvalidArgument("run spec: train.lr must be > 0");
  STRATA_RETURN_IF_ERROR(r.String("train", "lr_schedule", &t.lr_schedule));
  if (t.lr_schedule != "constant" && t.lr_schedule != "cosine") {
    return InvalidArgument("run spec: train.lr_schedule = \"" + t.lr_schedule + "\" is not supported; use \"constant\" or \"cosine\"");
  }
  STRATA_RETURN_IF_ERROR(r.Int("train", "warmup_steps", &t.warmup_steps, 0, spec_bounds::kSteps));
  STRATA_RETURN_IF_ERROR(r.Float("train", "min_lr", &t.min_lr, 0.0, 10.0));
  if (t.min_lr > t.lr) return InvalidArgument("run spec: train.min_lr must not exceed train.lr");
  STRATA_RETURN_IF_ERROR(r.String("train", "precision", &t.precision));
  if (t.precision != "fp32" && t.precision != "bf16") {
    return InvalidArgument("run spec: train.precision = \"" + t.precision + "\" is not supported; use \"fp32\" or \"bf16\"");
  }
  STRATA_RETURN_IF_ERROR(r.Bool("train", "cuda_graphs", &t.cuda_graphs));
  STRATA_RETURN_IF_ERROR(r.String("train", "optimizer", &t.optimizer));
  if (t.optimizer != "adamw" && t.optimizer != "adamw8bit") {
    return InvalidArgument("run spec: train.optimizer = \"" + t.optimizer + "\" is not supported; use \"adamw\" or \"adamw8bit\"");
  }

  STRATA_RETURN_IF_ERROR(r.Int("worker", "threads", &spec.worker.threads, 0, spec_bounds::kThreads));
  ParallelSpec& p = spec.parallel;
  if (spec.is_extract()) {  // workers to capture with; not planned
    STRATA_RETURN_IF_ERROR(r.Int("parallel", "dp", &p.dp, 1, spec_bounds::kWorkers));
    if (spec.is_patch()) STRATA_RETURN_IF_ERROR(ParsePatch(r, base_dir, check_files, &spec));
    STRATA_RETURN_IF_ERROR(ParseExtract(r, &spec));
    return spec;
  }
  // Train runs: each field is fixed here or left to the planner when the run starts.
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "dp", &p.dp, 1, spec_bounds::kWorkers, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "pp", &p.pp, 1, spec_bounds::kLayers, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "tp", &p.tp, 1, spec_bounds::kHeads, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "micro_batch", &p.micro_batch, 0, spec_bounds::kGlobalBatch, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "zero", &p.zero, 0, std::numeric_limits<int64_t>::max(), &p.automatic));  // 0-3: ValidateParallel
  STRATA_RETURN_IF_ERROR(r.BoolOrAuto("parallel", "recompute", &p.recompute, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntList("parallel", "stages", &p.stages, "auto"));
  STRATA_RETURN_IF_ERROR(r.String("parallel", "offload", &p.offload));
  if (p.offload == "optimizer+params") {
    return InvalidArgument("run spec: parallel.offload = \"optimizer+params\" (parameters streamed from host memory a layer at a time) "
                           "is not built yet; use \"optimizer\" (optimizer state in host memory) or \"none\"");
  }
  if (p.offload != "none" && p.offload != "optimizer") {
    return InvalidArgument("run spec: parallel.offload = \"" + p.offload + "\" is not supported; use \"none\" or \"optimizer\"");
  }
  STRATA_RETURN_IF_ERROR(ValidateParallel(spec));
  return spec;
}
}  // namespace

Status ValidateParallel(const RunSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  const ModelSpec& m = spec.model;
  const TrainSpec& t = spec.train;
  auto fixed = [&](const char* field) { return !p.automatic.count(field); };
  if (fixed("dp") && t.global_batch % p.dp != 0) {
    return InvalidArgument("run spec: train.global_batch = " + std::to_string(t.global_batch) +
                           " is not divisible by parallel.dp = " + std::to_string(p.dp) +
                           "; make the global batch a multiple of dp");
  }
  if (fixed("micro_batch") && p.micro_batch > 0) {
    const int64_t local_batch = fixed("dp") ? t.global_batch / p.dp : t.global_batch;
    if (local_batch % p.micro_batch != 0) {
      return InvalidArgument("run spec: parallel.micro_batch = " + std::to_string(p.micro_batch) +
                             " does not divide the per-rank batch train.global_batch / parallel.dp = " +
                             std::to_string(local_batch));
    }
  }
  if (fixed("dp") && fixed("pp") && fixed("tp") && p.dp * p.pp * p.tp > spec_bounds::kWorkers) {  // each <= 2^16: no overflow
    return OverBound("parallel.dp * parallel.pp * parallel.tp", std::to_string(p.dp * p.pp * p.tp), std::to_string(spec_bounds::kWorkers));
  }
  if (fixed("zero") && p.zero > 3) {
    return InvalidArgument("run spec: parallel.zero = " + std::to_string(p.zero) +
                           " is outside 0-3; use 1 (sharded optimizer state), 2 (and gradients) or 3 (and parameters)");
  }
  if (fixed("pp") && p.pp > m.layers) {
    return InvalidArgument("run spec: parallel.pp = " + std::to_string(p.pp) + " exceeds model.layers = " +
                           std::to_string(m.layers) + "; every pipeline stage needs at least one layer");
  }
  if (!p.stages.empty()) {
    auto listed = [&] {
      std::string text;
      for (int64_t n : p.stages) text += (text.empty() ? "" : ", ") + std::to_string(n);
      return "parallel.stages = [" + text + "]";
    };
    if (!fixed("pp") || static_cast<int64_t>(p.stages.size()) != p.pp) {
      return InvalidArgument("run spec: " + listed() + " has " + std::to_string(p.stages.size()) + " stages but parallel.pp is " +
                             (fixed("pp") ? std::to_string(p.pp) : std::string("\"auto\"")) +
                             "; give one layer count per pipeline stage with pp fixed, or leave stages out for balanced ones");
    }
    int64_t sum = 0;
    for (int64_t n : p.stages) {
      if (n < 1) return InvalidArgument("run spec: " + listed() + " gives a stage no layers; every stage needs at least one");
      if (n > m.layers) {  // checked before the sum, which then cannot overflow
        return InvalidArgument("run spec: " + listed() + " gives a stage " + std::to_string(n) + " layers but model.layers = " +
                               std::to_string(m.layers) + "; the counts must add up to the model's layers");
      }
      sum += n;
    }
    if (sum != m.layers) {
      return InvalidArgument("run spec: " + listed() + " covers " + std::to_string(sum) + " layers but model.layers = " +
                             std::to_string(m.layers) + "; the counts must add up to the model's layers");
    }
  }
  if (fixed("tp") && (m.heads % p.tp != 0 || m.kv_heads % p.tp != 0)) {
    return InvalidArgument("run spec: parallel.tp = " + std::to_string(p.tp) + " does not divide model.heads = " +
                           std::to_string(m.heads) + (m.kv_heads != m.heads ? " and model.kv_heads = " + std::to_string(m.kv_heads) : "") +
                           "; each tensor-parallel rank takes whole heads");
  }
  if (fixed("tp") && m.ffn % p.tp != 0) {
    return InvalidArgument("run spec: parallel.tp = " + std::to_string(p.tp) + " does not divide model.ffn = " +
                           std::to_string(m.ffn) + "; each tensor-parallel rank takes an equal slice of the MLP");
  }
  return Status::Ok();
}

double LearningRate(const TrainSpec& train, int64_t step) {
  if (train.warmup_steps > 0 && step <= train.warmup_steps) {
    return train.lr * static_cast<double>(step) / static_cast<double>(train.warmup_steps);
  }
  if (train.lr_schedule != "cosine") return train.lr;
  const int64_t decay_steps = train.steps - train.warmup_steps;
  if (decay_steps <= 0) return train.lr;
  const double progress = static_cast<double>(step - train.warmup_steps) / static_cast<double>(decay_steps);
  return train.min_lr + 0.5 * (train.lr - train.min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

namespace {

// Every [model] key of the family (ParseModel refuses the others), values as validated.
toml::table ModelToToml(const ModelSpec& m) {
  toml::table t{{"family", m.family}, {"layers", m.layers},     {"hidden", m.hidden},   {"heads", m.heads},
                {"ffn", m.ffn},       {"vocab", m.vocab},       {"sequence", m.sequence}, {"norm_eps", m.norm_eps},
                {"activation", m.activation}, {"tie_embeddings", m.tie_embeddings}};
  if (m.max_positions > 0) t.insert("max_positions", m.max_positions);
  const std::string& f = m.family;
  const bool grouped = f != "gpt2" && f != "gpt_neox";
  if (grouped) {
    t.insert("kv_heads", m.kv_heads);
    t.insert("head_dim", m.head_dim);
  }
  if (m.rotary()) t.insert("rope_theta", m.rope_theta);
  if (f == "llama" || f == "mistral" || f == "qwen2") {
    const RopeScaling& rs = m.rope_scaling;
    t.insert("rope_scaling", toml::table{{"type", rs.type}, {"factor", rs.factor}, {"low_freq_factor", rs.low_freq_factor},
                                         {"high_freq_factor", rs.high_freq_factor},
                                         {"original_max_positions", rs.original_max_positions}});
  }
  if (f == "gpt_neox") {
    t.insert("rotary_pct", m.rotary_pct);
    t.insert("parallel_residual", m.parallel_residual);
  }
  if (f == "llama" || f == "gemma" || f == "gpt_neox") t.insert("attention_bias", m.attention_bias);
  if (f == "llama") t.insert("mlp_bias", m.mlp_bias);
  if (f == "mistral") t.insert("sliding_window", m.sliding_window);
  if (!m.init_from.empty()) t.insert("init_from", m.init_from);
  return t;
}

}  // namespace

std::string RunSpecToToml(const RunSpec& spec) {
  toml::table root;
  root.insert("name", spec.name);
  root.insert("kind", spec.kind);
  root.insert("model", ModelToToml(spec.model));
  root.insert("data", toml::table{{"path", spec.data.path}, {"format", spec.data.format}});
  if (!spec.data.documents.empty()) {
    root["data"].as_table()->insert("documents", spec.data.documents);
    root["data"].as_table()->insert("sample_within_documents", spec.data.sample_within_documents);
  }
  if (!spec.data.tokenizer.empty()) root["data"].as_table()->insert("tokenizer", spec.data.tokenizer);
  root.insert("train", toml::table{{"steps", spec.train.steps},
                                   {"global_batch", spec.train.global_batch},
                                   {"lr", spec.train.lr},
                                   {"weight_decay", spec.train.weight_decay},
                                   {"beta1", spec.train.beta1},
                                   {"beta2", spec.train.beta2},
                                   {"eps", spec.train.eps},
                                   {"grad_clip", spec.train.grad_clip},
                                   {"seed", spec.train.seed},
                                   {"checkpoint_every", spec.train.checkpoint_every},
                                   {"keep_checkpoints", spec.train.keep_checkpoints},
                                   {"lr_schedule", spec.train.lr_schedule},
                                   {"warmup_steps", spec.train.warmup_steps},
                                   {"min_lr", spec.train.min_lr},
                                   {"precision", spec.train.precision},
                                   {"cuda_graphs", spec.train.cuda_graphs},
                                   {"optimizer", spec.train.optimizer}});
  toml::table parallel{{"dp", spec.parallel.dp},
                       {"pp", spec.parallel.pp},
                       {"tp", spec.parallel.tp},
                       {"micro_batch", spec.parallel.micro_batch},
                       {"zero", spec.parallel.zero},
                       {"recompute", spec.parallel.recompute},
                       {"offload", spec.parallel.offload}};
  if (!spec.parallel.stages.empty()) {
    toml::array stages;
    for (int64_t n : spec.parallel.stages) stages.push_back(n);
    parallel.insert("stages", std::move(stages));
  }
  for (const auto& field : spec.parallel.automatic) parallel.insert_or_assign(field, "auto");
  root.insert("parallel", std::move(parallel));
  root.insert("worker", toml::table{{"threads", spec.worker.threads}});
  if (spec.is_extract()) {
    toml::array layers, sites;
    for (int64_t l : spec.extract.layers) layers.push_back(l);
    // logits_ids and loss follow from logits_top_k and kind; the parser adds them again.
    for (const auto& site : spec.extract.sites) {
      if (site != "logits_ids" && site != "loss") sites.push_back(site);
    }
    toml::table extract{{"dtype", spec.extract.dtype},         {"precision", spec.extract.precision},
                        {"batch", spec.extract.batch},         {"tokens", spec.extract.tokens},
                        {"mode", spec.extract.mode},           {"logits_top_k", spec.extract.logits_top_k}};
    if (!spec.is_patch()) {  // a patch run's follow from [patch]
      extract.insert("layers", layers);
      extract.insert("sites", sites);
    }
    root.insert("extract", std::move(extract));
  }
  if (spec.is_patch()) {
    toml::array layers, sites;
    for (int64_t l : spec.patch.layers) layers.push_back(l);
    for (const auto& site : spec.patch.sites) sites.push_back(site);
    root.insert("patch", toml::table{{"layers", layers},
                                     {"sites", sites},
                                     {"ablation", spec.patch.ablation},
                                     {"source", spec.patch.source},
                                     {"logits", spec.patch.logits}});
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

}  // namespace strata
