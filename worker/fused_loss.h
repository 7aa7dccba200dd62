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
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace strata::worker {

// Logits per chunk, in the compute dtype: 256 MiB (GPT-2's vocabulary in bf16: 2,624 rows).
inline constexpr int64_t kChunkLogitBytes = int64_t{256} << 20;

// Rows per chunk for a padded vocabulary `padded_vocab` and logits of `element_bytes` each (the
// whole of `rows` if it fits; else a multiple of 64, at least 64).
int64_t LinearCrossEntropyChunkRows(int64_t rows, int64_t padded_vocab, int64_t element_bytes);

// loss (above): x [N, H] (any float dtype), weight [V', H] (fp32 master or any float), targets
// [N] int64 in [0, vocab). `chunk_rows` 0: LinearCrossEntropyChunkRows. Differentiable in x and
// weight (the gradients are computed only for those that require one).
torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight, int64_t vocab,
                                 const torch::Tensor& targets, torch::ScalarType compute_type, int64_t chunk_rows = 0);

}  // namespace strata::worker
