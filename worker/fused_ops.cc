#include "worker/fused_ops.h"

#include "worker/kernel_place.h"

namespace strata::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool Supported(torch::ScalarType t) { return t == torch::kFloat || t == torch::kBFloat16; }
torch::ScalarType Storage(torch::ScalarType t) { return Supported(t) ? t : torch::kFloat; }
// In a dtype the kernels take, contiguous (no copy when it already is).
torch::Tensor Ready(const torch::Tensor& t) { return t.to(Storage(t.scalar_type())).contiguous(); }

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x_in, torch::Tensor weight_in, double eps, int64_t out_type) {
    const torch::Tensor x = Ready(x_in), weight = weight_in.to(torch::kFloat).contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    auto y = torch::empty(x.sizes(), x.options().dtype(out));
    auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat));
    kernels::RmsNormForward(KernelPlace(x.device()), KernelType(x.scalar_type()), x.data_ptr(), weight.data_ptr<float>(),
                            KernelType(out), y.data_ptr(), rstd.data_ptr<float>(), rows, cols, static_cast<float>(eps));
    ctx->save_for_backward({x, weight, rstd});
    ctx->saved_data["x_type"] = static_cast<int64_t>(x_in.scalar_type());
    ctx->saved_data["w_type"] = static_cast<int64_t>(weight_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const torch::Tensor dy = Ready(grad[0]);
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const kernels::Place place = KernelPlace(x.device());
    auto dx = torch::empty_like(x);
    auto partials = torch::empty({kernels::NormWeightPartialRows(place, rows), cols}, x.options().dtype(torch::kFloat));
    kernels::RmsNormBackward(place, KernelType(x.scalar_type()), x.data_ptr(), weight.data_ptr<float>(), rstd.data_ptr<float>(),
                             KernelType(dy.scalar_type()), dy.data_ptr(), dx.data_ptr(), partials.data_ptr<float>(), rows, cols);
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    const auto w_type = static_cast<torch::ScalarType>(ctx->saved_data["w_type"].toInt());
    return {dx.to(x_type), partials.sum(0).to(w_type), torch::Tensor(), torch::Tensor()};
  }
};

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x_in, torch::Tensor weight_in, torch::Tensor bias_in, double eps,
                               int64_t out_type) {
    const torch::Tensor x = Ready(x_in), weight = weight_in.to(torch::kFloat).contiguous(), bias = bias_in.to(torch::kFloat).contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    auto y = torch::empty(x.sizes(), x.options().dtype(out));
    auto mean = torch::empty({rows}, x.options().dtype(torch::kFloat)), rstd = torch::empty_like(mean);
    kernels::LayerNormForward(KernelPlace(x.device()), KernelType(x.scalar_type()), x.data_ptr(), weight.data_ptr<float>(),
                              bias.data_ptr<float>(), KernelType(out), y.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows,
                              cols, static_cast<float>(eps));
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->saved_data["x_type"] = static_cast<int64_t>(x_in.scalar_type());
    ctx->saved_data["w_type"] = static_cast<int64_t>(weight_in.scalar_type());
    ctx->saved_data["b_type"] = static_cast<int64_t>(bias_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const torch::Tensor dy = Ready(grad[0]);
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const kernels::Place place = KernelPlace(x.device());
    auto dx = torch::empty_like(x);
    auto dw = torch::empty({kernels::NormWeightPartialRows(place, rows), cols}, x.options().dtype(torch::kFloat)), db = torch::empty_like(dw);
    kernels::LayerNormBackward(place, KernelType(x.scalar_type()), x.data_ptr(), weight.data_ptr<float>(), mean.data_ptr<float>(),
                               rstd.data_ptr<float>(), KernelType(dy.scalar_type()), dy.data_ptr(), dx.data_ptr(), dw.data_ptr<float>(),
                               db.data_ptr<float>(), rows, cols);
    auto type = [&](const char* key) { return static_cast<torch::ScalarType>(ctx->saved_data[key].toInt()); };
    return {dx.to(type("x_type")), dw.sum(0).to(type("w_type")), db.sum(0).to(type("b_type")), torch::Tensor(), torch::Tensor()};
  }
};

struct SwiGluFunction : torch::autograd::Function<SwiGluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor gate_in, torch::Tensor up_in) {
    const torch::Tensor gate = Ready(gate_in), up = up_in.to(gate.scalar_type()).contiguous();
    auto y = torch::empty_like(gate);
    kernels::SwiGluForward(KernelPlace(gate.device()), KernelType(gate.scalar_type()), gate.data_ptr(), up.data_ptr(), y.data_ptr(),
                           gate.numel());
    ctx->save_for_backward({gate, up});
    ctx->saved_data["gate_type"] = static_cast<int64_t>(gate_in.scalar_type());
    ctx->saved_data["up_type"] = static_cast<int64_t>(up_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &gate = saved[0], &up = saved[1];
    const torch::Tensor dy = grad[0].to(gate.scalar_type()).contiguous();
    auto dgate = torch::empty_like(gate), dup = torch::empty_like(up);
    kernels::SwiGluBackward(KernelPlace(gate.device()), KernelType(gate.scalar_type()), gate.data_ptr(), up.data_ptr(), dy.data_ptr(),
                            dgate.data_ptr(), dup.data_ptr(), gate.numel());
    return {dgate.to(static_cast<torch::ScalarType>(ctx->saved_data["gate_type"].toInt())),
            dup.to(static_cast<torch::ScalarType>(ctx->saved_data["up_type"].toInt()))};
  }
};

