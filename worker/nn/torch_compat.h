// The one place that knows LibTorch versions apart: Debian's LibTorch 1.13 (CPU, CI) and pip
// PyTorch 2.11's LibTorch (CUDA 13, GPU node). Everything else calls these helpers.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#define STRATA_TORCH_HAS_SDPA 1
#else
#define STRATA_TORCH_HAS_SDPA 0
#endif

// Kineto traces from C++ (worker/train/device_memory.h StepProfiler, bench/train_step_bench --profile).
#if TORCH_VERSION_MAJOR >= 2 && __has_include(<torch/csrc/autograd/profiler_kineto.h>)
#define STRATA_TORCH_HAS_KINETO 1
#else
#define STRATA_TORCH_HAS_KINETO 0
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define STRATA_TORCH_DEVICE_AUTOCAST 1  // set_autocast_enabled(device_type, ...) API
#else
#define STRATA_TORCH_DEVICE_AUTOCAST 0
#endif

// scaled_dot_product_attention(..., enable_gqa): key/value heads shared by groups of query heads
// without repeating them in memory (2.5+; the flash kernel reads each kv head for its group).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define STRATA_TORCH_HAS_SDPA_GQA 1
#else
#define STRATA_TORCH_HAS_SDPA_GQA 0
#endif

// addmm with an output dtype other than the inputs' (bf16 x bf16 -> fp32 on CUDA: aten's
// addmm.dtype_out, 2.8+; 2.9 is the first version this was built against).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#define STRATA_TORCH_HAS_MATMUL_OUT_DTYPE 1
#else
#define STRATA_TORCH_HAS_MATMUL_OUT_DTYPE 0
#endif

// LibTorch's own multi-tensor fused AdamW (at::_fused_adamw_), compared against in bench/kernels_bench.
#define STRATA_TORCH_HAS_FUSED_ADAMW (TORCH_VERSION_MAJOR >= 2)

namespace strata::worker::compat {

// bf16 autocast on a CUDA device for the guard's lifetime: matmuls and attention run in bf16,
// parameters (the fp32 master weights) and reductions such as the loss stay fp32. A no-op on CPU
// or when not enabled.
class AutocastGuard {
 public:
  AutocastGuard(const torch::Device& device, bool bf16) : active_(bf16 && device.is_cuda()) {
    if (!active_) return;
#if STRATA_TORCH_DEVICE_AUTOCAST
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if STRATA_TORCH_DEVICE_AUTOCAST
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_;
};

// Whether bf16 autocast (AutocastGuard) is on for CUDA in this thread.
inline bool CudaAutocastEnabled() {
#if STRATA_TORCH_DEVICE_AUTOCAST
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

// The dtype an op's output should take so that no consumer casts it again: bf16 for a CUDA
// tensor under autocast (what autocast would cast it to for the next matmul), else x's own.
inline torch::ScalarType ComputeType(const torch::Tensor& x) {
  return x.is_cuda() && CudaAutocastEnabled() ? torch::kBFloat16 : x.scalar_type();
}

// out = a b (accumulate: out += a b) into the fp32 `out`, for a and b of one dtype. bf16 on a GPU
// with LibTorch 2.9+: one cuBLAS call writes fp32 itself (beta 0 or 1), never a bf16 product.
// fp32: the product written straight into `out`, or added. Elsewhere (bf16 on the CPU, older
// LibTorch): the product in a's dtype, then widened into `out` by a copy or an add.
inline void MatmulIntoFloat(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, bool accumulate) {
#if STRATA_TORCH_HAS_MATMUL_OUT_DTYPE
  if (out.is_cuda() && a.scalar_type() != torch::kFloat) {
    at::addmm_out(out, out, a, b, at::kFloat, /*beta=*/accumulate ? 1 : 0, /*alpha=*/1);
    return;
  }
#endif
  if (a.scalar_type() == torch::kFloat && !accumulate) {
    at::mm_out(out, a, b);
  } else if (accumulate) {
    out.add_(at::mm(a, b));
  } else {
    out.copy_(at::mm(a, b));
  }
}

// Causal attention over q [batch, heads, time, head_dim] and k, v [batch, kv_heads, time, head_dim],
// kv_heads dividing heads: query head h reads kv head h / (heads / kv_heads) (grouped-query
// attention; kv_heads = heads is plain multi-head). LibTorch 2.x uses the fused kernel (flash /
// memory-efficient on GPU), from 2.5 with the groups read in place (enable_gqa) rather than k and
// v repeated in memory; 1.13 has none, so it is spelled out: softmax(q k^T / sqrt(d) + mask) v.
// `window` > 0 (Mistral's sliding window): query i attends to keys j with i - window < j <= i, as
// transformers' sliding_window_causal_mask.
inline torch::Tensor CausalAttention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, int64_t window = 0) {
  const int64_t t = q.size(-2), group = q.size(-3) / k.size(-3);
  const bool windowed = window > 0 && t > window;
  torch::Tensor allowed;
  if (windowed) {
    auto i = torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(q.device())).unsqueeze(1);
    auto j = i.transpose(0, 1);
    allowed = (j <= i).logical_and(j > i - window);
  }
#if STRATA_TORCH_HAS_SDPA_GQA
  // A mask rules the flash kernel out, and the memory-efficient one takes no groups: repeat there.
  const bool gqa = group > 1 && !windowed;
#else
  const bool gqa = false;
#endif
  if (group > 1 && !gqa) {
    k = k.repeat_interleave(group, -3);
    v = v.repeat_interleave(group, -3);
  }
#if STRATA_TORCH_HAS_SDPA_GQA
  if (windowed) return at::scaled_dot_product_attention(q, k, v, allowed, /*dropout_p=*/0.0, /*is_causal=*/false);
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*scale=*/std::nullopt,
                                          /*enable_gqa=*/gqa);
#elif STRATA_TORCH_HAS_SDPA
  if (windowed) return at::scaled_dot_product_attention(q, k, v, allowed, /*dropout_p=*/0.0, /*is_causal=*/false);
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (!windowed) allowed = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril();
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
#endif
}

// An allocation that failed: the CUDA caching allocator's OutOfMemoryError, std::bad_alloc, or
// the CPU allocator's refusal under an address-space limit, which has no type of its own and is
// worded "can't allocate memory" (1.13) or "not enough memory" (2.x).
inline bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) || dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string what = e.what();
  return what.find("DefaultCPUAllocator") != std::string::npos &&
         (what.find("can't allocate memory") != std::string::npos ||
          what.find("not enough memory") != std::string::npos);
}

// The first line of an allocator error (LibTorch appends a backtrace to c10::Error's what()).
inline std::string OutOfMemoryDetail(const std::exception& e) {
  std::string what = e.what();
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) what = c10_error->what_without_backtrace();
  // 1.13 prefixes "[enforce fail at alloc_cpu.cpp:75] err == 0. "; the allocator's own words follow.
  if (const auto own = what.find("DefaultCPUAllocator"); own != std::string::npos) what = what.substr(own);
  const auto end = what.find('\n');
  return end == std::string::npos ? what : what.substr(0, end);
}

}  // namespace strata::worker::compat
