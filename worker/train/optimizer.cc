#include "worker/train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>

#include "worker/nn/kernel_place.h"

namespace strata::worker {
namespace {

// A host-streamed unit's "upload ticket" in Pending::uploaded: its update is done, and there is
// nothing on the device to wait for.
constexpr size_t kNothingUploaded = SIZE_MAX;

// A unit's parameters and reduced gradient `g` over its optimizer range (the whole unit, or this
// rank's ZeRO shard; a ZeRO-3 unit holds only its shard, as does its gradient).
std::pair<torch::Tensor, torch::Tensor> OptimizerRange(const ParamUnit& unit, const UnitOptimizer::Moments& m,
                                                       const torch::Tensor& g) {
  torch::Tensor flat = unit.flat.detach();
  if (unit.sharded) return {flat, g};
  return {flat.narrow(0, m.begin, m.end - m.begin), g.narrow(0, m.begin, m.end - m.begin)};
}

struct Run {
  int64_t begin = 0, length = 0;  // relative to the range asked for
  bool on = false;
};

// [lo, hi) of `unit`'s flat vector cut into maximal runs of one flag, flag(i) over parameter i's
// elements. The parameters lie back to back in order and tile the vector (StageModel::AddUnit).
template <typename Flag>
std::vector<Run> RunsOf(const ParamUnit& unit, int64_t lo, int64_t hi, Flag flag) {
  std::vector<Run> runs;
  for (size_t i = 0; i < unit.names.size(); ++i) {
    const int64_t end = i + 1 < unit.offsets.size() ? unit.offsets[i + 1] : unit.numel;
    const int64_t b = std::max(unit.offsets[i], lo), e = std::min(end, hi);
    if (b >= e) continue;
    const bool on = flag(i);
    if (!runs.empty() && runs.back().on == on) {
      runs.back().length += e - b;
    } else {
      runs.push_back({b - lo, e - b, on});
    }
  }
  return runs;
}

}  // namespace

UnitOptimizer::UnitOptimizer(StageModel& model, int64_t zero, int64_t dp, int64_t tp_rank, torch::Device device,
                             const Options& opts)
    : model_(model),
      zero_(zero),
      dp_(dp),
      eight_bit_(opts.eight_bit),
      device_(device),
      state_device_(opts.offload ? torch::Device(torch::kCPU) : device),
      host_threads_(std::max(1, opts.host_threads)) {
  const bool sharded_moments = zero >= 1;
  if (opts.offload) offload_ = std::make_unique<HostCopies>(device_);
  // The moments where they are updated: the device, or the host under offload.
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(state_device_);
  for (auto& unit : model_.units()) {
    Moments m;
    m.begin = sharded_moments ? unit.shard_begin : 0;
    m.end = sharded_moments ? unit.shard_end : unit.numel;
    const int64_t n = m.end - m.begin;
    // Decay on matrices; the norm counts each element once.
    int64_t blocks = 0;
    for (const Run& r : RunsOf(unit, m.begin, m.end, [&](size_t i) { return unit.full_shapes[i].size() >= 2; })) {
      m.update_spans.push_back({r.begin, r.length, r.on, blocks});
      blocks += kernels::AdamW8bitBlocks(r.length);
    }
    for (const Run& r : RunsOf(unit, unit.shard_begin, unit.shard_end,
                               [&](size_t i) { return !unit.tied_copy && (!unit.replicated[i] || tp_rank == 0); })) {
      if (r.on) m.norm_spans.push_back({r.begin, r.length});
    }
    if (eight_bit_) {
      const auto codes = options.dtype(torch::kByte);
      m.exp_avg_codes = torch::empty({n}, codes);
      m.exp_avg_sq_codes = torch::empty({n}, codes);
      // Zero scales: AdamW8bitInit below writes the first AdamW8bitBlocks(n) of them, and the
      // spans' partial blocks can make more.
      m.exp_avg_scales = torch::zeros({blocks}, options);
      m.exp_avg_sq_scales = torch::zeros({blocks}, options);
      kernels::AdamW8bitInit(KernelPlace(state_device_), m.exp_avg_codes.data_ptr<uint8_t>(),
                             m.exp_avg_scales.data_ptr<float>(), m.exp_avg_sq_codes.data_ptr<uint8_t>(),
                             m.exp_avg_sq_scales.data_ptr<float>(), n);
    } else {
      m.exp_avg = torch::zeros({n}, options);
      m.exp_avg_sq = torch::zeros({n}, options);
    }
    if (offload_) {
      host_.push_back(
          {HostCopies::HostBuffer(device_, n), unit.on_host ? unit.flat.detach() : HostCopies::HostBuffer(device_, n)});
    }
    moments_.push_back(std::move(m));
  }
  int64_t longest_host_shard = 0;
  for (const auto& unit : model_.units()) {
    if (unit.on_host) longest_host_shard = std::max(longest_host_shard, unit.shard_end - unit.shard_begin);
  }
  if (longest_host_shard > 0) {
    TORCH_CHECK(offload_, "host-streamed parameters need the optimizer offloaded too");
    sums_ = std::make_unique<HostGradientSums>(*offload_, device_, longest_host_shard);
  }
  ParametersChanged();
  norm_scratch_ =
      torch::empty({kernels::SquareSumScratch()}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  reduced_in_backward_.assign(model_.units().size(), false);
  fired_this_step_.assign(model_.units().size(), false);
  tp_summed_in_backward_.assign(model_.units().size(), false);
  if (dp_ > 1 && zero_ <= 2 && !opts.offload) backward_side_ = std::make_unique<SideStream>(device_);
}

int64_t UnitOptimizer::state_elements() const {
  int64_t n = 0;
  for (const auto& m : moments_) n += m.end - m.begin;
  return n;
}

int64_t UnitOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& m : moments_) {
    for (const torch::Tensor* t :
         {&m.exp_avg, &m.exp_avg_sq, &m.exp_avg_codes, &m.exp_avg_scales, &m.exp_avg_sq_codes, &m.exp_avg_sq_scales}) {
      if (t->defined()) bytes += t->numel() * static_cast<int64_t>(t->element_size());
    }
  }
  return bytes;
}

