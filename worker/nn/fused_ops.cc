#include "worker/nn/fused_ops.h"

#include "worker/nn/kernel_place.h"

namespace strata::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool Supported(torch::ScalarType t) { return t == torch::kFloat || t == torch::kBFloat16; }
torch::ScalarType Storage(torch::ScalarType t) { return Supported(t) ? t : torch::kFloat; }
// In a dtype the kernels take, contiguous (no copy when it already is).
torch::Tensor Ready(const torch::Tensor& t) { return t.to(Storage(t.scalar_type())).contiguous(); }

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x_in, torch::Tensor weight_in, double eps,
                               int64_t out_type) {
    const torch::Tensor x = Ready(x_in), weight = weight_in.to(torch::kFloat).contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    auto y = torch::empty(x.sizes(), x.options().dtype(out));
    auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat));
    kernels::RmsNormForward(KernelPlace(x.device()), KernelType(x.scalar_type()), x.data_ptr(),
                            weight.data_ptr<float>(), KernelType(out), y.data_ptr(), rstd.data_ptr<float>(), rows, cols,
                            static_cast<float>(eps));
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
    kernels::RmsNormBackward(place, KernelType(x.scalar_type()), x.data_ptr(), weight.data_ptr<float>(),
                             rstd.data_ptr<float>(), KernelType(dy.scalar_type()), dy.data_ptr(), dx.data_ptr(),
                             partials.data_ptr<float>(), rows, cols);
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    const auto w_type = static_cast<torch::ScalarType>(ctx->saved_data["w_type"].toInt());
    return {dx.to(x_type), partials.sum(0).to(w_type), torch::Tensor(), torch::Tensor()};
  }
};

struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x_in, torch::Tensor weight_in, torch::Tensor bias_in,
                               double eps, int64_t out_type) {
    const torch::Tensor x = Ready(x_in), weight = weight_in.to(torch::kFloat).contiguous(),
                        bias = bias_in.to(torch::kFloat).contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    auto y = torch::empty(x.sizes(), x.options().dtype(out));
    auto mean = torch::empty({rows}, x.options().dtype(torch::kFloat)), rstd = torch::empty_like(mean);
    kernels::LayerNormForward(KernelPlace(x.device()), KernelType(x.scalar_type()), x.data_ptr(),
                              weight.data_ptr<float>(), bias.data_ptr<float>(), KernelType(out), y.data_ptr(),
                              mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols, static_cast<float>(eps));
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
    auto dw = torch::empty({kernels::NormWeightPartialRows(place, rows), cols}, x.options().dtype(torch::kFloat)),
         db = torch::empty_like(dw);
    kernels::LayerNormBackward(place, KernelType(x.scalar_type()), x.data_ptr(), weight.data_ptr<float>(),
                               mean.data_ptr<float>(), rstd.data_ptr<float>(), KernelType(dy.scalar_type()),
                               dy.data_ptr(), dx.data_ptr(), dw.data_ptr<float>(), db.data_ptr<float>(), rows, cols);
    auto type = [&](const char* key) { return static_cast<torch::ScalarType>(ctx->saved_data[key].toInt()); };
    return {dx.to(type("x_type")), dw.sum(0).to(type("w_type")), db.sum(0).to(type("b_type")), torch::Tensor(),
            torch::Tensor()};
  }
};

