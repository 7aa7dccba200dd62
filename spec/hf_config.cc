#include "spec/hf_config.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata {
namespace {

using nlohmann::json;

// Reads fields of one config.json, remembering which key each ModelSpec field came from (for
// messages that name the config's own key).
class ConfigReader {
 public:
  ConfigReader(const json& config, std::string source) : config_(config), source_(std::move(source)) {}

  Status Int(const char* key, int64_t* out, const char* field, std::optional<int64_t> fallback = std::nullopt) {
    keys_[field] = key;
    const json* v = Find(key);
    if (!v) {
      if (fallback) {
        *out = *fallback;
        return Status::Ok();
      }
      return InvalidArgument(source_ + " has no \"" + key + "\"; a " + family_ + " config.json needs it");
    }
    if (!v->is_number_integer())
      return InvalidArgument(source_ + ": \"" + key + "\" must be an integer, not " + v->dump());
    *out = v->get<int64_t>();
    return Status::Ok();
  }

  Status Float(const char* key, double* out, const char* field, std::optional<double> fallback = std::nullopt) {
    keys_[field] = key;
    const json* v = Find(key);
    if (!v) {
      if (fallback) *out = *fallback;
      return fallback ? Status::Ok() : InvalidArgument(source_ + " has no \"" + key + "\"");
    }
    if (!v->is_number()) return InvalidArgument(source_ + ": \"" + key + "\" must be a number, not " + v->dump());
    *out = v->get<double>();
    return Status::Ok();
  }

  Status Bool(const char* key, bool* out, const char* field, bool fallback) {
    keys_[field] = key;
    const json* v = Find(key);
    if (!v) {
      *out = fallback;
      return Status::Ok();
    }
    if (!v->is_boolean()) return InvalidArgument(source_ + ": \"" + key + "\" must be true or false, not " + v->dump());
    *out = v->get<bool>();
    return Status::Ok();
  }

  // A string field, or "" when absent or null.
  std::string String(const char* key) {
    const json* v = Find(key);
    return v && v->is_string() ? v->get<std::string>() : "";
  }

  // The field is absent, null, false, 0 or "": Strata implements only that value.
  Status MustBeOff(const char* key, const std::string& why) {
    const json* v = Find(key);
    if (!v || (v->is_boolean() && !v->get<bool>()) || (v->is_number() && v->get<double>() == 0) ||
        (v->is_string() && v->get<std::string>().empty())) {
      return Status::Ok();
    }
    return InvalidArgument(source_ + ": \"" + key + "\" = " + v->dump() + " is not supported (" + why + ")");
  }

  // Present and not null.
  const json* Find(const char* key) const {
    auto it = config_.find(key);
    return it == config_.end() || it->is_null() ? nullptr : &*it;
  }

  void set_family(Family family) { family_ = std::string(Name(family)); }
  const std::string& source() const { return source_; }
  const std::map<std::string, std::string>& keys() const { return keys_; }
  void NoteKey(const char* field, const char* key) { keys_[field] = key; }