bool UnitOptimizer::SummedOverStages(size_t u) const {
  return static_cast<int>(u) == model_.first_wte_unit() || static_cast<int>(u) == model_.tied_copy_unit();
}

namespace {

// The gradient of a parameter read with this rank's tokens (sequence parallel, stage_model.h) or
// heads (ParamUnit::tp_partial) only is its part; the sum over the tensor-parallel ranks is the whole. `g` holds the
// unit's flat range [g_begin, g_begin + g.numel()) (the whole unit, or a ZeRO-3 shard); one collective per unit for all
// of its such parameters (a few vectors), through the device for host memory.
void SumTpPartial(const ParamUnit& unit, torch::Tensor& g, int64_t g_begin, Communicator& tp,
                  const torch::Device& device) {
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < unit.names.size(); ++i) {
    if (!unit.tp_partial[i]) continue;
    int64_t n = 1;
    for (int64_t d : unit.shapes[i]) n *= d;
    const int64_t from = std::max(unit.offsets[i], g_begin), to = std::min(unit.offsets[i] + n, g_begin + g.numel());
    if (from < to) parts.push_back(g.narrow(0, from - g_begin, to - from));
  }
  if (parts.empty()) return;
  torch::Tensor joined = torch::cat(parts).to(device);
  AllReduceTensor(tp, joined);
  int64_t at = 0;
  for (torch::Tensor& part : parts) {
    part.copy_(joined.narrow(0, at, part.numel()));
    at += part.numel();
  }
}

}  // namespace

void UnitOptimizer::GradientReady(size_t u) {
  ParamUnit& unit = model_.units()[u];
  const bool reduce_here = backward_side_ && unit.sink && !SummedOverStages(u);
  const bool download_here = offload_ && dp_ == 1 && !SummedOverStages(u) && !unit.sharded && !host_[u].downloading;
  if (!reduce_here && !download_here) return;
  torch::NoGradGuard no_grad;
  // Sequence parallel: the tensor-parallel sum first, on the backward's own stream - the tp group's
  // collectives stay on one stream, in the order every rank issues them.
  if (groups_.tp && TpPartial(u) && unit.sink) {
    SumTpPartial(unit, unit.grad, 0, *groups_.tp, device_);
    tp_summed_in_backward_[u] = true;
  }
  if (reduce_here) {
    backward_side_->Run([&] { Reduce(u, unit.grad, groups_); });
    reduced_in_backward_[u] = true;
    fired_this_step_[u] = true;
    return;
  }
  host_[u].ticket = offload_->Download(OptimizerRange(unit, moments_[u], unit.grad).second, host_[u].grad);
  host_[u].downloading = true;
}

void UnitOptimizer::HostGradient(size_t u, const torch::Tensor& grad) {
  sums_->Add(grad, host_[u].grad, host_[u].uses++ == 0);
}

