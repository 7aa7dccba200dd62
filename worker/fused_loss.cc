#include "worker/fused_loss.h"

#include <algorithm>

namespace strata::worker {
namespace {

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor targets,
                               int64_t vocab, int64_t chunk_rows, int64_t compute_type) {
    // Both operands are cast to the compute dtype here and in backward (which autocast does not
    // reach), so an enclosing autocast changes nothing.
    const auto compute = static_cast<torch::ScalarType>(compute_type);
    const int64_t n = x.size(0);
    const torch::Tensor xc = x.to(compute), wc = weight.to(compute);
    auto lse = torch::empty({n}, x.options().dtype(torch::kFloat));
    auto loss = torch::zeros({}, x.options().dtype(torch::kFloat));
    for (int64_t begin = 0; begin < n; begin += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - begin);
      const auto z = torch::matmul(xc.narrow(0, begin, rows), wc.t()).narrow(1, 0, vocab).to(torch::kFloat);
      const auto chunk_lse = torch::logsumexp(z, 1);
      lse.narrow(0, begin, rows).copy_(chunk_lse);
      const auto picked = z.gather(1, targets.narrow(0, begin, rows).unsqueeze(1)).squeeze(1);
      loss += (chunk_lse - picked).sum();
    }
    ctx->save_for_backward({x, weight, targets, lse});
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["compute"] = compute_type;
    return loss / static_cast<double>(n);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const int64_t vocab = ctx->saved_data["vocab"].toInt();
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const auto compute = static_cast<torch::ScalarType>(ctx->saved_data["compute"].toInt());
    const int64_t n = x.size(0);
    const torch::Tensor xc = x.to(compute), wc = weight.to(compute);
    const torch::Tensor scale = grad[0].to(torch::kFloat) / static_cast<double>(n);
    auto dx = torch::empty_like(x);
    auto dw = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat));
    for (int64_t begin = 0; begin < n; begin += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - begin);
      const auto x_chunk = xc.narrow(0, begin, rows);
      auto z = torch::matmul(x_chunk, wc.t()).to(torch::kFloat);  // [rows, V'], padding included
      auto dz = torch::zeros_like(z);
      auto live = dz.narrow(1, 0, vocab);
      live.copy_(torch::exp(z.narrow(1, 0, vocab) - lse.narrow(0, begin, rows).unsqueeze(1)));
      live.scatter_add_(1, targets.narrow(0, begin, rows).unsqueeze(1), torch::full({rows, 1}, -1.0f, z.options()));
      dz.mul_(scale);
      z = torch::Tensor();  // one chunk's fp32 logits at a time
      const auto dzc = dz.to(compute);
      dx.narrow(0, begin, rows).copy_(torch::matmul(dzc, wc));
      dw += torch::matmul(dzc.t(), x_chunk).to(torch::kFloat);
    }
    return {dx, dw.to(weight.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t LinearCrossEntropyChunkRows(int64_t rows, int64_t padded_vocab) {
  const int64_t fit = kChunkLogitBytes / (std::max<int64_t>(padded_vocab, 1) * static_cast<int64_t>(sizeof(float)));
  if (fit >= rows) return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(64, fit / 64 * 64);
}

torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight, int64_t vocab, const torch::Tensor& targets,
                                 torch::ScalarType compute_type, int64_t chunk_rows) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && vocab <= weight.size(0),
              "LinearCrossEntropy: x [N, H], weight [V', H] with V' >= vocab");
  if (chunk_rows <= 0) chunk_rows = LinearCrossEntropyChunkRows(x.size(0), weight.size(0));
  return LinearCrossEntropyFunction::apply(x, weight, targets.to(torch::kLong), vocab, chunk_rows, static_cast<int64_t>(compute_type));
}

}  // namespace strata::worker
