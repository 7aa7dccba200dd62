#include "worker/optimizer.h"

#include "worker/kernel_place.h"

namespace strata::worker {

UnitOptimizer::UnitOptimizer(StageModel& model, int64_t zero, int64_t dp, int64_t tp_rank, torch::Device device, bool eight_bit)
    : model_(model), zero_(zero), dp_(dp), eight_bit_(eight_bit), device_(device) {
  const bool sharded_moments = zero >= 1;
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device_);
  for (auto& unit : model_.units()) {
    Moments m;
    m.begin = sharded_moments ? unit.shard_begin : 0;
    m.end = sharded_moments ? unit.shard_end : unit.numel;
    const int64_t n = m.end - m.begin;
    if (eight_bit_) {
      const auto codes = options.dtype(torch::kByte);
      const int64_t blocks = kernels::AdamW8bitBlocks(n);
      m.exp_avg_codes = torch::empty({n}, codes);
      m.exp_avg_sq_codes = torch::empty({n}, codes);
      m.exp_avg_scales = torch::empty({blocks}, options);
      m.exp_avg_sq_scales = torch::empty({blocks}, options);
      kernels::AdamW8bitInit(KernelPlace(device_), m.exp_avg_codes.data_ptr<uint8_t>(), m.exp_avg_scales.data_ptr<float>(),
                             m.exp_avg_sq_codes.data_ptr<uint8_t>(), m.exp_avg_sq_scales.data_ptr<float>(), n);
    } else {
      m.exp_avg = torch::zeros({n}, options);
      m.exp_avg_sq = torch::zeros({n}, options);
    }
    // Masks over the whole unit, then cut: decay on matrices; the norm counts each element once.
    // Made where they are used: on a GPU, host masks would be gigabytes filled and copied.
    auto decay = torch::zeros({unit.numel}, options), norm = torch::zeros({unit.numel}, options);
    for (size_t i = 0; i < unit.names.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : unit.shapes[i]) n *= d;
      if (unit.full_shapes[i].size() >= 2) decay.narrow(0, unit.offsets[i], n).fill_(1.0);
      const bool counted = !unit.tied_copy && (!unit.replicated[i] || tp_rank == 0);
      if (counted) norm.narrow(0, unit.offsets[i], n).fill_(1.0);
    }
    m.decay_mask = decay.narrow(0, m.begin, m.end - m.begin).clone();
    m.norm_mask = norm.narrow(0, unit.shard_begin, unit.shard_end - unit.shard_begin).clone();
    moments_.push_back(std::move(m));
  }
  norm_scratch_ = torch::empty({kernels::MaskedSquareSumScratch()}, options);
}

int64_t UnitOptimizer::state_elements() const {
  int64_t n = 0;
  for (const auto& m : moments_) n += m.end - m.begin;
  return n;
}

torch::Tensor UnitOptimizer::ReduceGradients(const Groups& groups) {
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  const kernels::Place place = KernelPlace(device_);
  torch::Tensor square_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  reduced_.clear();
  for (size_t u = 0; u < units.size(); ++u) {
    ParamUnit& unit = units[u];
    torch::Tensor g = unit.sharded ? (unit.flat.grad().defined() ? unit.flat.grad().contiguous() : torch::zeros_like(unit.flat)) : unit.grad;
    if (static_cast<int>(u) == model_.first_wte_unit() || static_cast<int>(u) == model_.tied_copy_unit()) {
      AllReduceTensor(*groups.tie, g);
    }
    if (zero_ <= 1) AllReduceTensor(*groups.dp, g);
    if (zero_ == 2) ReduceScatterTensor(*groups.dp, g);  // zero 3 reduce-scattered in backward
    if (dp_ > 1) g.div_(static_cast<double>(dp_));  // one pass over every gradient: skipped where it changes nothing
    auto shard = unit.sharded ? g : g.narrow(0, unit.shard_begin, unit.shard_end - unit.shard_begin);
    kernels::MaskedSquareSum(place, shard.data_ptr<float>(), moments_[u].norm_mask.data_ptr<float>(), shard.numel(),
                             square_sum.data_ptr<float>(), norm_scratch_.data_ptr<float>());
    reduced_.push_back(g);
  }
  return square_sum;
}