 private:
  const json& config_;
  std::string source_;
  std::string family_;
  std::map<std::string, std::string> keys_;  // ModelSpec field -> config key
};

// config.json's model_type -> the family (the same spelling for each).
const std::map<std::string, Family>& FamilyOfModelType() {
  static const std::map<std::string, Family> families = [] {
    std::map<std::string, Family> out;
    for (const auto& [family, name] : Choices<Family>::kNames) out.emplace(name, family);
    return out;
  }();
  return families;
}

const char* ArchitectureOf(Family family) {
  switch (family) {
    case Family::kGpt2:
      return "GPT2LMHeadModel";
    case Family::kLlama:
      return "LlamaForCausalLM";
    case Family::kMistral:
      return "MistralForCausalLM";
    case Family::kQwen2:
      return "Qwen2ForCausalLM";
    case Family::kQwen3:
      return "Qwen3ForCausalLM";
    case Family::kOlmo2:
      return "Olmo2ForCausalLM";
    case Family::kGemma:
      return "GemmaForCausalLM";
    case Family::kGptNeox:
      return "GPTNeoXForCausalLM";
  }
  return "GPTNeoXForCausalLM";
}

// rope_scaling (published configs) or rope_parameters (transformers 5) -> RopeScaling; also
// reads rope_theta and partial_rotary_factor from rope_parameters when it holds them.
Status ReadRope(ConfigReader& r, ModelSpec* m, bool scaling_allowed) {
  const json* params = r.Find("rope_parameters");
  const json* scaling = params ? params : r.Find("rope_scaling");
  const char* key = params ? "rope_parameters" : "rope_scaling";
  if (!scaling) return Status::Ok();
  if (!scaling->is_object()) return InvalidArgument(r.source() + ": \"" + key + "\" must be an object or null");
  if (params) {
    if (auto it = params->find("rope_theta"); it != params->end() && it->is_number()) m->rope_theta = it->get<double>();
    if (auto it = params->find("partial_rotary_factor"); it != params->end() && it->is_number())
      m->rotary_pct = it->get<double>();
  }
  std::string type = scaling->value("rope_type", scaling->value("type", std::string("default")));
  if (type == "default") return Status::Ok();
  if (!scaling_allowed || (type != "linear" && type != "llama3")) {
    return InvalidArgument(
        r.source() + ": \"" + key + "\" has rope_type \"" + type + "\", which Strata does not implement" +
        (scaling_allowed ? " (it runs \"default\", \"linear\" and \"llama3\")" : " for this family") +
        "; running it with plain rotary embeddings would give wrong activations");
  }
  RopeScaling& rs = m->rope_scaling;
  rs.type = type == "llama3" ? RopeScalingType::kLlama3 : RopeScalingType::kLinear;
  auto number = [&](const char* name, double* out) -> Status {
    auto it = scaling->find(name);
    if (it == scaling->end())
      return InvalidArgument(r.source() + ": \"" + key + "\" of type " + type + " has no \"" + name + "\"");
    if (!it->is_number()) return InvalidArgument(r.source() + ": \"" + key + "." + name + "\" must be a number");
    *out = it->get<double>();
    return Status::Ok();
  };
  STRATA_RETURN_IF_ERROR(number("factor", &rs.factor));
  if (rs.type == RopeScalingType::kLlama3) {
    double original = 0;
    STRATA_RETURN_IF_ERROR(number("low_freq_factor", &rs.low_freq_factor));
    STRATA_RETURN_IF_ERROR(number("high_freq_factor", &rs.high_freq_factor));
    STRATA_RETURN_IF_ERROR(number("original_max_position_embeddings", &original));
    rs.original_max_positions = static_cast<int64_t>(original);
  }
  return Status::Ok();
}

Status ReadActivation(ConfigReader& r, const char* key, std::string fallback, ModelSpec* m) {
  r.NoteKey("activation", key);
  std::string act = r.String(key);
  if (act.empty()) act = fallback;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    m->activation = Activation::kGeluTanh;
  } else if (act == "gelu") {
    m->activation = Activation::kGelu;
  } else if (act == "silu") {
    m->activation = Activation::kSilu;
  } else {
    return InvalidArgument(r.source() + ": \"" + key + "\" = \"" + act +
                           "\" is not supported; Strata runs gelu, gelu_new / gelu_pytorch_tanh and silu");
  }
  return Status::Ok();
}

struct ParsedConfig {
  ModelSpec model;
  std::map<std::string, std::string> keys;
};

