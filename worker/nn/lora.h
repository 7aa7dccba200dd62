// LoRA adapters' tensors (internal to worker/, includes LibTorch): their initial values, the same
// on every rank and mesh. The maths is run_spec.h LoraSpec's; ParamView::Linear computes it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::worker {

// Every adapter of the model (model::LoraParameters), fp32 on the host, as PEFT initialises
// them: A Kaiming-uniform with a = sqrt(5), i.e. uniform in +-1 / sqrt(in); B zero, so the
// adapted model starts as the base. Drawn from a generator of its own seeded by `seed`, in the
// table's order, so any mesh and any rank start from the same adapters.
std::map<std::string, torch::Tensor> InitialLoraAdapters(const ModelSpec& model, const LoraSpec& lora, int64_t seed);

// The adapters of `lora` read from a PEFT directory (model.adapter_from: adapter_model.safetensors,
// checked by model::CheckPeftAdapter), by our names, fp32 on the host.
Result<std::map<std::string, torch::Tensor>> ReadPeftAdapter(const std::string& dir, const ModelSpec& model,
                                                             const LoraSpec& lora);

// model.adapter_from merged into a model's weights in place: W += scale * B A for each adapted
// linear (in fp32, then W's dtype, on W's device), with the adapter's own r, lora_alpha and
// use_rslora (ReadPeftLoraConfig). `params` are the model's by our names (CausalLm's).
Status MergePeftAdapter(const std::string& dir, const ModelSpec& model,
                        const torch::OrderedDict<std::string, torch::Tensor>& params);

}  // namespace strata::worker
