// Export to and load from Hugging Face directories, so a model exported here loads in
// transformers and one saved by save_pretrained loads here: config.json (spec/hf_config.h),
// weights as model.safetensors or several files with an index (model/hf_checkpoint.h), names
// and layouts from model/parameters.h. Source tensors may be F32, BF16 or F16.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "common/status.h"
#include "model/hf_checkpoint.h"
#include "model/parameters.h"
#include "spec/run_spec.h"

namespace strata::worker {

// A model's parameters by our names (CausalLm::named_parameters()): the one thing this file
// needs of a model, so it depends on none.
using NamedTensors = torch::OrderedDict<std::string, torch::Tensor>;

// Writes DIR/config.json and DIR/model.safetensors (fp32) of the parameters of a model of `spec`.
Status ExportHuggingFace(const NamedTensors& params, const ModelSpec& spec, const std::string& dir);

// Calls use(t) with `param` as `checkpoint` holds it: the source dtype (F32, BF16 or F16), our
// layout, a view of the memory-mapped file where no transpose is needed. Its pages are given back
// after use returns, so t must not outlive the call. NotFound / InvalidArgument name the tensor.
Status WithHfParameter(const model::HfCheckpoint& checkpoint, const ModelSpec& spec, const model::Parameter& param,
                       const std::function<void(const torch::Tensor&)>& use);

// Loads every one of `params` (of a model built for `spec`, on any device and dtype) from DIR, in
// place, one tensor at a time from the mapped files; extra tensors are ignored.
Status LoadHuggingFace(const std::string& dir, const ModelSpec& spec, const NamedTensors& params);

}  // namespace strata::worker
