#include "worker/causal_lm.h"

#include <mutex>

#include "worker/gpt2.h"
#include "worker/hf_format.h"
#include "worker/llama.h"

namespace strata::worker {

std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec) {
  if (spec.family == "llama") return std::make_shared<Llama>(spec);
  return std::make_shared<Gpt2>(spec);  // the run spec admits only these two families
}

namespace {
thread_local bool skip_random_init = false;
}  // namespace

bool RandomInitSkipped() { return skip_random_init; }

DenseImpl::DenseImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
}

Result<std::shared_ptr<CausalLm>> BuildCausalLm(const ModelSpec& spec, int64_t seed, bool for_resume) {
  std::shared_ptr<CausalLm> model;
  {
    // The generator is process-global: tasks sharing a process (tests) must not interleave
    // their initialisation.
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(static_cast<uint64_t>(seed));
    skip_random_init = for_resume;
    model = CreateCausalLm(spec);
    skip_random_init = false;
  }
  if (!spec.init_from.empty() && !for_resume) STRATA_RETURN_IF_ERROR(LoadHuggingFace(spec.init_from, spec, *model));
  return model;
}

torch::ScalarType ScalarTypeOf(const std::string& name) {
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kHalf;
  return torch::kFloat;  // the run spec admits only these three
}

storage::DType ToStoreDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return storage::DType::kF32;
    case torch::kHalf: return storage::DType::kF16;
    case torch::kBFloat16: return storage::DType::kBF16;
    case torch::kDouble: return storage::DType::kF64;
    case torch::kLong: return storage::DType::kI64;
    case torch::kInt: return storage::DType::kI32;
    default: return storage::DType::kU8;
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
