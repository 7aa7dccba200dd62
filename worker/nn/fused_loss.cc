#include "worker/nn/fused_loss.h"

#include <algorithm>

#include "worker/nn/kernel_place.h"
#include "worker/nn/torch_compat.h"

namespace strata::worker {
namespace {

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               torch::Tensor targets, int64_t vocab, int64_t chunk_rows, int64_t compute_type,
                               int64_t slice_handle, torch::Tensor /*param*/, int64_t sink, int64_t sink_rows) {
    // Both operands are cast to the compute dtype here, so an enclosing autocast changes nothing.
    const auto compute = static_cast<torch::ScalarType>(compute_type);
    const kernels::Place place = KernelPlace(x.device());
    const int64_t n = x.size(0), padded_vocab = weight.size(0);
    const bool need_dx = x.requires_grad(), need_dw = weight.requires_grad() || sink != 0;
    const torch::Tensor xc = x.to(compute).contiguous(), wc = weight.to(compute).contiguous();
    const auto* slice = reinterpret_cast<const VocabSlice*>(slice_handle);
    // Vocab-parallel: each target's column in this rank's slice (outside [0, vocab) where the
    // target is another rank's).
    const torch::Tensor row_targets =
        slice ? (targets.to(torch::kLong) - slice->begin).contiguous() : targets.to(torch::kLong).contiguous();
    auto row_loss = torch::empty({n}, x.options().dtype(torch::kFloat));
    torch::Tensor dx = need_dx ? torch::empty({n, x.size(1)}, xc.options()) : torch::Tensor();
    torch::Tensor dw;
    for (int64_t begin = 0; begin < n; begin += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - begin);
      const torch::Tensor x_chunk = xc.narrow(0, begin, rows);
      torch::Tensor z = torch::mm(x_chunk, wc.t());  // [rows, V'], contiguous
      const int64_t* chunk_targets = row_targets.data_ptr<int64_t>() + begin;
      if (!slice) {
        kernels::CrossEntropyGradInPlace(place, KernelType(compute), z.data_ptr(), rows, vocab, padded_vocab,
                                         chunk_targets, 1.0f / static_cast<float>(n),
                                         row_loss.data_ptr<float>() + begin);
      } else {
        auto stats = torch::empty({2, rows}, x.options().dtype(torch::kFloat));  // this slice's lse, target logit
        kernels::CrossEntropyRowStats(place, KernelType(compute), z.data_ptr(), rows, vocab, padded_vocab,
                                      chunk_targets, stats.data_ptr<float>(), stats.data_ptr<float>() + rows);
        const torch::Tensor every = slice->gather(stats.view({-1})).view({-1, 2, rows});  // [ranks, 2, rows]
        const torch::Tensor lse = torch::logsumexp(every.select(1, 0), 0).contiguous();
        row_loss.narrow(0, begin, rows).copy_(lse - every.select(1, 1).sum(0));
        kernels::CrossEntropyGradFromLse(place, KernelType(compute), z.data_ptr(), rows, vocab, padded_vocab,
                                         chunk_targets, lse.data_ptr<float>(), 1.0f / static_cast<float>(n));
      }
      if (need_dx) {
        auto dx_chunk = dx.narrow(0, begin, rows);
        torch::mm_out(dx_chunk, z, wc);
      }
      if (need_dw) {
        // The chunks' products summed in fp32: written by the matmul itself where LibTorch can
        // (bf16 x bf16 -> fp32 on a GPU), else each product widened and added.
        if (!dw.defined()) dw = torch::empty({padded_vocab, x.size(1)}, x.options().dtype(torch::kFloat));
        compat::MatmulIntoFloat(dw, z.t(), x_chunk, /*accumulate=*/begin > 0);
      }
    }
    ctx->saved_data["dx"] = dx;
    ctx->saved_data["dw"] = dw;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_type"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["sink_rows"] = sink_rows;
    return row_loss.sum() / static_cast<double>(n);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const torch::Tensor g = grad[0].to(torch::kFloat);
    torch::Tensor dx = ctx->saved_data["dx"].toTensor(), dw = ctx->saved_data["dw"].toTensor();
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    const auto w_type = static_cast<torch::ScalarType>(ctx->saved_data["w_type"].toInt());
    auto* sink = reinterpret_cast<GradientSink*>(ctx->saved_data["sink"].toInt());
    const int64_t sink_rows = ctx->saved_data["sink_rows"].toInt();
    ctx->saved_data.clear();  // a second backward would find nothing, as for any freed graph
    if (dx.defined()) dx = dx.to(torch::kFloat).mul_(g).to(x_type);
    if (sink != nullptr) {
      // (No rows, no dW: the counted use still gets its gradient, zero.)
      torch::Tensor rows = dw.defined() ? dw.narrow(0, 0, sink_rows) : torch::Tensor();
      sink->Write([&](torch::Tensor& buffer, bool first) {
        torch::NoGradGuard no_grad;
        if (!rows.defined()) {
          if (first) buffer.zero_();
        } else if (first) {
          torch::mul_out(buffer, rows, g);
        } else {
          buffer.add_(rows.mul_(g));
        }
      });
      dw = torch::Tensor();
    } else if (dw.defined()) {
      dw = dw.mul_(g).to(w_type);
    }
    return {dx,
            dw,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

int64_t LinearCrossEntropyChunkRows(int64_t rows, int64_t padded_vocab, int64_t element_bytes) {
  const int64_t fit = kChunkLogitBytes / (std::max<int64_t>(padded_vocab, 1) * std::max<int64_t>(element_bytes, 1));
  if (fit >= rows) return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(64, fit / 64 * 64);
}

torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& weight, int64_t vocab,
                                 const torch::Tensor& targets, torch::ScalarType compute_type, int64_t chunk_rows,
                                 const VocabSlice* slice, const HeadGradient* into) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && vocab <= weight.size(0),
              "LinearCrossEntropy: x [N, H], weight [V', H] with V' >= vocab");
  TORCH_CHECK(targets.numel() == x.size(0), "LinearCrossEntropy: one target per row");
  if (chunk_rows <= 0) {
    chunk_rows = LinearCrossEntropyChunkRows(x.size(0), weight.size(0), c10::elementSize(compute_type));
  }
  TORCH_CHECK(!slice || slice->gather, "LinearCrossEntropy: a vocabulary slice needs its gather");
  const bool sunk = into != nullptr && into->sink != nullptr && torch::GradMode::is_enabled();
  TORCH_CHECK(!sunk || (into->rows > 0 && into->rows <= weight.size(0)),
              "LinearCrossEntropy: the sink's rows are the weight's unpadded rows");
  // An undefined tensor is no autograd input: an empty one stands for "no parameter".
  const torch::Tensor param = sunk ? into->param : x.new_empty({0});
  return LinearCrossEntropyFunction::apply(x, sunk ? weight.detach() : weight, targets, vocab, chunk_rows,
                                           static_cast<int64_t>(compute_type), reinterpret_cast<int64_t>(slice), param,
                                           reinterpret_cast<int64_t>(sunk ? into->sink : nullptr),
                                           sunk ? into->rows : int64_t{0});
}

}  // namespace strata::worker
