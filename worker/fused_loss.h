// The language-model head and its loss in one piece, in row chunks (internal to worker/, includes
// LibTorch): the [rows, vocab] logits never exist whole, in fp32 or otherwise.
//
// For rows x_i (i < N) of the final norm's output, head W ([V', H], V' >= V: W's rows past the
// vocabulary V are padding for aligned matmuls and never count) and targets t_i:
//   z_i = W x_i (in the compute dtype: bf16 under train.precision "bf16", else fp32), read as fp32
//   lse_i = log sum_{v < V} exp(z_iv)
//   loss = (1/N) sum_i (lse_i - z_{i t_i})                         (cross-entropy, mean over rows)
// Backward, with g = dloss:
//   dz_iv = (g/N) (softmax(z_i)_v - [v = t_i])   for v < V, 0 for the padding
//   dx_i = W^T dz_i,   dW = sum_i dz_i x_i^T     (dW accumulated in fp32 over the chunks)
// Forward keeps only lse ([N] fp32) besides the inputs; backward recomputes z chunk by chunk.
// Peak extra memory is one chunk's logits ([C, V'] in the compute dtype and fp32, and the
// gradient chunk) instead of [N, V'] three times - for GPT-2 with 8 x 1024 rows, ~0.3 GiB instead
// of ~4 GiB. Chunks are kChunkLogitBytes of fp32 logits (a multiple of 64 rows).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace strata::worker {

// fp32 logits per chunk: 256 MiB.
inline constexpr int64_t kChunkLogitBytes = int64_t{256} << 20;
// The trainer (StageModel::HeadLoss) takes this path only when a micro-batch's fp32 logits would
// exceed 4 GiB (a 128k vocabulary at 8 x 1024 rows): below that, LibTorch's whole-logits loss is
// faster. Measured on one H200, GPT-2 124M, 8 x 1024, bf16 (1.6 GiB of fp32 logits): 206,200
// tokens/s and a 6.00 GiB peak through the chunks, against 255,107 tokens/s whole (an earlier
// session on the same card type, not the same command). The chunks' elementwise passes
// (widening, logsumexp, exp, the one-hot subtraction, the scale, narrowing back) are separate
// LibTorch kernels over [chunk, V'] fp32; one fused kernel for them is the next step.
inline constexpr int64_t kWholeLogitBytes = int64_t{4} << 30;

// Rows per chunk for a padded vocabulary `padded_vocab` (>= 64, a multiple of 64 unless the
// whole of `rows` fits).
int64_t LinearCrossEntropyChunkRows(int64_t rows, int64_t padded_vocab);

// loss (above): x [N, H] (any float dtype), weight [V', H] (fp32 master or any float), targets
// [N] int64 in [0, vocab). `chunk_rows` 0: LinearCrossEntropyChunkRows. Differentiable in x and
// weight.
torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight, int64_t vocab,
                                 const torch::Tensor& targets, torch::ScalarType compute_type, int64_t chunk_rows = 0);

}  // namespace strata::worker
