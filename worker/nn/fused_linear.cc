#include "worker/nn/fused_linear.h"

#include "worker/nn/torch_compat.h"

namespace strata::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearIntoGradientFunction : torch::autograd::Function<LinearIntoGradientFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor /*param*/, torch::Tensor working,
                               torch::Tensor bias, int64_t sink, int64_t defer, int64_t ahead) {
    // In W's dtype: under autocast x already is; outside it LibTorch's linear would refuse a mix.
    const torch::Tensor xc = x.to(working.scalar_type());
    const bool has_bias = bias.numel() > 0;  // no bias: an empty tensor (autograd takes no undefined input)
    const torch::Tensor bc = has_bias ? bias.to(working.scalar_type()) : torch::Tensor();
    ctx->save_for_backward({xc, working});
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["defer"] = defer;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias_type"] = has_bias ? static_cast<int64_t>(bias.scalar_type()) : int64_t{-1};
    return LinearRows(xc, working, bc, reinterpret_cast<const RowsAhead*>(ahead));  // forward only
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& working = saved[1];
    const torch::Tensor dy = grad[0].to(working.scalar_type());
    const torch::Tensor dx = LinearIntoGradientBackward(
        dy, x, working, reinterpret_cast<GradientSink*>(ctx->saved_data["sink"].toInt()),
        reinterpret_cast<DeferredWeightGradients*>(ctx->saved_data["defer"].toInt()), ctx->needs_input_grad(0),
        static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt()));
    torch::Tensor db;
    if (const int64_t bias_type = ctx->saved_data["bias_type"].toInt(); bias_type >= 0 && ctx->needs_input_grad(3)) {
      db = dy.reshape({-1, working.size(0)})
               .sum(0)
               .to(static_cast<torch::ScalarType>(
                   bias_type));  // in dy's dtype, then widened (as autocast's cast backward)
    }
    return {dx, torch::Tensor(), torch::Tensor(), db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LinearRows(const torch::Tensor& x, const torch::Tensor& working, const torch::Tensor& bias,
                         const RowsAhead* ahead) {
  if (ahead == nullptr) return torch::linear(x, working, bias);
  // The ops torch::linear folds a contiguous input to (addmm with a bias, mm without), on row
  // blocks of one output: a row block of a row-major matrix is itself contiguous.
  const int64_t in = working.size(1), out = working.size(0);
  const torch::Tensor x2d = x.reshape({-1, in});
  torch::Tensor y = torch::empty({x2d.size(0), out}, x2d.options());
  auto rows = [&](int64_t begin, int64_t end) {
    if (end <= begin) return;
    torch::Tensor y_rows = y.narrow(0, begin, end - begin);
    const torch::Tensor x_rows = x2d.narrow(0, begin, end - begin);
    if (bias.defined()) {
      at::addmm_out(y_rows, bias, x_rows, working.t());
    } else {
      at::mm_out(y_rows, x_rows, working.t());
    }
  };
  rows(ahead->begin, ahead->end);
  ahead->wait_rest();
  rows(0, ahead->begin);
  rows(ahead->end, x2d.size(0));
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out;
  return y.view(sizes);
}

torch::Tensor LinearIntoGradientBackward(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& working,
                                         GradientSink* sink, DeferredWeightGradients* defer, bool want_dx,
                                         torch::ScalarType x_type) {
  const int64_t out = working.size(0), in = working.size(1);
  const torch::Tensor dy2d = dy.to(working.scalar_type()).reshape({-1, out});
  const torch::Tensor x2d = x.reshape({-1, in});
  torch::Tensor dx;
  if (want_dx) dx = torch::mm(dy2d, working).view(x.sizes()).to(x_type);
  auto write = [sink, dy_t = dy2d.t(), x2d] {
    sink->Write(
        [&](torch::Tensor& buffer, bool first) { compat::MatmulIntoFloat(buffer, dy_t, x2d, /*accumulate=*/!first); });
  };
  if (defer != nullptr) {
    defer->Defer(std::move(write));
  } else {
    write();
  }
  return dx;
}

int64_t DeferredWeightGradients::RunAll() {
  // A write may not defer another (it runs outside autograd), so the queue is taken whole.
  std::vector<std::function<void()>> writes;
  writes.swap(pending_);
  for (auto& write : writes) write();
  return static_cast<int64_t>(writes.size());
}

torch::Tensor LinearIntoGradient(const torch::Tensor& x, const torch::Tensor& param, const torch::Tensor& working,
                                 const torch::Tensor& bias, GradientSink* sink, DeferredWeightGradients* defer,
                                 const RowsAhead* ahead) {
  TORCH_CHECK(working.dim() == 2 && x.size(-1) == working.size(1),
              "LinearIntoGradient: x [..., in] for a weight [out, in]");
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == working.size(0)),
              "LinearIntoGradient: bias [out]");
  if (ahead != nullptr && x.scalar_type() != working.scalar_type()) {
    ahead->wait_rest();  // the cast to W's dtype reads every row
    ahead = nullptr;
  }
  if (!torch::GradMode::is_enabled()) {
    return LinearRows(x.to(working.scalar_type()), working, bias.defined() ? bias.to(working.scalar_type()) : bias,
                      ahead);
  }
  sink->CountUse();
  return LinearIntoGradientFunction::apply(x, param, working.detach(), bias.defined() ? bias : working.new_empty({0}),
                                           reinterpret_cast<int64_t>(sink), reinterpret_cast<int64_t>(defer),
                                           reinterpret_cast<int64_t>(ahead));
}

}  // namespace strata::worker