// A norm of s that also goes on as the residual stream (fused_ops.h): s = x (no y; the block's
// input) or s = x + y (added by the forward kernel); RMSNorm, or LayerNorm when given a bias.
// Outputs {s, norm(s)}. Backward: ds = d_s + dnorm(d_normed) by the norm's backward kernel, which
// also writes ds in y's dtype when that differs (dy); either gradient may be undefined (its
// output unused), so none is materialised as zeros.
struct ResidualNormFunction : torch::autograd::Function<ResidualNormFunction> {
  static variable_list forward(AutogradContext* ctx, torch::Tensor x_in, c10::optional<torch::Tensor> y_in,
                               torch::Tensor weight_in, c10::optional<torch::Tensor> bias_in, double eps,
                               int64_t out_type) {
    const bool add = y_in.has_value(), centered = bias_in.has_value();
    // s in the dtype of LibTorch's x + y (the callers keep that to fp32 or bf16).
    const auto s_type = add ? c10::promoteTypes(x_in.scalar_type(), y_in->scalar_type()) : Storage(x_in.scalar_type());
    const torch::Tensor x = x_in.to(s_type).contiguous(), y = add ? Ready(*y_in) : torch::Tensor();
    const torch::Tensor weight = weight_in.to(torch::kFloat).contiguous();
    const torch::Tensor bias = centered ? bias_in->to(torch::kFloat).contiguous() : torch::Tensor();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    const kernels::Place place = KernelPlace(x.device());
    const torch::Tensor s = add ? torch::empty(x.sizes(), x.options()) : x;
    auto normed = torch::empty(x.sizes(), x.options().dtype(out));
    auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat));
    auto mean = centered ? torch::empty_like(rstd) : torch::Tensor();
    const kernels::DType st = KernelType(s_type), ot = KernelType(out);
    const auto fe = static_cast<float>(eps);
    if (add && centered) {
      kernels::AddLayerNormForward(place, st, x.data_ptr(), KernelType(y.scalar_type()), y.data_ptr(), s.data_ptr(),
                                   weight.data_ptr<float>(), bias.data_ptr<float>(), ot, normed.data_ptr(),
                                   mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols, fe);
    } else if (add) {
      kernels::AddRmsNormForward(place, st, x.data_ptr(), KernelType(y.scalar_type()), y.data_ptr(), s.data_ptr(),
                                 weight.data_ptr<float>(), ot, normed.data_ptr(), rstd.data_ptr<float>(), rows, cols,
                                 fe);
    } else if (centered) {
      kernels::LayerNormForward(place, st, x.data_ptr(), weight.data_ptr<float>(), bias.data_ptr<float>(), ot,
                                normed.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols, fe);
    } else {
      kernels::RmsNormForward(place, st, x.data_ptr(), weight.data_ptr<float>(), ot, normed.data_ptr(),
                              rstd.data_ptr<float>(), rows, cols, fe);
    }
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(centered ? variable_list{s, weight, rstd, mean} : variable_list{s, weight, rstd});
    ctx->saved_data["x_type"] = static_cast<int64_t>(x_in.scalar_type());
    ctx->saved_data["y_type"] = static_cast<int64_t>(add ? y_in->scalar_type() : s_type);
    ctx->saved_data["add"] = add;
    ctx->saved_data["w_type"] = static_cast<int64_t>(weight_in.scalar_type());
    if (centered) ctx->saved_data["b_type"] = static_cast<int64_t>(bias_in->scalar_type());
    // Without an add, s is x: given back as the input itself, which LibTorch turns into a view of
    // x whose gradient edge is this node's first output (custom functions' rule for inputs
    // returned unmodified), so x's two gradients meet here rather than in autograd's add.
    return {add ? s : x_in, normed};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &s = saved[0], &weight = saved[1], &rstd = saved[2];
    const bool centered = saved.size() == 4, add = ctx->saved_data["add"].toBool();
    auto type = [&](const char* key) { return static_cast<torch::ScalarType>(ctx->saved_data[key].toInt()); };
    const torch::ScalarType y_storage = Storage(type("y_type"));
    torch::Tensor ds = grad[0], ds_copy, dw, db;  // the norm's output unused: ds is the residual's gradient alone
    if (grad[1].defined()) {
      const torch::Tensor dn = Ready(grad[1]);
      const torch::Tensor dr = grad[0].defined() ? grad[0].to(s.scalar_type()).contiguous() : torch::Tensor();
      const int64_t cols = s.size(-1), rows = s.numel() / cols;
      const kernels::Place place = KernelPlace(s.device());
      ds = torch::empty(s.sizes(), s.options());
      // dy in y's dtype by the same kernel, when it is not s's (a bf16 sublayer output).
      if (add && y_storage != s.scalar_type()) ds_copy = torch::empty(s.sizes(), s.options().dtype(y_storage));
      const kernels::NormResidualGrad residual{dr.defined() ? dr.data_ptr() : nullptr,
                                               ds_copy.defined() ? ds_copy.data_ptr() : nullptr, KernelType(y_storage)};
      dw = torch::empty({kernels::NormWeightPartialRows(place, rows), cols}, s.options().dtype(torch::kFloat));
      if (centered) {
        db = torch::empty_like(dw);
        kernels::LayerNormBackward(place, KernelType(s.scalar_type()), s.data_ptr(), weight.data_ptr<float>(),
                                   saved[3].data_ptr<float>(), rstd.data_ptr<float>(), KernelType(dn.scalar_type()),
                                   dn.data_ptr(), ds.data_ptr(), dw.data_ptr<float>(), db.data_ptr<float>(), rows, cols,
                                   residual);
        db = db.sum(0).to(type("b_type"));
      } else {
        kernels::RmsNormBackward(place, KernelType(s.scalar_type()), s.data_ptr(), weight.data_ptr<float>(),
                                 rstd.data_ptr<float>(), KernelType(dn.scalar_type()), dn.data_ptr(), ds.data_ptr(),
                                 dw.data_ptr<float>(), rows, cols, residual);
      }
      dw = dw.sum(0).to(type("w_type"));
    }
    torch::Tensor dx, dy;
    if (ds.defined()) {
      dx = ds.to(type("x_type"));
      if (add) dy = (ds_copy.defined() ? ds_copy : ds).to(type("y_type"));
    }
    return {dx, dy, dw, db, torch::Tensor(), torch::Tensor()};
  }
};