Result<ParsedConfig> ParseConfig(const std::string& text, const std::string& source) {
  json config;
  try {
    config = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument(source + " is not valid JSON: " + e.what());
  }
  if (!config.is_object()) return InvalidArgument(source + " is not a JSON object");
  ConfigReader r(config, source);
  const std::string model_type = r.String("model_type");
  auto family = FamilyOfModelType().find(model_type);
  if (family == FamilyOfModelType().end()) {
    std::string list;
    for (const auto& [type, _] : FamilyOfModelType()) list += (list.empty() ? "" : ", ") + type;
    return InvalidArgument(source + ": model_type = \"" + model_type + "\" is not supported; Strata runs " + list);
  }
  ModelSpec m;
  m.family = family->second;
  r.set_family(m.family);
  r.NoteKey("family", "model_type");
  const Family f = m.family;
  if (f == Family::kGpt2) {
    STRATA_RETURN_IF_ERROR(r.Int("n_layer", &m.layers, "layers"));
    STRATA_RETURN_IF_ERROR(r.Int("n_embd", &m.hidden, "hidden"));
    STRATA_RETURN_IF_ERROR(r.Int("n_head", &m.heads, "heads"));
    STRATA_RETURN_IF_ERROR(r.Int("n_inner", &m.ffn, "ffn", 4 * m.hidden));
    STRATA_RETURN_IF_ERROR(r.Int("vocab_size", &m.vocab, "vocab"));
    STRATA_RETURN_IF_ERROR(r.Int("n_positions", &m.max_positions, "max_positions"));
    STRATA_RETURN_IF_ERROR(r.Float("layer_norm_epsilon", &m.norm_eps, "norm_eps", 1e-5));
    STRATA_RETURN_IF_ERROR(ReadActivation(r, "activation_function", "gelu_new", &m));
    STRATA_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &m.tie_embeddings, "tie_embeddings", true));
    if (!m.tie_embeddings)
      return InvalidArgument(
          source + ": \"tie_word_embeddings\" = false is not supported for gpt2 (its head is its token embedding)");
    STRATA_RETURN_IF_ERROR(
        r.MustBeOff("scale_attn_by_inverse_layer_idx", "attention scores are scaled by 1/sqrt(head_dim) only"));
    bool scaled = true;
    STRATA_RETURN_IF_ERROR(r.Bool("scale_attn_weights", &scaled, "scale_attn_weights", true));
    if (!scaled)
      return InvalidArgument(
          source + ": \"scale_attn_weights\" = false is not supported (Strata scales scores by 1/sqrt(head_dim))");
  } else {
    STRATA_RETURN_IF_ERROR(r.Int("num_hidden_layers", &m.layers, "layers"));
    STRATA_RETURN_IF_ERROR(r.Int("hidden_size", &m.hidden, "hidden"));
    STRATA_RETURN_IF_ERROR(r.Int("num_attention_heads", &m.heads, "heads"));
    STRATA_RETURN_IF_ERROR(r.Int("intermediate_size", &m.ffn, "ffn"));
    STRATA_RETURN_IF_ERROR(r.Int("vocab_size", &m.vocab, "vocab"));
    STRATA_RETURN_IF_ERROR(r.Int("max_position_embeddings", &m.max_positions, "max_positions"));
    r.NoteKey("rope_theta", "rope_theta");
    r.NoteKey("rope_scaling", "rope_scaling");
    if (f == Family::kGptNeox) {
      STRATA_RETURN_IF_ERROR(r.Float("layer_norm_eps", &m.norm_eps, "norm_eps", 1e-5));
      STRATA_RETURN_IF_ERROR(
          r.Float("rotary_emb_base", &m.rope_theta, "rope_theta", r.Find("rope_theta") ? 0.0 : 10000.0));
      if (r.Find("rope_theta")) STRATA_RETURN_IF_ERROR(r.Float("rope_theta", &m.rope_theta, "rope_theta"));
      STRATA_RETURN_IF_ERROR(
          r.Float("rotary_pct", &m.rotary_pct, "rotary_pct", r.Find("partial_rotary_factor") ? 0.0 : 0.25));
      if (r.Find("partial_rotary_factor"))
        STRATA_RETURN_IF_ERROR(r.Float("partial_rotary_factor", &m.rotary_pct, "rotary_pct"));
      STRATA_RETURN_IF_ERROR(r.Bool("use_parallel_residual", &m.parallel_residual, "parallel_residual", true));
      STRATA_RETURN_IF_ERROR(r.Bool("attention_bias", &m.attention_bias, "attention_bias", true));
      STRATA_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &m.tie_embeddings, "tie_embeddings", false));
      STRATA_RETURN_IF_ERROR(ReadActivation(r, "hidden_act", "gelu", &m));
      STRATA_RETURN_IF_ERROR(ReadRope(r, &m, /*scaling_allowed=*/false));
    } else {
      STRATA_RETURN_IF_ERROR(r.Int("num_key_value_heads", &m.kv_heads, "kv_heads", m.heads));
      // Gemma's and Qwen3's configs default head_dim to 256 and 128, not hidden / heads.
      const int64_t head_dim_default = f == Family::kGemma   ? 256
                                       : f == Family::kQwen3 ? 128
                                                             : m.hidden / std::max<int64_t>(m.heads, 1);
      STRATA_RETURN_IF_ERROR(r.Int("head_dim", &m.head_dim, "head_dim", head_dim_default));
      STRATA_RETURN_IF_ERROR(r.Float("rms_norm_eps", &m.norm_eps, "norm_eps", f == Family::kOlmo2 ? 1e-5 : 1e-6));
      STRATA_RETURN_IF_ERROR(r.Float("rope_theta", &m.rope_theta, "rope_theta", 10000.0));
      STRATA_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &m.tie_embeddings, "tie_embeddings", f == Family::kGemma));
      STRATA_RETURN_IF_ERROR(ReadRope(r, &m, /*scaling_allowed=*/f != Family::kGemma));
      if (f == Family::kGemma) {
        // transformers' Gemma uses hidden_activation and falls back to the tanh GELU (not hidden_act).
        STRATA_RETURN_IF_ERROR(ReadActivation(r, "hidden_activation", "gelu_pytorch_tanh", &m));
        STRATA_RETURN_IF_ERROR(r.Bool("attention_bias", &m.attention_bias, "attention_bias", false));
      } else {
        STRATA_RETURN_IF_ERROR(ReadActivation(r, "hidden_act", "silu", &m));
      }
      if (f == Family::kLlama) {
        STRATA_RETURN_IF_ERROR(r.Bool("attention_bias", &m.attention_bias, "attention_bias", false));
        STRATA_RETURN_IF_ERROR(r.Bool("mlp_bias", &m.mlp_bias, "mlp_bias", false));
      }
      if (f == Family::kOlmo2) {
        STRATA_RETURN_IF_ERROR(r.Bool("attention_bias", &m.attention_bias, "attention_bias", false));
        // OLMo (v1)'s clamp of q, k and v; OLMo 2's configs drop it.
        STRATA_RETURN_IF_ERROR(r.MustBeOff("clip_qkv", "olmo2 does not clamp q, k and v"));
      }
      if (f == Family::kQwen3) {
        STRATA_RETURN_IF_ERROR(r.Bool("attention_bias", &m.attention_bias, "attention_bias", false));
        // transformers' Qwen3 slides the window on layers >= max_window_layers (or as layer_types
        // lists) only when use_sliding_window is set; no published Qwen3 checkpoint sets it.
        STRATA_RETURN_IF_ERROR(r.MustBeOff(
            "use_sliding_window", "Qwen3's sliding-window layers are not implemented; every layer attends to all"));
        if (const json* types = r.Find("layer_types"); types && types->is_array()) {
          for (const json& type : *types) {
            if (type != "full_attention") {
              return InvalidArgument(source + ": \"layer_types\" lists " + type.dump() +
                                     ", which Strata does not implement for qwen3 (every layer \"full_attention\")");
            }
          }
        }
      }
      if (f == Family::kMistral)
        STRATA_RETURN_IF_ERROR(r.Int("sliding_window", &m.sliding_window, "sliding_window", 0));
      if (f == Family::kQwen2) {
        STRATA_RETURN_IF_ERROR(
            r.MustBeOff("use_sliding_window", "Qwen2's per-layer sliding window is not implemented"));
      }
    }
  }
  return ParsedConfig{m, r.keys()};
}

