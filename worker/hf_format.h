// Export to and load from Hugging Face directories (config.json + model.safetensors), so a
// model exported here loads in transformers (GPT2LMHeadModel / LlamaForCausalLM) and one saved
// by transformers' save_pretrained loads here. Names and layouts: hf_layout.h.
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
