// StageModel's gradients outside ZeRO-3 (stage_model.h): each parameter of a sink unit has a slot
// that its uses write or add into, and a unit whose every use has arrived is handed on
// (SetGradientReady) for its reduction beside the rest of the backward.
#include <stdexcept>

#include "worker/nn/torch_compat.h"
#include "worker/train/stage_model.h"

namespace strata::worker {

// ---------------------------------------------------------------- the gradient sink

namespace {

// One use of a parameter: forward hands on the parameter itself (GradSinkFunction) or its bf16
// working copy for a matmul (WorkingWeightFunction); backward writes the incoming gradient into
// the slot (the step's first) or adds it, widening bf16 to fp32 in the same kernel, and gives
// autograd nothing to accumulate. A matmul through ParamView::Linear skips both: its backward
// writes the slot itself (fused_linear.h).
void SinkGradient(int64_t handle, const torch::Tensor& grad) {
  if (!grad.defined()) return;
  reinterpret_cast<GradientSink*>(handle)->Write([&](torch::Tensor& buffer, bool first) {
    if (first) {
      buffer.copy_(grad);
    } else {
      buffer.add_(grad);
    }
  });
}

struct GradSinkFunction : torch::autograd::Function<GradSinkFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor param, int64_t slot) {
    ctx->saved_data["slot"] = slot;
    return param;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    SinkGradient(ctx->saved_data["slot"].toInt(), grad[0]);
    return {torch::Tensor(), torch::Tensor()};
  }
};

struct WorkingWeightFunction : torch::autograd::Function<WorkingWeightFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor /*param*/, torch::Tensor working,
                               int64_t slot) {
    ctx->saved_data["slot"] = slot;
    return working;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    SinkGradient(ctx->saved_data["slot"].toInt(), grad[0]);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor StageModel::GradSlot::Use(const torch::Tensor& param, const torch::Tensor& value) {
  CountUse();
  const auto handle = reinterpret_cast<int64_t>(static_cast<GradientSink*>(this));
  if (value.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return GradSinkFunction::apply(param, handle);
  return WorkingWeightFunction::apply(param, value, handle);
}

void StageModel::GradSlot::Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) {
  torch::NoGradGuard no_grad;
  write(grad_, (*received_)++ == 0);
  model_->MaybeGradientReady(unit_);
}

std::vector<torch::Tensor> StageModel::UnitValues(int u, bool matmul_weights) const {
  const ParamUnit& unit = units_[u];
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const bool matrix = matmul_weights && !unit.working_params.empty() && unit.shapes[i].size() >= 2;
    out.push_back(matrix ? unit.working_params[i] : unit.params[i]);
  }
  return out;
}

void StageModel::BeginGradients(int64_t forwards) {
  forwards_expected_ = forwards;
  forwards_done_ = 0;
  if (zero3_) zero3_->BeginGradients();
  tp_group_->DropUnfinished();
  for (ParamUnit& unit : units_) {
    std::fill(unit.received.begin(), unit.received.end(), 0);
    std::fill(unit.uses.begin(), unit.uses.end(), 0);
  }
}

void StageModel::MaybeGradientReady(int u) {
  if (!gradient_ready_ || forwards_done_ < forwards_expected_) return;
  const ParamUnit& unit = units_[static_cast<size_t>(u)];
  for (size_t i = 0; i < unit.received.size(); ++i) {
    if (unit.uses[i] == 0 || unit.received[i] != unit.uses[i]) return;  // an unused one is zeroed at the end
  }
  if (tp_group_->HoldAnnouncement(u)) return;  // announced once f's backward collective is joined
  gradient_ready_(static_cast<size_t>(u));
}

void StageModel::EndBackward() { tp_group_->RunLeftovers(); }

const TensorParallelOverlapCounts& StageModel::tp_overlap_counts() const { return tp_group_->overlap_counts(); }

void StageModel::FinishGradients() {
  torch::NoGradGuard no_grad;
  if (zero3_) zero3_->FinishGradients();
  for (ParamUnit& unit : units_) {
    if (!unit.sink) continue;
    for (size_t i = 0; i < unit.received.size(); ++i) {
      if (unit.received[i] == 0) unit.params[i].mutable_grad().zero_();
    }
  }
}

void StageModel::RefreshWorkingWeights(const std::vector<bool>& fresh) {
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].working.defined() && !(u < fresh.size() && fresh[u]))
      units_[u].working.copy_(units_[u].flat.detach());
  }
}

// ---------------------------------------------------------------- the stage

}  // namespace strata::worker
