#include "model/parameters.h"

#include <algorithm>

namespace strata::model {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int64_t Parameter::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<Parameter> BlockParameters(const ModelSpec& m) {
  const int64_t h = m.hidden, f = m.ffn, d = m.head_size();
  const int64_t q = m.heads * d, kv = m.kv_heads * d;
  std::vector<Parameter> p;
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    p.push_back({name + ".weight", {out, in}});
    if (bias) p.push_back({name + ".bias", {out}});
  };
  auto norm = [&](const std::string& name, bool bias) {
    p.push_back({name + ".weight", {h}});
    if (bias) p.push_back({name + ".bias", {h}});
  };
  if (m.family == Family::kGpt2) {
    norm("ln_1", true);
    linear("c_attn", 3 * h, h, true);
    linear("attn_proj", h, h, true);
    norm("ln_2", true);
    linear("c_fc", f, h, true);
    linear("mlp_proj", h, f, true);
  } else if (m.family == Family::kGptNeox) {
    norm("input_layernorm", true);
    norm("post_attention_layernorm", true);
    linear("attention.query_key_value", 3 * h, h, m.attention_bias);
    linear("attention.dense", h, h, m.attention_bias);
    linear("mlp.dense_h_to_4h", f, h, true);
    linear("mlp.dense_4h_to_h", h, f, true);
  } else {
    if (!m.post_norms()) norm("input_layernorm", false);
    linear("self_attn.q_proj", q, h, m.qkv_bias());
    linear("self_attn.k_proj", kv, h, m.qkv_bias());
    linear("self_attn.v_proj", kv, h, m.qkv_bias());
    linear("self_attn.o_proj", h, q, m.attn_out_bias());
    if (m.qk_norm()) {
      p.push_back({"self_attn.q_norm.weight", {m.qk_norm_per_head() ? d : q}});
      p.push_back({"self_attn.k_norm.weight", {m.qk_norm_per_head() ? d : kv}});
    }
    norm("post_attention_layernorm", false);
    linear("mlp.gate_proj", f, h, m.mlp_biases());
    linear("mlp.up_proj", f, h, m.mlp_biases());
    linear("mlp.down_proj", h, f, m.mlp_biases());
    if (m.post_norms()) norm("post_feedforward_layernorm", false);
  }
  return p;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string BlockPrefix(const ModelSpec& m, int64_t layer) {
  return (m.family == Family::kGpt2 ? "h." : "layers.") + std::to_string(layer) + ".";
}

std::string TokenEmbeddingName(const ModelSpec& m) {
  if (m.family == Family::kGpt2) return "wte.weight";
  if (m.family == Family::kGptNeox) return "embed_in.weight";
  return "embed_tokens.weight";
}

std::vector<std::string> EmbeddingNames(const ModelSpec& m) {
  if (m.family == Family::kGpt2) return {"wte.weight", "wpe.weight"};
  return {TokenEmbeddingName(m)};
}

std::vector<std::string> FinalNormNames(const ModelSpec& m) {
  if (m.family == Family::kGpt2) return {"ln_f.weight", "ln_f.bias"};
  if (m.family == Family::kGptNeox) return {"final_layer_norm.weight", "final_layer_norm.bias"};
  return {"norm.weight"};
}

std::string HeadWeightName(const ModelSpec& m) {
  if (m.tied()) return TokenEmbeddingName(m);
  return m.family == Family::kGptNeox ? "embed_out.weight" : "lm_head.weight";
}

std::vector<Parameter> Parameters(const ModelSpec& m) {
  std::vector<Parameter> p;
  p.push_back({TokenEmbeddingName(m), {m.vocab, m.hidden}});
  if (m.family == Family::kGpt2)
    p.push_back({"wpe.weight", {m.max_positions > 0 ? m.max_positions : m.sequence, m.hidden}});
  const std::vector<Parameter> block = BlockParameters(m);
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    const std::string prefix = BlockPrefix(m, layer);
    for (const Parameter& b : block) p.push_back({prefix + b.name, b.shape});
  }
  for (const std::string& name : FinalNormNames(m)) p.push_back({name, {m.hidden}});
  if (!m.tied()) p.push_back({HeadWeightName(m), {m.vocab, m.hidden}});
  return p;
}