bool UnitOptimizer::TpPartial(size_t u) const {
  const auto& partial = model_.units()[u].tp_partial;
  return std::find(partial.begin(), partial.end(), true) != partial.end();
}

void UnitOptimizer::JoinBackwardReductions() {
  if (backward_side_) backward_side_->WaitAll();
}

void UnitOptimizer::Reduce(size_t u, torch::Tensor& g, const Groups& groups) {
  const ParamUnit& unit = model_.units()[u];
  if (groups.tp && TpPartial(u) && !tp_summed_in_backward_[u]) {
    SumTpPartial(unit, g, unit.sharded ? unit.shard_begin : 0, *groups.tp, device_);
  }
  if (SummedOverStages(u)) AllReduceTensor(*groups.tie, g);
  if (zero_ <= 1) AllReduceTensor(*groups.dp, g);
  if (zero_ == 2) ReduceScatterTensor(*groups.dp, g);  // zero 3 reduce-scattered in backward
}

torch::Tensor UnitOptimizer::ReduceGradients(const Groups& groups, bool replayed) {
  SettleOrThrow();
  // A replayed graph reduces the units its capture did, without host code; a step run op by op
  // must have started the very units every step before did (their sums would be skipped below).
  if (!replayed && fired_this_step_ != reduced_in_backward_) {
    for (size_t u = 0; u < fired_this_step_.size(); ++u) {
      if (fired_this_step_[u] != reduced_in_backward_[u]) {
        throw std::logic_error(
            "unit " + model_.units()[u].label + "'s gradient sum " +
            (fired_this_step_[u] ? "started in this backward only" : "did not start in this backward") +
            "; the dp ranks would diverge");
      }
    }
  }
  fired_this_step_.assign(fired_this_step_.size(), false);
  torch::NoGradGuard no_grad;
  if (sums_) {  // the host-streamed units' gradients, summed in host memory during the backward
    const Status summed = sums_->Drain();
    if (!summed.ok()) throw std::runtime_error(summed.message());
  }
  auto& units = model_.units();
  const kernels::Place place = KernelPlace(device_);
  torch::Tensor square_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  double host_square_sum = 0;  // a GPU worker's host-streamed units
  reduced_.clear();
  for (size_t u = 0; u < units.size(); ++u) {
    ParamUnit& unit = units[u];
    if (unit.on_host) {
      HostUnit& host = host_[u];
      torch::Tensor g = host.grad;
      if (host.uses == 0) g.zero_();  // no use this step (a guard: every unit is used)
      host.uses = 0;
      if (groups.tp && TpPartial(u)) SumTpPartial(unit, g, unit.shard_begin, *groups.tp, device_);
      if (SummedOverStages(u)) {  // through the device: the communicator may take device buffers only
        torch::Tensor on_device = g.to(device_);
        AllReduceTensor(*groups.tie, on_device);
        g.copy_(on_device);
      }
      if (dp_ > 1) g.div_(static_cast<double>(dp_));  // reduce-scattered (summed) in backward
      if (device_.is_cpu()) {  // the on-device path's own arithmetic: a CPU worker's losses equal it bit for bit
        for (const Moments::Span& sp : moments_[u].norm_spans) {
          kernels::SquareSum(place, g.data_ptr<float>() + sp.begin, sp.length, square_sum.data_ptr<float>(),
                             norm_scratch_.data_ptr<float>());
        }
      } else {
        for (const Moments::Span& sp : moments_[u].norm_spans) {
          host_square_sum += kernels::SquareSumHost(g.data_ptr<float>() + sp.begin, sp.length, host_threads_);
        }
      }
      reduced_.push_back(g);
      continue;
    }
    torch::Tensor g = unit.sharded
                          ? (unit.flat.grad().defined() ? unit.flat.grad().contiguous() : torch::zeros_like(unit.flat))
                          : unit.grad;
    if (!reduced_in_backward_[u]) Reduce(u, g, groups);  // else done beside the backward, and joined
    if (dp_ > 1 && !MeanInUpdate()) g.div_(static_cast<double>(dp_));
    auto shard = unit.sharded ? g : g.narrow(0, unit.shard_begin, unit.shard_end - unit.shard_begin);
    for (const Moments::Span& s : moments_[u].norm_spans) {
      kernels::SquareSum(place, shard.data_ptr<float>() + s.begin, s.length, square_sum.data_ptr<float>(),
                         norm_scratch_.data_ptr<float>());
    }
    reduced_.push_back(g);
    if (offload_ && !host_[u].downloading) {  // on its way to the host while the next units are reduced
      host_[u].ticket = offload_->Download(OptimizerRange(unit, moments_[u], g).second, host_[u].grad);
    }
    if (offload_) host_[u].downloading = false;  // for the next step
  }
  if (host_square_sum > 0) square_sum.add_(host_square_sum);
  if (MeanInUpdate()) square_sum.mul_(1.0 / static_cast<double>(dp_ * dp_));
  return square_sum;
}

