// LibTorch tensors as our store's bytes: dtype names, store dtypes and borrowed views.
#pragma once

#include <torch/torch.h>

#include <string>

#include "spec/spec_choices.h"
#include "storage/shard_store.h"

namespace strata::worker {

// The run spec's stored dtype (extract.dtype) and compute precision as a LibTorch scalar type.
torch::ScalarType ScalarTypeOf(StoredDType dtype);
torch::ScalarType ScalarTypeOf(Precision precision);
// Our store's dtype of a LibTorch scalar type, and a borrowed view of a contiguous CPU tensor.
storage::DType ToStoreDType(torch::ScalarType type);
storage::TensorView ViewOf(const torch::Tensor& cpu_contiguous);

}  // namespace strata::worker
