// LibTorch tensors as our store's bytes: dtype names, store dtypes and borrowed views.
#pragma once

#include <torch/torch.h>

#include <string>

#include "storage/shard_store.h"

namespace strata::worker {

// "fp32" / "bf16" / "fp16" (run spec dtype and precision names) as a LibTorch scalar type.
torch::ScalarType ScalarTypeOf(const std::string& name);
// Our store's dtype of a LibTorch scalar type, and a borrowed view of a contiguous CPU tensor.
storage::DType ToStoreDType(torch::ScalarType type);
storage::TensorView ViewOf(const torch::Tensor& cpu_contiguous);

}  // namespace strata::worker