NormedResidual ApplyResidualNorm(const torch::Tensor& x, c10::optional<torch::Tensor> y, const torch::Tensor& weight,
                                 c10::optional<torch::Tensor> bias, double eps, torch::ScalarType out_type) {
  auto out = ResidualNormFunction::apply(x, std::move(y), weight, std::move(bias), eps, static_cast<int64_t>(out_type));
  return {out[0], out[1]};
}

// Whether s = x + y takes a dtype the kernels store (fp32 or bf16); else (fp16, fp64) the
// callers add with LibTorch and norm after.
bool AddFuses(const torch::Tensor& x, const torch::Tensor& y) {
  TORCH_CHECK(x.sizes() == y.sizes() && x.device() == y.device(), "FusedAdd*Norm: x and y of one shape on one device");
  return Supported(c10::promoteTypes(x.scalar_type(), y.scalar_type()));
}

struct SwiGluFunction : torch::autograd::Function<SwiGluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor gate_in, torch::Tensor up_in) {
    const torch::Tensor gate = Ready(gate_in), up = up_in.to(gate.scalar_type()).contiguous();
    auto y = torch::empty_like(gate);
    kernels::SwiGluForward(KernelPlace(gate.device()), KernelType(gate.scalar_type()), gate.data_ptr(), up.data_ptr(),
                           y.data_ptr(), gate.numel());
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
    kernels::SwiGluBackward(KernelPlace(gate.device()), KernelType(gate.scalar_type()), gate.data_ptr(), up.data_ptr(),
                            dy.data_ptr(), dgate.data_ptr(), dup.data_ptr(), gate.numel());
    return {dgate.to(static_cast<torch::ScalarType>(ctx->saved_data["gate_type"].toInt())),
            dup.to(static_cast<torch::ScalarType>(ctx->saved_data["up_type"].toInt()))};
  }
};

kernels::RotaryShape ShapeOf(const torch::Tensor& x, int64_t rotary_dims) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), rotary_dims};
}