void UnitOptimizer::Apply(const TrainSpec& tr, int64_t step, double lr, double clip, const Groups& groups) {
  SettleOrThrow();
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  // Units whose bf16 working copy the update writes in its pass (the fp32 AdamW kernel) or right
  // after it (offload, on the upload stream): those it updates whole - a ZeRO-3 shard's copy is
  // of the shard (ZeRO 1/2 with dp > 1 update a shard and gather the rest in fp32; the 8-bit
  // kernel writes no copy).
  std::vector<bool> fresh(units.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    const Moments& m = moments_[u];
    fresh[u] = units[u].working.defined() && (units[u].sharded || (m.begin == 0 && m.end == units[u].numel)) &&
               (offload_ || !eight_bit_);
  }
  // After the update: ZeRO 1/2 gather the updated shards; the gradients are cleared.
  const bool gathers = (zero_ == 1 || zero_ == 2) && dp_ > 1;
  auto finish_unit = [&](ParamUnit& unit) {
    torch::Tensor flat = unit.flat.detach();
    if (gathers) AllGatherTensor(*groups.dp, flat);
    if (unit.sharded) {
      // Zeroed in place, not dropped: a ZeRO-3 step captured as a CUDA graph (step_graph.h)
      // sums into this very buffer on every replay.
      if (unit.flat.grad().defined()) unit.flat.mutable_grad().zero_();
    } else if (!unit.sink) {  // a sink unit's next step writes its gradients afresh (stage_model.h)
      unit.grad.zero_();      // the parameters' .grad views stay pointed at it
    }
  };
  if (offload_) {
    // The gradients' buffers are zeroed here and rewritten in the next backward: after their
    // downloads. The update runs on a thread of its own (the header), which gets the device
    // tensors it writes and touches no unit: the units stay this thread's.
    offload_->CurrentStreamWaitsDownloads();
    if (!gathers) {
      for (ParamUnit& unit : units) finish_unit(unit);
    }
    std::vector<HostTarget> targets;
    for (size_t u = 0; u < units.size(); ++u) {
      const torch::Tensor flat = units[u].flat.detach();
      const Moments& m = moments_[u];
      if (units[u].on_host) {
        targets.emplace_back();  // the master copy is the shard itself: nothing to upload
        continue;
      }
      targets.push_back({units[u].sharded ? flat : flat.narrow(0, m.begin, m.end - m.begin),
                         fresh[u] ? units[u].working : torch::Tensor(), fresh[u] ? flat : torch::Tensor()});
    }
    pending_ = std::make_unique<Pending>(units.size(), step);
    pending_->thread = std::thread(
        [this, tr, step, lr, clip, targets = std::move(targets)] { UpdateOnHost(tr, step, lr, clip, targets); });
    if (gathers) {
      SettleOrThrow();  // the all-gathers read every unit
      for (ParamUnit& unit : units) finish_unit(unit);
    }
  } else {
    const kernels::Place place = KernelPlace(device_);
    const double grad_scale = MeanInUpdate() ? clip / static_cast<double>(dp_) : clip;
    for (size_t u = 0; u < units.size(); ++u) {
      Moments& m = moments_[u];
      uint16_t* working = fresh[u] ? reinterpret_cast<uint16_t*>(units[u].working.data_ptr()) : nullptr;
      const auto [p, g] = OptimizerRange(units[u], m, reduced_[u]);
      // One fused pass per span (kernels/kernels.h has the maths): clipping, decay, moments, update.
      for (const Moments::UpdateSpan& s : m.update_spans) {
        const kernels::AdamWArgs args{lr,   tr.beta1,  tr.beta2, tr.eps, s.decay ? tr.weight_decay : 0.0,
                                      step, grad_scale};
        float* ps = p.data_ptr<float>() + s.begin;
        const float* gs = g.data_ptr<float>() + s.begin;
        if (eight_bit_) {
          kernels::AdamW8bit(place, args, ps, gs, m.exp_avg_codes.data_ptr<uint8_t>() + s.begin,
                             m.exp_avg_scales.data_ptr<float>() + s.scale_offset,
                             m.exp_avg_sq_codes.data_ptr<uint8_t>() + s.begin,
                             m.exp_avg_sq_scales.data_ptr<float>() + s.scale_offset, s.length);
        } else {
          kernels::AdamW(place, args, ps, gs, m.exp_avg.data_ptr<float>() + s.begin,
                         m.exp_avg_sq.data_ptr<float>() + s.begin, s.length, working ? working + s.begin : nullptr);
        }
      }
    }
    for (ParamUnit& unit : units) finish_unit(unit);
  }
  reduced_.clear();
  model_.RefreshWorkingWeights(fresh);
}

