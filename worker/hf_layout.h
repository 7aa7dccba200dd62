// Where each of our parameters lives in a Hugging Face checkpoint, and the config.json that
// describes the model, without LibTorch (the CLI's `strata export` uses it too).
//   gpt2:  ours "h.N.c_attn.weight" [3h, h]  <->  "transformer.h.N.attn.c_attn.weight" [h, 3h]
//          (HF GPT-2 uses Conv1D, whose weight is the transpose of a Linear's); the LM head is
//          tied to wte and not stored.
//   llama: ours "layers.N.self_attn.q_proj.weight" <-> "model.layers.N.self_attn.q_proj.weight";
//          "lm_head.weight" keeps its name.
#pragma once

#include <string>

#include "common/run_spec.h"

namespace strata::worker {

struct HfTensorName {
  std::string name;
  bool transposed = false;  // the HF tensor is the transpose of ours (2-D)
};

HfTensorName ToHuggingFace(const ModelSpec& spec, const std::string& ours);

// config.json text for transformers (GPT2LMHeadModel / LlamaForCausalLM), fp32.
std::string HuggingFaceConfigJson(const ModelSpec& spec);

}  // namespace strata::worker
