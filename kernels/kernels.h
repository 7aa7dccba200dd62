// Fused kernels behind a plain C++ API: raw pointers, element counts and a stream; no LibTorch.
// Each kernel has a CPU reference (used by CPU workers and CI) and, in CUDA builds, a CUDA
// version (kernels/*.cu) checked against it. Pointers of a CUDA call are device pointers of one
// device; the call is queued on `place.stream` and returns before the kernel finishes.
//
// AdamW, for one flat fp32 vector (a parameter unit, or this rank's ZeRO shard of one), in one
// pass over memory - what the unfused form spends ten kernels and ~40 bytes per element on:
//   g  = grad * grad_scale                          (gradient clipping's factor, 1 without)
//   p  = p * (1 - lr * weight_decay * decay[i])     (decay[i]: 1 for matrices, 0 otherwise)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// in fp32, with the scalar factors rounded to fp32 once (as LibTorch's tensor ops do), so it
// equals LibTorch's op-by-op form to within fused multiply-add rounding (kernels_test states
// the bound).
//
// MaskedSquareSum: sum over i of (g[i] * mask[i])^2 - the gradient norm's share of one unit,
// counting each element once (mask 0 for tensor-parallel replicas and tied copies). Accumulated
// into *out, so the units of a step add into one scalar; deterministic (a fixed reduction order
// for a given n), unlike atomics.
//
// CrossEntropyGradInPlace: the softmax cross-entropy of each row of logits z ([rows, row_stride],
// of which the first `vocab` columns are the vocabulary and the rest padding), and its gradient
// written over the logits - the loss's whole elementwise work in one kernel reading each row
// twice (the second read mostly from L2) and writing it once, where the unfused form widens to
// fp32 and makes ~12 passes. In fp32 whatever the storage dtype:
//   m_i = max_{v < V} z_iv,   lse_i = m_i + log sum_{v < V} exp(z_iv - m_i)
//   row_loss[i] = lse_i - z_{i t_i}
//   z_iv <- grad_scale * (exp(z_iv - lse_i) - [v = t_i])   for v < V;   0 for V <= v < row_stride
// rounded to the storage dtype (bf16: round to nearest even, as LibTorch converts).
#pragma once

#include <cstdint>
#include <string>

namespace strata::kernels {

struct Place {
  bool cuda = false;
  void* stream = nullptr;  // a cudaStream_t (CUDA only); null: the default stream
};

// Storage dtype of a kernel's tensors where it takes more than fp32 (bf16 as raw uint16 bits).
enum class DType { kFloat32, kBFloat16 };

struct AdamWArgs {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;          // t, 1-based: the bias corrections' exponent
  double grad_scale = 1.0;   // clipping's factor
};

// True when this build has the CUDA kernels.
bool HasCuda();

void AdamW(const Place& place, const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
           const float* decay_mask, int64_t n);

// `scratch`: at least MaskedSquareSumScratch() floats on the same device (CUDA; unused on CPU).
void MaskedSquareSum(const Place& place, const float* grad, const float* mask, int64_t n, float* out, float* scratch);
int64_t MaskedSquareSumScratch();

// `targets` [rows] in [0, vocab); `row_loss` [rows] fp32; all on the place's device.
void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                             const int64_t* targets, float grad_scale, float* row_loss);

// The CPU references (what the Place-dispatching calls run on the CPU).
void AdamWReference(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    const float* decay_mask, int64_t n);
void MaskedSquareSumReference(const float* grad, const float* mask, int64_t n, float* out);
void CrossEntropyGradInPlaceReference(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                      const int64_t* targets, float grad_scale, float* row_loss);

}  // namespace strata::kernels
