// The memory and step-time model's constants, rounding and shared pieces (private to shard/): shared by the
// per-worker memory pieces (memory_parts.cc) and the plan's evaluation (estimator.cc), whose
// header comment derives them ("Calibration").
#pragma once

#include <cmath>
#include <cstdint>

#include "spec/run_spec.h"

namespace strata::shard::estimator_constants {

inline ModelSpec Filled(ModelSpec model) {
  if (model.kv_heads == 0) model.kv_heads = model.heads;
  if (model.ffn == 0) model.ffn = 4 * model.hidden;
  return model;
}

// See "Calibration" above.
// Step-time terms at 989 TFLOP/s peak (the header's "Step time").
constexpr double kReferencePeakFlops = 989e12;
constexpr double kElementwiseSecondsPerElement = 115e-12;  // per element of tokens x hidden per layer
// Of that, the norms' and residual adds' share, which sequence parallelism runs on 1/tp of the
// tokens (attention and the MLP's activation already run on the rank's heads and columns, but the
// constant above was fitted with them counted whole): kernels_bench on an H200 (docs/benchmarks.md)
// puts the fused RMSNorm and add + RMSNorm forward and backward at 7.5 and 12.6 ps a element of the
// 115, LayerNorm's at 11.7 and 17.6.
constexpr double kSequenceParallelShare = 0.2;
constexpr double kLossSecondsPerLogit = 2.3e-12;  // the fused loss's elementwise work, per logit
constexpr double kOptimizerSecondsPerParam = 4e-12;
// What a step costs once whatever its size (the gradient norm and the loss's scalars across the
// ranks, a host sync, the update's launches per unit): 1.0 ms, fitted on 2x H200, 2026-11-29
// (docs/history/benchmarks-sessions.md, "vocab-parallel embedding, head and loss") from GPT-2
// 124M on H200s, one GPU (20.54 ms a step of 8 sequences) against pp=2 with 16 micro-batches
// (177.0 ms): a per-token miss of 0.65 ms a micro-batch and a per-step miss of 0.98 ms explain both.
// Fitted on GPUs and counted as is on CPU workers too, whose plans the step time only ranks.
constexpr double kStepSeconds = 1.0e-3;
// A streamed ZeRO-3 unit's fixed cost over NCCL, per micro-batch, for its forward gather and for
// its reduce-scatter: 32 us each, from GPT-2 124M on 2x H200, 2026-11-29
// (bench/results/mesh-ranking-2026-11-29-s28-h200x2.json): dp=2 ZeRO-3 took
// 21.31 ms a step against one GPU's 20.42, the bytes hidden by the matmuls, so 0.90 ms for 14
// units' two collectives (the embedding looked up from its shards, the dp mean folded into the
// update). The backward's gathers, prefetched behind the previous layer's gradients, cost next to
// nothing of their own (2x H200, 2026-11-29: keeping all 12 layers gathered saved 0.05 ms). The
// fits of 2026-11-29 and 2026-11-28 (docs/history/benchmarks-sessions.md, "vocab-parallel
// embedding, head and loss" and "ZeRO-3 streamed in bf16 beside the compute") measured 70 and
// 110 us. CPU workers have no side stream (worker/train/side_stream.h): their
// collectives run in line, hidden by nothing, and are charged whole below.
constexpr double kGatherSeconds = 32e-6;
// The same for host-streamed units (offload = "optimizer+params" on one rank: an upload, a cast
// and events per unit): the value of 2026-11-28 (docs/history/benchmarks-sessions.md, "ZeRO-3
// streamed in bf16 beside the compute"), that path not measured again.
constexpr double kHostStreamSeconds = 110e-6;
constexpr double kActivationScale = 1.153;     // GPT-2-style blocks (LayerNorm, bias + GELU)
constexpr double kGatedActivationScale = 1.0;  // gated-MLP blocks (RMSNorm, SwiGLU/GeGLU, RoPE)
constexpr double kBytesPerChunkLogit = 1.76;
constexpr int64_t kStepTemporaryBytes = int64_t{60} << 20;
// worker/nn/fused_loss.h: the fused loss makes its logits in row chunks of at most this many bytes.
constexpr double kLossChunkBytes = double(int64_t{256} << 20);
constexpr double kWorkingCopyBytes = 2;  // bf16

inline int64_t ActivationBytesPerElement(bool fp32_activations) { return fp32_activations ? 4 : 2; }
// The residual stream is fp32 in both precisions (worker/nn/fused_ops.h: the norms take it in fp32).
constexpr double kResidualBytes = 4;

// Every estimate is computed in double (products such as sequence x micro-batch x hidden x layers
// x micro-batches in flight overflow an int64 long before the run spec's bounds) and rounded here,
// clamped to [0, 2^58] bytes (256 PiB): far beyond any device, so a plan at the ceiling never fits,
// and the six parts of MemoryEstimate::total() cannot overflow their int64 sum. A negative or NaN
// input (a caller's bug) counts as 0 rather than wrapping.
constexpr int64_t kCeilingBytes = int64_t{1} << 58;
inline int64_t ToBytes(double bytes) {
  if (!(bytes > 0)) return 0;
  if (bytes >= static_cast<double>(kCeilingBytes)) return kCeilingBytes;
  return std::llround(bytes);
}

inline double RingAllReduceSeconds(double bytes, int64_t n, double bandwidth) {
  return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * bytes / bandwidth;
}

// StageActivationBytes from one layer's activations, `full` (LayerActivationBytes).
inline int64_t StageActivationBytesOf(double full, const ModelSpec& model, int64_t sequence, int64_t micro_batch,
                                      int64_t tp, int64_t layers, int64_t in_flight, bool recompute,
                                      bool sequence_parallel) {
  const double held = static_cast<double>(in_flight) * static_cast<double>(layers);
  if (!recompute) return ToBytes(held * full);
  const double layer_input = static_cast<double>(sequence) * static_cast<double>(micro_batch) *
                             static_cast<double>(model.hidden) * kResidualBytes /
                             (sequence_parallel ? static_cast<double>(tp) : 1.0);
  return ToBytes(held * layer_input + full);
}

// QLoRA's NF4 base (worker/nn/nf4_linear.h): 4 bits a weight, an 8-bit scale per 64 and an fp32
// scale per 256 x 64 (bitsandbytes' double quantization): 4.127 bits. Its dequantization
// (kernels::Nf4Dequantize, one pass) holds nothing but its compute-dtype result, one matrix at a time.
inline constexpr double kNf4BytesPerWeight = (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8;
}  // namespace strata::shard::estimator_constants