std::string Str(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

Result<ModelSpec> ModelSpecFromHuggingFaceConfig(const std::string& json_text, const std::string& source) {
  STRATA_ASSIGN_OR_RETURN(ParsedConfig parsed, ParseConfig(json_text, source));
  return parsed.model;
}

Status ResolveHuggingFaceConfig(const std::string& dir, const std::set<std::string>& given, ModelSpec* m,
                                const UnknownModelChoices& unknown) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return InvalidArgument(
        "run spec: model.init_from = \"" + dir +
        "\" is not a directory; point it at a Hugging Face model directory (config.json + *.safetensors)");
  }
  auto text = ReadSpecFile(path, "model config", 4 << 20);
  if (!text.ok()) {
    return InvalidArgument("run spec: model.init_from = \"" + dir + "\" has no readable config.json (" +
                           text.status().message() +
                           "); point it at a directory saved by save_pretrained or `strata export`");
  }
  STRATA_ASSIGN_OR_RETURN(ParsedConfig parsed, ParseConfig(*text, path));
  ModelSpec c = parsed.model;
  c.init_from = m->init_from;
  c.adapter_from = m->adapter_from;
  if (given.count("family") && m->family != c.family) {
    const std::string ours(Name(m->family));
    return InvalidArgument(
        "run spec: model.family = \"" + ours + "\" but " + path + " has model_type = \"" + std::string(Name(c.family)) +
        "\"; remove model.family (init_from supplies it) or point init_from at a " + ours + " model");
  }
  const int64_t positions = c.max_positions > 0 ? c.max_positions : 2048;
  c.sequence = given.count("sequence") ? m->sequence : std::min<int64_t>(positions, 2048);
  // The spec's own values, with its defaults filled as the family fills them.
  ModelSpec own = *m;
  own.family = c.family;
  STRATA_RETURN_IF_ERROR(ValidateModelSpec(c, path + ": "));
  (void)ValidateModelSpec(own, "");  // only to fill defaults; the given fields are compared below
  auto disagree = [&](const std::string& field, const std::string& ours, const std::string& theirs) -> Status {
    if (!given.count(field) || ours == theirs) return Status::Ok();
    auto key = parsed.keys.find(field);
    const std::string config_key = key == parsed.keys.end() ? field : key->second;
    return InvalidArgument("run spec: model." + field + " = " + ours + " but " + path + " has " + config_key + " = " +
                           theirs + "; remove model." + field + " (init_from supplies it) or make them agree");
  };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  const auto& i = [](int64_t v) { return std::to_string(v); };
  STRATA_RETURN_IF_ERROR(disagree("layers", i(own.layers), i(c.layers)));
  STRATA_RETURN_IF_ERROR(disagree("hidden", i(own.hidden), i(c.hidden)));
  STRATA_RETURN_IF_ERROR(disagree("heads", i(own.heads), i(c.heads)));
  STRATA_RETURN_IF_ERROR(disagree("kv_heads", i(own.kv_heads), i(c.kv_heads)));
  STRATA_RETURN_IF_ERROR(disagree("head_dim", i(own.head_dim), i(c.head_dim)));
  STRATA_RETURN_IF_ERROR(disagree("ffn", i(own.ffn), i(c.ffn)));
  STRATA_RETURN_IF_ERROR(disagree("vocab", i(own.vocab), i(c.vocab)));
  STRATA_RETURN_IF_ERROR(disagree("max_positions", i(own.max_positions), i(c.max_positions)));
  STRATA_RETURN_IF_ERROR(disagree("rope_theta", Str(own.rope_theta), Str(c.rope_theta)));
  STRATA_RETURN_IF_ERROR(disagree("rotary_pct", Str(own.rotary_pct), Str(c.rotary_pct)));
  STRATA_RETURN_IF_ERROR(disagree("norm_eps", Str(own.norm_eps), Str(c.norm_eps)));
  STRATA_RETURN_IF_ERROR(disagree("attention_bias", b(own.attention_bias), b(c.attention_bias)));
  STRATA_RETURN_IF_ERROR(disagree("mlp_bias", b(own.mlp_bias), b(c.mlp_bias)));
  STRATA_RETURN_IF_ERROR(disagree("tie_embeddings", b(own.tie_embeddings), b(c.tie_embeddings)));
  STRATA_RETURN_IF_ERROR(disagree("sliding_window", i(own.sliding_window), i(c.sliding_window)));
  STRATA_RETURN_IF_ERROR(disagree("parallel_residual", b(own.parallel_residual), b(c.parallel_residual)));
  // A spelling that names no value (kept by the TOML parser) agrees with none of config.json's.
  const std::string own_activation = unknown.activation.value_or(std::string(Name(own.activation)));
  STRATA_RETURN_IF_ERROR(
      disagree("activation", "\"" + own_activation + "\"", "\"" + std::string(Name(c.activation)) + "\""));
  if (given.count("rope_scaling") && (unknown.rope_scaling_type || !(own.rope_scaling == c.rope_scaling))) {
    const std::string own_type = unknown.rope_scaling_type.value_or(std::string(Name(own.rope_scaling.type)));
    return InvalidArgument("run spec: model.rope_scaling (type \"" + own_type + "\", factor " +
                           Str(own.rope_scaling.factor) + ") disagrees with " + path + " (type \"" +
                           std::string(Name(c.rope_scaling.type)) + "\", factor " + Str(c.rope_scaling.factor) +
                           "); remove model.rope_scaling (init_from supplies it)");
  }
  *m = c;
  return Status::Ok();
}

