#include "worker/nn/tensor_bytes.h"

namespace strata::worker {

torch::ScalarType ScalarTypeOf(StoredDType dtype) {
  switch (dtype) {
    case StoredDType::kFp32:
      return torch::kFloat;
    case StoredDType::kBf16:
      return torch::kBFloat16;
    case StoredDType::kFp16:
      return torch::kHalf;
  }
  return torch::kFloat;
}

torch::ScalarType ScalarTypeOf(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return torch::kFloat;
    case Precision::kBf16:
      return torch::kBFloat16;
  }
  return torch::kFloat;
}

storage::DType ToStoreDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return storage::DType::kF32;
    case torch::kHalf:
      return storage::DType::kF16;
    case torch::kBFloat16:
      return storage::DType::kBF16;
    case torch::kDouble:
      return storage::DType::kF64;
    case torch::kLong:
      return storage::DType::kI64;
    case torch::kInt:
      return storage::DType::kI32;
    default:
      return storage::DType::kU8;
  }
}

storage::TensorView ViewOf(const torch::Tensor& cpu_contiguous) {
  storage::TensorView view;
  view.dtype = ToStoreDType(cpu_contiguous.scalar_type());
  view.shape.assign(cpu_contiguous.sizes().begin(), cpu_contiguous.sizes().end());
  view.bytes = {static_cast<const uint8_t*>(cpu_contiguous.data_ptr()),
                static_cast<size_t>(cpu_contiguous.numel() * cpu_contiguous.element_size())};
  return view;
}

}  // namespace strata::worker