void UnitOptimizer::UpdateOnHost(const TrainSpec& tr, int64_t step, double lr, double clip,
                                 const std::vector<HostTarget>& targets) {
  Pending& pending = *pending_;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  try {
    torch::NoGradGuard no_grad;  // grad mode is per thread
    for (size_t u = 0; u < targets.size(); ++u) {
      Moments& m = moments_[u];
      HostUnit& host = host_[u];
      const HostTarget& target = targets[u];
      const auto waiting = Clock::now();
      if (target.params.defined())
        offload_->WaitDownload(host.ticket);  // a host-streamed unit's gradient is summed there already
      pending.gradient_wait_s += std::chrono::duration<double>(Clock::now() - waiting).count();
      float* p = host.master.data_ptr<float>();
      const float* g = host.grad.data_ptr<float>();
      for (const Moments::UpdateSpan& s : m.update_spans) {
        const kernels::AdamWArgs args{lr, tr.beta1, tr.beta2, tr.eps, s.decay ? tr.weight_decay : 0.0, step, clip};
        if (eight_bit_) {
          kernels::AdamW8bit(
              kernels::Place{}, args, p + s.begin, g + s.begin, m.exp_avg_codes.data_ptr<uint8_t>() + s.begin,
              m.exp_avg_scales.data_ptr<float>() + s.scale_offset, m.exp_avg_sq_codes.data_ptr<uint8_t>() + s.begin,
              m.exp_avg_sq_scales.data_ptr<float>() + s.scale_offset, s.length);
        } else {
          kernels::AdamWHost(args, p + s.begin, g + s.begin, m.exp_avg.data_ptr<float>() + s.begin,
                             m.exp_avg_sq.data_ptr<float>() + s.begin, s.length, host_threads_);
        }
      }
      std::function<void()> then;
      if (target.working.defined()) {
        then = [&target] { target.working.copy_(target.whole); };  // the bf16 copy the matmuls read (stage_model.h)
      }
      const size_t ticket =
          target.params.defined() ? offload_->Upload(host.master, target.params, then) : kNothingUploaded;
      {
        MutexLock lock(pending.mu);
        pending.uploaded[u] = ticket;
      }
      pending.changed.NotifyAll();
    }
  } catch (const std::exception& e) {
    MutexLock lock(pending.mu);
    pending.failure = e.what();
  }
  {
    MutexLock lock(pending.mu);
    pending.update_s = std::chrono::duration<double>(Clock::now() - start).count();
    pending.done = true;
  }
  pending.changed.NotifyAll();
}

void UnitOptimizer::WaitForUnit(size_t unit) {
  if (!pending_ || unit >= pending_->waited.size() || pending_->waited[unit]) return;
  std::optional<size_t> ticket;
  const auto waiting = std::chrono::steady_clock::now();
  {
    MutexLock lock(pending_->mu);
    pending_->changed.Wait(
        lock, [&]() STRATA_REQUIRES(pending_->mu) { return pending_->uploaded[unit].has_value() || pending_->done; });
    ticket = pending_->uploaded[unit];
  }
  pending_->forward_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting).count();
  if (ticket && *ticket != kNothingUploaded) offload_->CurrentStreamWaitsUpload(*ticket);
  pending_->waited[unit] = true;
}

Status UnitOptimizer::Settle() {
  if (!pending_)
    return failed_ ? Internal("an earlier offloaded update failed; the run must resume from a checkpoint")
                   : Status::Ok();
  pending_->thread.join();
  offload_->CurrentStreamWaitsUploads();
  offload_times_ = {pending_->update_s, pending_->gradient_wait_s, pending_->forward_wait_s};
  const std::string failure = pending_->failure;
  const int64_t step = pending_->step;
  pending_.reset();
  if (failure.empty()) return Status::Ok();
  failed_ = true;
  return Internal("the offloaded optimizer's update of step " + std::to_string(step) + " failed on the host: " +
                  failure + "; this rank's parameters are torn and the run must resume from a checkpoint");
}

