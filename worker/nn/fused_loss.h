// The language-model head and its loss in one piece, in row chunks (internal to worker/, includes
// LibTorch): the [rows, vocab] logits exist one chunk at a time, in the compute dtype only - never
// whole, never in fp32 (unless fp32 is the compute dtype).
//
// For rows x_i (i < N) of the final norm's output, head W ([V', H], V' >= V: W's rows past the
// vocabulary V are padding for aligned matmuls and never count) and targets t_i:
//   z_i = W x_i (in the compute dtype: bf16 under train.precision "bf16" on a GPU, else fp32)
//   lse_i = log sum_{v < V} exp(z_iv)                               (in fp32)
//   loss = (1/N) sum_i (lse_i - z_{i t_i})                         (cross-entropy, mean over rows)
//   dz_iv = (1/N) (softmax(z_i)_v - [v = t_i])   for v < V, 0 for the padding
//   dx_i = W^T dz_i,   dW = sum_i dz_i x_i^T
// The loss is the end of the graph, so its gradient is computed in the forward, chunk by chunk
// (as Liger-Kernel's fused linear cross-entropy): the chunk's logits are made by one matmul,
// kernels::CrossEntropyGradInPlace turns them into the row losses and overwrites them with dz,
// and two matmuls give the chunk's dx and its share of dW. Backward only scales dx and dW by the
// incoming gradient. No recompute of the logits, and one chunk of logits alive at a time plus
// dx ([N, H]) and dW ([V', H] fp32) until backward.
//
// Vocab-parallel (tensor parallelism, shard/layout.h): rank r of T holds the head's rows
// [r V/T, (r+1) V/T), so its logits are z_iv for its slice only. Per chunk, each rank computes
// its slice's lse^r_i and z_{i t_i} where t_i falls in its slice (0 elsewhere), the ranks
// all-gather those two numbers a row, and every rank forms the same
//   lse_i = log sum_r exp(lse^r_i),   loss_i = lse_i - sum_r z^r_{i t_i}
// (kernels::CrossEntropyRowStats), then its slice's dz from lse_i (CrossEntropyGradFromLse). Its
// dx is its slice's share of W^T dz: the caller sums the shares over the ranks in backward
// (Megatron's f before the head), and its dW is its rows' whole gradient.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>

#include "worker/nn/fused_linear.h"

namespace strata::worker {

// Logits per chunk, in the compute dtype: 256 MiB (GPT-2's vocabulary in bf16: 2,624 rows).
inline constexpr int64_t kChunkLogitBytes = int64_t{256} << 20;

// Rows per chunk for a padded vocabulary `padded_vocab` and logits of `element_bytes` each (the
// whole of `rows` if it fits; else a multiple of 64, at least 64).
int64_t LinearCrossEntropyChunkRows(int64_t rows, int64_t padded_vocab, int64_t element_bytes);

// loss (above): x [N, H] (any float dtype), weight [V', H] (fp32 master or any float), targets
// [N] int64 in [0, vocab). `chunk_rows` 0: LinearCrossEntropyChunkRows. Differentiable in x and
// weight (the gradients are computed only for those that require one).
//
// `slice` (vocab-parallel): weight holds vocabulary rows [slice->begin, slice->begin + vocab) and
// targets are whole-vocabulary ids; slice->gather all-gathers a [k] fp32 tensor over the
// tensor-parallel ranks into [ranks * k] in rank order. The slice is read during the call only.
struct VocabSlice {
  int64_t begin = 0;
  std::function<torch::Tensor(const torch::Tensor&)> gather;
};
//
// `into` (a weight read through a gradient sink, fused_linear.h): dW's first `rows` rows (the
// rest is padding) go into the sink in fp32 - scaled by the incoming gradient in the same pass -
// and not through autograd, so no [V', H] dW is cast to the weight's dtype (bf16: rounded) and
// widened back, and `weight` takes no gradient. The caller counted the use (CountUse).
struct HeadGradient {
  GradientSink* sink = nullptr;
  torch::Tensor param;  // the parameter the sink belongs to (an autograd input: the backward runs)
  int64_t rows = 0;
};
torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight, int64_t vocab,
                                 const torch::Tensor& targets, torch::ScalarType compute_type, int64_t chunk_rows = 0,
                                 const VocabSlice* slice = nullptr, const HeadGradient* into = nullptr);

}  // namespace strata::worker
