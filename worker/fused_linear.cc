#include "worker/fused_linear.h"

#include "worker/torch_compat.h"

namespace strata::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearIntoGradientFunction : torch::autograd::Function<LinearIntoGradientFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor /*param*/, torch::Tensor working, torch::Tensor bias,
                               int64_t sink, int64_t defer) {
    // In W's dtype: under autocast x already is; outside it LibTorch's linear would refuse a mix.
    const torch::Tensor xc = x.to(working.scalar_type());
    const bool has_bias = bias.numel() > 0;  // no bias: an empty tensor (autograd takes no undefined input)
    const torch::Tensor bc = has_bias ? bias.to(working.scalar_type()) : torch::Tensor();
    ctx->save_for_backward({xc, working});
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["defer"] = defer;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias_type"] = has_bias ? static_cast<int64_t>(bias.scalar_type()) : int64_t{-1};
    return torch::linear(xc, working, bc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& working = saved[1];
    const int64_t out = working.size(0), in = working.size(1);
    const torch::Tensor dy = grad[0].to(working.scalar_type()).reshape({-1, out});
    const torch::Tensor x2d = x.reshape({-1, in});
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::mm(dy, working).view(x.sizes()).to(static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt()));
    }
    auto* sink = reinterpret_cast<GradientSink*>(ctx->saved_data["sink"].toInt());
    auto write = [sink, dy_t = dy.t(), x2d] {
      sink->Write([&](torch::Tensor& buffer, bool first) { compat::MatmulIntoFloat(buffer, dy_t, x2d, /*accumulate=*/!first); });
    };
    if (auto* defer = reinterpret_cast<DeferredWeightGradients*>(ctx->saved_data["defer"].toInt())) {
      defer->Defer(std::move(write));
    } else {
      write();
    }
    torch::Tensor db;
    if (const int64_t bias_type = ctx->saved_data["bias_type"].toInt(); bias_type >= 0 && ctx->needs_input_grad(3)) {
      db = dy.sum(0).to(static_cast<torch::ScalarType>(bias_type));  // in dy's dtype, then widened (as autocast's cast backward)
    }
    return {dx, torch::Tensor(), torch::Tensor(), db, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t DeferredWeightGradients::RunAll() {
  // A write may not defer another (it runs outside autograd), so the queue is taken whole.
  std::vector<std::function<void()>> writes;
  writes.swap(pending_);
  for (auto& write : writes) write();
  return static_cast<int64_t>(writes.size());
}

torch::Tensor LinearIntoGradient(const torch::Tensor& x, const torch::Tensor& param, const torch::Tensor& working,
                                 const torch::Tensor& bias, GradientSink* sink, DeferredWeightGradients* defer) {
  TORCH_CHECK(working.dim() == 2 && x.size(-1) == working.size(1), "LinearIntoGradient: x [..., in] for a weight [out, in]");
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == working.size(0)), "LinearIntoGradient: bias [out]");
  if (!torch::GradMode::is_enabled()) return torch::linear(x.to(working.scalar_type()), working, bias.defined() ? bias.to(working.scalar_type()) : bias);
  sink->CountUse();
  return LinearIntoGradientFunction::apply(x, param, working.detach(), bias.defined() ? bias : working.new_empty({0}),
                                           reinterpret_cast<int64_t>(sink), reinterpret_cast<int64_t>(defer));
}

}  // namespace strata::worker
