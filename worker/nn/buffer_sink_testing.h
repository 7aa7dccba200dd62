// For tests only: a GradientSink (fused_linear.h) as StageModel's slot is - one fp32 buffer,
// written on the step's first use and added after - that counts its uses and writes.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>

#include "worker/nn/fused_linear.h"

namespace strata::worker {

class BufferSink final : public GradientSink {
 public:
  explicit BufferSink(torch::Tensor initial) : buffer(std::move(initial)) {}
  torch::Tensor Use(const torch::Tensor&, const torch::Tensor& value) override {
    CountUse();
    return value;
  }
  void CountUse() override { ++uses; }
  void Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) override {
    torch::NoGradGuard no_grad;
    write(buffer, received++ == 0);
  }
  torch::Tensor buffer;
  int uses = 0, received = 0;
};

}  // namespace strata::worker
