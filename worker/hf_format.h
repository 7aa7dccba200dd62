// Hugging Face layouts for our model families: names, shapes and config.json, so a model
// exported here loads in transformers (GPT2LMHeadModel / LlamaForCausalLM) and a directory saved
// by transformers' save_pretrained loads here.
//   gpt2:  ours "h.N.c_attn.weight" [3h, h]  <->  "transformer.h.N.attn.c_attn.weight" [h, 3h]
//          (HF GPT-2 uses Conv1D, whose weight is the transpose of a Linear's); the LM head is
//          tied to wte and not stored.
//   llama: ours "layers.N.self_attn.q_proj.weight" <-> "model.layers.N.self_attn.q_proj.weight";
//          "lm_head.weight" keeps its name.
#pragma once

#include <string>

#include "common/status.h"
#include "worker/causal_lm.h"

namespace strata::worker {

// Writes DIR/config.json and DIR/model.safetensors (fp32) of `model`.
Status ExportHuggingFace(CausalLm& model, const ModelSpec& spec, const std::string& dir);

// Loads DIR/model.safetensors into `model` (built for `spec`): every parameter must be present
// with the right shape (NotFound / InvalidArgument name the tensor); extra tensors are ignored.
Status LoadHuggingFace(const std::string& dir, const ModelSpec& spec, CausalLm& model);

}  // namespace strata::worker