void UnitOptimizer::SettleOrThrow() {
  const Status settled = Settle();
  if (!settled.ok()) throw std::runtime_error(settled.message());
}

UnitOptimizer::~UnitOptimizer() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
}

torch::Tensor UnitOptimizer::MomentValues(size_t unit, bool second) {
  SettleOrThrow();
  const Moments& m = moments_[unit];
  if (!eight_bit_) return second ? m.exp_avg_sq : m.exp_avg;
  auto values = torch::empty({m.end - m.begin}, torch::TensorOptions().dtype(torch::kFloat).device(state_device_));
  const torch::Tensor& codes = second ? m.exp_avg_sq_codes : m.exp_avg_codes;
  const torch::Tensor& scales = second ? m.exp_avg_sq_scales : m.exp_avg_scales;
  for (const Moments::UpdateSpan& s : m.update_spans) {
    kernels::Dequantize8bit(KernelPlace(state_device_), /*is_signed=*/!second, codes.data_ptr<uint8_t>() + s.begin,
                            scales.data_ptr<float>() + s.scale_offset, values.data_ptr<float>() + s.begin, s.length);
  }
  return values;
}

void UnitOptimizer::SetMomentValues(size_t unit, bool second, const torch::Tensor& values) {
  SettleOrThrow();
  torch::NoGradGuard no_grad;
  Moments& m = moments_[unit];
  const torch::Tensor v = values.to(state_device_, torch::kFloat).contiguous();
  TORCH_CHECK(v.numel() == m.end - m.begin, "SetMomentValues: ", v.numel(), " values for an optimizer range of ",
              m.end - m.begin);
  if (!eight_bit_) {
    (second ? m.exp_avg_sq : m.exp_avg).copy_(v);
    return;
  }
  const torch::Tensor& codes = second ? m.exp_avg_sq_codes : m.exp_avg_codes;
  const torch::Tensor& scales = second ? m.exp_avg_sq_scales : m.exp_avg_scales;
  for (const Moments::UpdateSpan& s : m.update_spans) {
    kernels::Quantize8bit(KernelPlace(state_device_), /*is_signed=*/!second, v.data_ptr<float>() + s.begin,
                          codes.data_ptr<uint8_t>() + s.begin, scales.data_ptr<float>() + s.scale_offset, s.length);
  }
}

void UnitOptimizer::ParametersChanged() {
  if (!offload_) return;
  SettleOrThrow();
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].on_host) continue;  // its master copy is the shard itself
    const torch::Tensor flat = units[u].flat.detach();
    const Moments& m = moments_[u];
    offload_->WaitDownload(
        offload_->Download(units[u].sharded ? flat : flat.narrow(0, m.begin, m.end - m.begin), host_[u].master));
  }
}

void UnitOptimizer::DiscardGradients() {
  SettleOrThrow();
  torch::NoGradGuard no_grad;
  // A failed step's sums started in its backward may wait for a rank that stopped before them
  // (until the run's collectives are aborted): nothing here waits for them - the snapshot taken
  // next must not queue behind them - and their units are not zeroed: the side stream may still
  // write there, and as sink units their next step's first gradient is copied in, not added
  // (stage_model.h). The next step's compute stream waits for them first (Trainer::Step).
  fired_this_step_.assign(fired_this_step_.size(), false);
  reduced_.clear();
  if (sums_) {
    (void)sums_->Drain();  // a failed sum is dropped with the rest of the step's gradients
    for (HostUnit& host : host_) host.uses = 0;
  }
  if (offload_) {  // the gradients are zeroed below: after any download of them
    offload_->CurrentStreamWaitsDownloads();
    offload_->ForgetDownloads();
    for (HostUnit& host : host_) host.downloading = false;
  }
  for (size_t u = 0; u < model_.units().size(); ++u) {
    ParamUnit& unit = model_.units()[u];
    if (unit.sharded) {
      if (unit.flat.grad().defined()) unit.flat.mutable_grad().zero_();  // as Apply: the buffer stays put
    } else if (!reduced_in_backward_[u]) {
      unit.grad.zero_();  // the parameters' .grad views stay pointed at it
    }
  }
}

}  // namespace strata::worker
