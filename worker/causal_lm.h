// The model families a worker can train, behind one interface: tokens [batch, time] (int64) ->
// logits [batch, time, vocab]. Parameter names follow Hugging Face's layouts (without the
// "transformer." / "model." prefix), so checkpoints map onto safetensors files by name.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "common/run_spec.h"

namespace strata::worker {

class CausalLm : public torch::nn::Module {
 public:
  virtual torch::Tensor Logits(const torch::Tensor& tokens) = 0;
};

// Builds the family named by spec.family ("gpt2" or "llama"), initialised from the current
// LibTorch generator (callers seed it).
std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec);

}  // namespace strata::worker
