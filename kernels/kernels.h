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
#pragma once

#include <cstdint>
#include <string>

namespace strata::kernels {

struct Place {
  bool cuda = false;
  void* stream = nullptr;  // a cudaStream_t (CUDA only); null: the default stream
};

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

// The CPU references (what the Place-dispatching calls run on the CPU).
void AdamWReference(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    const float* decay_mask, int64_t n);
void MaskedSquareSumReference(const float* grad, const float* mask, int64_t n, float* out);

}  // namespace strata::kernels