void UnitOptimizer::Apply(const TrainSpec& tr, int64_t step, double lr, double clip, const Groups& groups) {
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  const kernels::Place place = KernelPlace(device_);
  for (size_t u = 0; u < units.size(); ++u) {
    ParamUnit& unit = units[u];
    Moments& m = moments_[u];
    torch::Tensor flat = unit.flat.detach();
    auto p = unit.sharded ? flat : flat.narrow(0, m.begin, m.end - m.begin);
    auto g = reduced_[u];
    if (!unit.sharded && zero_ >= 1) g = g.narrow(0, m.begin, m.end - m.begin);
    // One fused pass (kernels/kernels.h has the maths): clipping, decay, moments, update.
    const kernels::AdamWArgs args{lr, tr.beta1, tr.beta2, tr.eps, tr.weight_decay, step, clip};
    if (eight_bit_) {
      kernels::AdamW8bit(place, args, p.data_ptr<float>(), g.data_ptr<float>(), m.exp_avg_codes.data_ptr<uint8_t>(),
                         m.exp_avg_scales.data_ptr<float>(), m.exp_avg_sq_codes.data_ptr<uint8_t>(), m.exp_avg_sq_scales.data_ptr<float>(),
                         m.decay_mask.data_ptr<float>(), p.numel());
    } else {
      kernels::AdamW(place, args, p.data_ptr<float>(), g.data_ptr<float>(), m.exp_avg.data_ptr<float>(), m.exp_avg_sq.data_ptr<float>(),
                     m.decay_mask.data_ptr<float>(), p.numel());
    }
    if (zero_ == 1 || zero_ == 2) AllGatherTensor(*groups.dp, flat);
    if (unit.sharded) {
      unit.flat.mutable_grad() = torch::Tensor();
    } else if (!unit.sink) {  // a sink unit's next step writes its gradients afresh (stage_model.h)
      unit.grad.zero_();  // the parameters' .grad views stay pointed at it
    }
  }
  reduced_.clear();
  model_.RefreshWorkingWeights();
}

torch::Tensor UnitOptimizer::MomentValues(size_t unit, bool second) const {
  const Moments& m = moments_[unit];
  if (!eight_bit_) return second ? m.exp_avg_sq : m.exp_avg;
  auto values = torch::empty({m.end - m.begin}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  const torch::Tensor& codes = second ? m.exp_avg_sq_codes : m.exp_avg_codes;
  const torch::Tensor& scales = second ? m.exp_avg_sq_scales : m.exp_avg_scales;
  kernels::Dequantize8bit(KernelPlace(device_), /*is_signed=*/!second, codes.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                          values.data_ptr<float>(), values.numel());
  return values;
}

void UnitOptimizer::SetMomentValues(size_t unit, bool second, const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  Moments& m = moments_[unit];
  const torch::Tensor v = values.to(device_, torch::kFloat).contiguous();
  TORCH_CHECK(v.numel() == m.end - m.begin, "SetMomentValues: ", v.numel(), " values for an optimizer range of ", m.end - m.begin);
  if (!eight_bit_) {
    (second ? m.exp_avg_sq : m.exp_avg).copy_(v);
    return;
  }
  const torch::Tensor& codes = second ? m.exp_avg_sq_codes : m.exp_avg_codes;
  const torch::Tensor& scales = second ? m.exp_avg_sq_scales : m.exp_avg_scales;
  kernels::Quantize8bit(KernelPlace(device_), /*is_signed=*/!second, v.data_ptr<float>(), codes.data_ptr<uint8_t>(),
                        scales.data_ptr<float>(), v.numel());
}

void UnitOptimizer::DiscardGradients() {
  torch::NoGradGuard no_grad;
  reduced_.clear();
  for (ParamUnit& unit : model_.units()) {
    if (unit.sharded) {
      unit.flat.mutable_grad() = torch::Tensor();
    } else {
      unit.grad.zero_();  // the parameters' .grad views stay pointed at it
    }
  }
}

}  // namespace strata::worker