kernels::RotaryShape ShapeOf(const torch::Tensor& x, int64_t rotary_dims) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), rotary_dims};
}

struct RotaryFunction : torch::autograd::Function<RotaryFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x_in, torch::Tensor cos, torch::Tensor sin, int64_t rotary_dims,
                               int64_t out_type) {
    const torch::Tensor x = Ready(x_in);
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    auto y = torch::empty(x.sizes(), x.options().dtype(out));
    kernels::Rotary(KernelPlace(x.device()), ShapeOf(x, rotary_dims), KernelType(x.scalar_type()), x.data_ptr(), KernelType(out),
                    y.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), /*inverse=*/false);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["rotary_dims"] = rotary_dims;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor dy = Ready(grad[0]);
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    auto dx = torch::empty(dy.sizes(), dy.options().dtype(Storage(x_type)));
    kernels::Rotary(KernelPlace(dy.device()), ShapeOf(dy, ctx->saved_data["rotary_dims"].toInt()), KernelType(dy.scalar_type()),
                    dy.data_ptr(), KernelType(dx.scalar_type()), dx.data_ptr(), saved[0].data_ptr<float>(), saved[1].data_ptr<float>(),
                    /*inverse=*/true);
    return {dx.to(x_type), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
// The bias of an up projection and its GELU (kernels.h): h is the matmul's output without the
// bias; z = h + b is recomputed in the backward from the saved h instead of being kept.
struct BiasGeluFunction : torch::autograd::Function<BiasGeluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor h_in, torch::Tensor bias_in, int64_t kind) {
    const torch::Tensor h = Ready(h_in), bias = bias_in.to(torch::kFloat).contiguous();
    const int64_t cols = h.size(-1), rows = h.numel() / cols;
    auto y = torch::empty_like(h);
    kernels::BiasGeluForward(KernelPlace(h.device()), static_cast<kernels::Gelu>(kind), KernelType(h.scalar_type()), h.data_ptr(),
                             bias.data_ptr<float>(), y.data_ptr(), rows, cols);
    ctx->save_for_backward({h, bias});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["h_type"] = static_cast<int64_t>(h_in.scalar_type());
    ctx->saved_data["b_type"] = static_cast<int64_t>(bias_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &h = saved[0], &bias = saved[1];
    const torch::Tensor dy = grad[0].to(h.scalar_type()).contiguous();
    const int64_t cols = h.size(-1), rows = h.numel() / cols;
    const kernels::Place place = KernelPlace(h.device());
    auto dh = torch::empty_like(h);
    auto partials = torch::empty({kernels::BiasPartialRows(place, rows), cols}, h.options().dtype(torch::kFloat));
    kernels::BiasGeluBackward(place, static_cast<kernels::Gelu>(ctx->saved_data["kind"].toInt()), KernelType(h.scalar_type()), h.data_ptr(),
                              bias.data_ptr<float>(), dy.data_ptr(), dh.data_ptr(), partials.data_ptr<float>(), rows, cols);
    return {dh.to(static_cast<torch::ScalarType>(ctx->saved_data["h_type"].toInt())),
            partials.sum(0).to(static_cast<torch::ScalarType>(ctx->saved_data["b_type"].toInt())), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor FusedBiasGelu(const torch::Tensor& h, const torch::Tensor& bias, bool tanh_approximation) {
  TORCH_CHECK(bias.dim() == 1 && h.size(-1) == bias.size(0), "FusedBiasGelu: bias [cols] for h [..., cols]");
  return BiasGeluFunction::apply(h, bias, static_cast<int64_t>(tanh_approximation ? kernels::Gelu::kTanh : kernels::Gelu::kErf));
}

torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps, torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "FusedRmsNorm: weight [cols] for x [..., cols]");
  return RmsNormFunction::apply(x, weight, eps, static_cast<int64_t>(out_type));
}

torch::Tensor FusedLayerNorm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                             torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && bias.dim() == 1 && x.size(-1) == weight.size(0) && x.size(-1) == bias.size(0),
              "FusedLayerNorm: weight and bias [cols] for x [..., cols]");
  return LayerNormFunction::apply(x, weight, bias, eps, static_cast<int64_t>(out_type));
}

torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "FusedSwiGlu: gate and up of one shape");
  return SwiGluFunction::apply(gate, up);
}

torch::Tensor FusedRotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, int64_t rotary_dims,
                          torch::ScalarType out_type) {
  TORCH_CHECK(x.dim() == 4 && rotary_dims % 2 == 0 && rotary_dims <= x.size(3), "FusedRotary: x [batch, seq, heads, head_dim]");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat && cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == x.size(1) &&
                  cos.size(1) == rotary_dims / 2 && cos.device() == x.device(),
              "FusedRotary: cos and sin [seq, rotary_dims / 2] fp32 on x's device");
  return RotaryFunction::apply(x, cos, sin, rotary_dims, static_cast<int64_t>(out_type));
}

}  // namespace strata::worker
