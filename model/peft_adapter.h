// PEFT's layout of LoRA adapters (no LibTorch): what `strata export --adapter` writes and
// peft.PeftModel.from_pretrained(base, dir) reads.
//   adapter_model.safetensors  "base_model.model." + the Hugging Face name of each adapter
//                              ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
//                              [r, in]; lora_B [out, r]; GPT-2's Conv1D bases too, untransposed)
//   adapter_config.json        LoraConfig's fields: peft_type "LORA", task_type "CAUSAL_LM", r,
//                              lora_alpha, lora_dropout, target_modules, use_rslora, bias "none",
//                              fan_in_fan_out (true for GPT-2's Conv1D), base_model_name_or_path
#pragma once

#include <string>

#include "spec/run_spec.h"

namespace strata::model {

// PEFT's key of the adapter tensor `ours` (model::LoraParameters' name).
std::string PeftTensorName(const ModelSpec& m, const std::string& ours);
// Our name of PEFT's key `peft` ("" when it is no adapter of the model's layout).
std::string FromPeftTensorName(const ModelSpec& m, const LoraSpec& lora, const std::string& peft);
std::string PeftAdapterConfigJson(const ModelSpec& m, const LoraSpec& lora);

// model.adapter_from's tensors, before anything starts (headers only): every adapter of `lora`
// (ReadPeftLoraConfig's, or the run's [lora]) is in DIR/adapter_model.safetensors with its shape
// over this base and a float dtype, and no adapter tensor is left over. InvalidArgument naming
// the tensor, the base (model.init_from, or the seed) and the adapter's base_model_name_or_path.
Status CheckPeftAdapter(const std::string& dir, const ModelSpec& m, const LoraSpec& lora);
// The check submit and a worker make of m.adapter_from before a run starts (OK without one):
// CheckPeftAdapter with the run's [lora] (`run_lora`, a train run's), else the adapter's own
// config (ReadPeftLoraConfig: an extract or patch run merges it as saved).
Status CheckAdapterFrom(const ModelSpec& m, const LoraSpec& run_lora);

}  // namespace strata::model