Result<std::string> HuggingFaceConfigJson(const ModelSpec& m, const std::string& source_json,
                                          const std::string& dtype) {
  json config = json::object();
  if (!source_json.empty()) {
    try {
      config = json::parse(source_json);
    } catch (const json::exception& e) {
      return InvalidArgument("the source config.json is not valid JSON: " + std::string(e.what()));
    }
  }
  if (!config.contains("architectures")) config["architectures"] = {ArchitectureOf(m.family)};
  // A field the source leaves null ("the default") stays null while the value is that default.
  auto set_or_keep_null = [&](const char* key, int64_t value, int64_t implied) {
    if (config.contains(key) && config[key].is_null() && value == implied) return;
    config[key] = value;
  };
  config["model_type"] = std::string(Name(m.family));
  const Family f = m.family;
  if (f == Family::kGpt2) {
    config["n_layer"] = m.layers;
    config["n_embd"] = m.hidden;
    config["n_head"] = m.heads;
    set_or_keep_null("n_inner", m.ffn, 4 * m.hidden);
    config["vocab_size"] = m.vocab;
    config["n_positions"] = m.max_positions;
    if (!config.contains("n_ctx")) config["n_ctx"] = m.max_positions;
    config["layer_norm_epsilon"] = m.norm_eps;
    if (!config.contains("activation_function")) config["activation_function"] = "gelu_new";
    // Strata trains without dropout: a fresh export says so, a source's values are kept.
    for (const char* drop : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
      if (!config.contains(drop)) config[drop] = 0.0;
    }
    config["tie_word_embeddings"] = true;
  } else {
    config["num_hidden_layers"] = m.layers;
    config["hidden_size"] = m.hidden;
    config["num_attention_heads"] = m.heads;
    config["intermediate_size"] = m.ffn;
    config["vocab_size"] = m.vocab;
    config["max_position_embeddings"] = m.max_positions > 0 ? m.max_positions : m.sequence;
    config["tie_word_embeddings"] = m.tie_embeddings;
    const bool v5 = config.contains("rope_parameters") && config["rope_parameters"].is_object();
    if (f == Family::kGptNeox) {
      config["layer_norm_eps"] = m.norm_eps;
      config["use_parallel_residual"] = m.parallel_residual;
      config["attention_bias"] = m.attention_bias;
      if (v5) {
        config["rope_parameters"]["rope_theta"] = m.rope_theta;
        config["rope_parameters"]["partial_rotary_factor"] = m.rotary_pct;
      } else {
        config["rotary_emb_base"] = m.rope_theta;
        config["rotary_pct"] = m.rotary_pct;
      }
      if (!config.contains("hidden_act"))
        config["hidden_act"] = m.activation == Activation::kGelu ? "gelu" : "gelu_new";
    } else {
      set_or_keep_null("num_key_value_heads", m.kv_heads, m.heads);
      set_or_keep_null("head_dim", m.head_dim, m.hidden / m.heads);
      config["rms_norm_eps"] = m.norm_eps;
      if (v5) {
        config["rope_parameters"]["rope_theta"] = m.rope_theta;
      } else {
        config["rope_theta"] = m.rope_theta;
        if (m.rope_scaling.type == RopeScalingType::kNone) {
          if (config.contains("rope_scaling")) config["rope_scaling"] = nullptr;
        } else {
          json rs = {{"rope_type", std::string(Name(m.rope_scaling.type))}, {"factor", m.rope_scaling.factor}};
          if (m.rope_scaling.type == RopeScalingType::kLlama3) {
            rs["low_freq_factor"] = m.rope_scaling.low_freq_factor;
            rs["high_freq_factor"] = m.rope_scaling.high_freq_factor;
            rs["original_max_position_embeddings"] = m.rope_scaling.original_max_positions;
          }
          config["rope_scaling"] = rs;
        }
      }
      if (f == Family::kGemma) {
        config["hidden_activation"] = m.activation == Activation::kGelu ? "gelu" : "gelu_pytorch_tanh";
        config["attention_bias"] = m.attention_bias;
      } else if (!config.contains("hidden_act")) {
        config["hidden_act"] = "silu";
      }
      if (f == Family::kLlama) {
        config["attention_bias"] = m.attention_bias;
        config["mlp_bias"] = m.mlp_bias;
      }
      if (f == Family::kQwen3 || f == Family::kOlmo2) config["attention_bias"] = m.attention_bias;
      if (f == Family::kMistral)
        config["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr);
    }
  }
  config[config.contains("dtype") ? "dtype" : "torch_dtype"] = dtype;
  return config.dump(2) + "\n";
}

}  // namespace strata
