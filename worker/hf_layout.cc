#include "worker/hf_layout.h"

#include <nlohmann/json.hpp>

namespace strata::worker {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

HfTensorName ToHuggingFace(const ModelSpec& spec, const std::string& ours) {
  if (spec.family == "llama") return {ours == "lm_head.weight" ? ours : "model." + ours, false};
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

std::string HuggingFaceConfigJson(const ModelSpec& s) {
  nlohmann::json config;
  if (s.family == "llama") {
    config = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
              {"hidden_size", s.hidden}, {"intermediate_size", s.ffn},
              {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
              {"num_hidden_layers", s.layers}, {"vocab_size", s.vocab},
              {"max_position_embeddings", s.sequence}, {"rms_norm_eps", s.norm_eps},
              {"rope_theta", s.rope_theta}, {"hidden_act", "silu"},
              {"attention_bias", false}, {"mlp_bias", false},
              {"tie_word_embeddings", false}, {"torch_dtype", "float32"}};
  } else {
    config = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"},
              {"n_embd", s.hidden}, {"n_head", s.heads}, {"n_layer", s.layers},
              {"n_inner", s.ffn}, {"n_positions", s.sequence}, {"n_ctx", s.sequence},
              {"vocab_size", s.vocab}, {"layer_norm_epsilon", s.norm_eps},
              {"activation_function", "gelu_new"}, {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0}, {"tie_word_embeddings", true}, {"torch_dtype", "float32"}};
  }
  return config.dump(2) + "\n";
}

}  // namespace strata::worker