struct RotaryFunction : torch::autograd::Function<RotaryFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x_in, torch::Tensor cos, torch::Tensor sin,
                               int64_t rotary_dims, int64_t out_type) {
    const torch::Tensor x = Ready(x_in);
    const auto out = Storage(static_cast<torch::ScalarType>(out_type));
    auto y = torch::empty(x.sizes(), x.options().dtype(out));
    kernels::Rotary(KernelPlace(x.device()), ShapeOf(x, rotary_dims), KernelType(x.scalar_type()), x.data_ptr(),
                    KernelType(out), y.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), /*inverse=*/false);
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
    kernels::Rotary(KernelPlace(dy.device()), ShapeOf(dy, ctx->saved_data["rotary_dims"].toInt()),
                    KernelType(dy.scalar_type()), dy.data_ptr(), KernelType(dx.scalar_type()), dx.data_ptr(),
                    saved[0].data_ptr<float>(), saved[1].data_ptr<float>(),
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
    kernels::BiasGeluForward(KernelPlace(h.device()), static_cast<kernels::Gelu>(kind), KernelType(h.scalar_type()),
                             h.data_ptr(), bias.data_ptr<float>(), y.data_ptr(), rows, cols);
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
    kernels::BiasGeluBackward(place, static_cast<kernels::Gelu>(ctx->saved_data["kind"].toInt()),
                              KernelType(h.scalar_type()), h.data_ptr(), bias.data_ptr<float>(), dy.data_ptr(),
                              dh.data_ptr(), partials.data_ptr<float>(), rows, cols);
    return {dh.to(static_cast<torch::ScalarType>(ctx->saved_data["h_type"].toInt())),
            partials.sum(0).to(static_cast<torch::ScalarType>(ctx->saved_data["b_type"].toInt())), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor FusedBiasGelu(const torch::Tensor& h, const torch::Tensor& bias, bool tanh_approximation) {
  TORCH_CHECK(bias.dim() == 1 && h.size(-1) == bias.size(0), "FusedBiasGelu: bias [cols] for h [..., cols]");
  return BiasGeluFunction::apply(h, bias,
                                 static_cast<int64_t>(tanh_approximation ? kernels::Gelu::kTanh : kernels::Gelu::kErf));
}

torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                           torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "FusedRmsNorm: weight [cols] for x [..., cols]");
  return RmsNormFunction::apply(x, weight, eps, static_cast<int64_t>(out_type));
}

torch::Tensor FusedLayerNorm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                             torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && bias.dim() == 1 && x.size(-1) == weight.size(0) && x.size(-1) == bias.size(0),
              "FusedLayerNorm: weight and bias [cols] for x [..., cols]");
  return LayerNormFunction::apply(x, weight, bias, eps, static_cast<int64_t>(out_type));
}

NormedResidual FusedResidualRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                    torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0),
              "FusedResidualRmsNorm: weight [cols] for x [..., cols]");
  return ApplyResidualNorm(x, c10::nullopt, weight, c10::nullopt, eps, out_type);
}

NormedResidual FusedResidualLayerNorm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                      double eps, torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && bias.dim() == 1 && x.size(-1) == weight.size(0) && x.size(-1) == bias.size(0),
              "FusedResidualLayerNorm: weight and bias [cols] for x [..., cols]");
  return ApplyResidualNorm(x, c10::nullopt, weight, bias, eps, out_type);
}

NormedResidual FusedAddRmsNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight, double eps,
                               torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "FusedAddRmsNorm: weight [cols] for x [..., cols]");
  if (!AddFuses(x, y)) {
    auto s = x + y;
    return {s, FusedRmsNorm(s, weight, eps, out_type)};
  }
  return ApplyResidualNorm(x, y, weight, c10::nullopt, eps, out_type);
}

NormedResidual FusedAddLayerNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight,
                                 const torch::Tensor& bias, double eps, torch::ScalarType out_type) {
  TORCH_CHECK(weight.dim() == 1 && bias.dim() == 1 && x.size(-1) == weight.size(0) && x.size(-1) == bias.size(0),
              "FusedAddLayerNorm: weight and bias [cols] for x [..., cols]");
  if (!AddFuses(x, y)) {
    auto s = x + y;
    return {s, FusedLayerNorm(s, weight, bias, eps, out_type)};
  }
  return ApplyResidualNorm(x, y, weight, bias, eps, out_type);
}

torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "FusedSwiGlu: gate and up of one shape");
  return SwiGluFunction::apply(gate, up);
}

torch::Tensor FusedRotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotary_dims, torch::ScalarType out_type) {
  TORCH_CHECK(x.dim() == 4 && rotary_dims % 2 == 0 && rotary_dims <= x.size(3),
              "FusedRotary: x [batch, seq, heads, head_dim]");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.size(0) == x.size(1) && cos.size(1) == rotary_dims / 2 && cos.device() == x.device(),
              "FusedRotary: cos and sin [seq, rotary_dims / 2] fp32 on x's device");
  return RotaryFunction::apply(x, cos, sin, rotary_dims, static_cast<int64_t>(out_type));
}

}  // namespace strata::worker