int64_t ParameterCount(const ModelSpec& m) {
  int64_t block = 0;
  for (const Parameter& b : BlockParameters(m)) block += b.numel();
  int64_t n = m.layers * block + m.vocab * m.hidden + static_cast<int64_t>(FinalNormNames(m).size()) * m.hidden;
  if (m.family == Family::kGpt2) n += (m.max_positions > 0 ? m.max_positions : m.sequence) * m.hidden;
  if (!m.tied()) n += m.vocab * m.hidden;
  return n;
}

std::vector<Parameter> BlockLoraParameters(const ModelSpec& m, const LoraSpec& lora) {
  std::vector<Parameter> out;
  if (!lora.enabled) return out;
  auto targeted = [&](const std::string& module) {
    return std::find(lora.target_modules.begin(), lora.target_modules.end(), module) != lora.target_modules.end();
  };
  for (const Parameter& p : BlockParameters(m)) {
    if (p.shape.size() != 2 || !EndsWith(p.name, ".weight")) continue;  // norms are vectors
    const std::string stem = p.name.substr(0, p.name.size() - std::string(".weight").size());
    // The Hugging Face module name: the stem's last part, GPT-2's attn_proj / mlp_proj being c_proj.
    std::string module = stem.substr(stem.rfind('.') == std::string::npos ? 0 : stem.rfind('.') + 1);
    if (module == "attn_proj" || module == "mlp_proj") module = "c_proj";
    if (!targeted(module)) continue;
    out.push_back({stem + ".lora_A.weight", {lora.rank, p.shape[1]}});
    out.push_back({stem + ".lora_B.weight", {p.shape[0], lora.rank}});
  }
  return out;
}

std::vector<Parameter> LoraParameters(const ModelSpec& m, const LoraSpec& lora) {
  std::vector<Parameter> out;
  const std::vector<Parameter> block = BlockLoraParameters(m, lora);
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    for (const Parameter& p : block) out.push_back({BlockPrefix(m, layer) + p.name, p.shape});
  }
  return out;
}

std::string LoraBaseWeight(const std::string& adapter) {
  for (const char* suffix : {".lora_A.weight", ".lora_B.weight"}) {
    if (EndsWith(adapter, suffix)) return adapter.substr(0, adapter.size() - std::string(suffix).size()) + ".weight";
  }
  return "";
}

int64_t LoraParameterCount(const ModelSpec& m, const LoraSpec& lora) {
  int64_t n = 0;
  for (const Parameter& p : BlockLoraParameters(m, lora)) n += p.numel();
  return n * m.layers;
}

HfTensorName ToHuggingFace(const ModelSpec& m, const std::string& ours) {
  if (m.family == Family::kGptNeox) return {ours == "embed_out.weight" ? ours : "gpt_neox." + ours, false};
  if (m.family != Family::kGpt2) return {ours == "lm_head.weight" ? ours : "model." + ours, false};
  HfTensorName hf{ours, false};
  for (const char* suffix : {"c_attn.weight", "attn_proj.weight", "c_fc.weight", "mlp_proj.weight"}) {
    hf.transposed |= EndsWith(ours, suffix);
  }
  auto replace = [&](const std::string& from, const std::string& to) {
    auto pos = hf.name.find(from);
    if (pos != std::string::npos) hf.name.replace(pos, from.size(), to);
  };
  replace(".c_attn.", ".attn.c_attn.");
  replace(".attn_proj.", ".attn.c_proj.");
  replace(".c_fc.", ".mlp.c_fc.");
  replace(".mlp_proj.", ".mlp.c_proj.");
  hf.name = "transformer." + hf.name;
  return hf;
}

}  // namespace strata::model
