// Zero3Shards (zero3_shards.h has the schedule): gathers, gradient slots and reduce-scatters.
#include "worker/train/zero3_shards.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <stdexcept>

#include "worker/train/tensor_transfer.h"

namespace strata::worker {

namespace {

// A gathered buffer's memory goes back to the allocator while the tensor, and every view of it
// that autograd saved, lives on; Refill gives it memory again (FSDP's storage resize). Both are
// ordered on the compute stream, which allocated it.
void ReleaseMemory(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void RefillMemory(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() > 0) return;
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

// The dtype `unit` is gathered in: bf16 where a call's matmuls read bf16 working weights (a bf16
// GPU run, `matmul_weights`): the shard's working copy, or a host shard cast on the device; else fp32.
torch::ScalarType GatherType(const ParamUnit& unit, bool matmul_weights, bool working_copies) {
  return matmul_weights && (unit.working.defined() || (unit.on_host && working_copies)) ? torch::kBFloat16
                                                                                        : torch::kFloat;
}

torch::Tensor GatherBuffer(const ParamUnit& unit, torch::ScalarType dtype, const torch::Device& device) {
  return torch::empty({unit.numel}, torch::TensorOptions().dtype(dtype).device(device));
}

// Vectors (norms, biases) are read in fp32 whatever the gathered dtype, as on the other paths: a
// bf16 gather's vectors are joined and widened into one fp32 buffer by the gather's own work on
// the side stream (two kernels a unit, off the compute stream), and each becomes its view of it.
bool IsVector(const ParamUnit& unit, size_t i) { return unit.shapes[i].size() < 2; }

int64_t VectorElements(const ParamUnit& unit) {
  int64_t n = 0;
  for (size_t i = 0; i < unit.shapes.size(); ++i) {
    if (IsVector(unit, i)) n += c10::multiply_integers(unit.shapes[i]);
  }
  return n;
}

// `wide` (fp32, VectorElements long) <- the vectors of the gathered unit `full`, in order.
void JoinVectors(const ParamUnit& unit, const torch::Tensor& full, torch::Tensor& wide) {
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < unit.shapes.size(); ++i) {
    if (IsVector(unit, i)) parts.push_back(full.narrow(0, unit.offsets[i], c10::multiply_integers(unit.shapes[i])));
  }
  wide.copy_(parts.size() == 1 ? parts.front() : torch::cat(parts));
}

void UseWideVectors(const ParamUnit& unit, const torch::Tensor& wide, std::vector<torch::Tensor>& params) {
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!IsVector(unit, i)) continue;
    const int64_t n = params[i].numel();
    params[i] = wide.narrow(0, offset, n).view(params[i].sizes());
    offset += n;
  }
}

// The fp32 buffer a forward gather of `unit` in `dtype` widens its vectors into (on the compute
// stream, which reads it); undefined where there is nothing to widen.
torch::Tensor WideBuffer(const ParamUnit& unit, torch::ScalarType dtype, const torch::Device& device) {
  const int64_t n = dtype == torch::kFloat ? 0 : VectorElements(unit);
  return n == 0 ? torch::Tensor() : torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

}  // namespace

// One use of a sharded unit by a call: the whole unit gathered, and its gradient.
struct Zero3Shards::ShardedCall {
  struct Use {
    int unit = -1;
    torch::Tensor full;                       // the gathered unit (memory freed between forward and backward)
    torch::Tensor wide;                       // its vectors in fp32 (a bf16 forward gather's), or undefined
    std::shared_ptr<SideStream::Done> ready;  // its gather
    bool filled = true;                       // full holds the unit (false between forward and backward)
    torch::Tensor grad;                       // fp32, the unit's length: this use's gradient (taken by the first)
    int grad_buffer = -1;                     // which of grad_buffers_ holds it
    std::vector<bool> written;                // per parameter: its part of grad holds a gradient
    int pending = 0;                          // counted uses whose gradient has not arrived
    bool reduced = false;
  };
  std::vector<Use> uses;
  int64_t micro_batch = 0;  // forwards done before it: calls of one micro-batch share it
  size_t index = 0;         // in calls_
};

// A parameter of a gathered unit: forward hands on its view of the gathered buffer (vectors
// widened to fp32), backward sends the gradient to the use's buffer. The shard (or the host
// anchor) is an input so that autograd runs the backward; it receives no gradient from autograd.
struct ShardedWeightFunction : torch::autograd::Function<ShardedWeightFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor /*shard*/, torch::Tensor value,
                               int64_t slot) {
    ctx->saved_data["slot"] = slot;
    return value;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* slot = reinterpret_cast<Zero3Shards::ShardSlot*>(ctx->saved_data["slot"].toInt());
    const torch::Tensor& g = grad[0];
    if (!g.defined()) {
      slot->Skip();
    } else {
      slot->Write([&](torch::Tensor& buffer, bool first) {
        if (first) {
          buffer.copy_(g);  // widens a bf16 gradient in the same kernel
        } else {
          buffer.add_(g);
        }
      });
    }
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

Zero3Shards::Zero3Shards(std::vector<ParamUnit>& units, Communicator& dp, torch::Device device, Layout layout)
    : units_(units), dp_(dp), device_(device), layout_(std::move(layout)), side_(std::make_unique<SideStream>(device)) {
  const bool host_streamed =
      std::any_of(units_.begin(), units_.end(), [](const ParamUnit& unit) { return unit.on_host; });
  if (host_streamed) {
    host_anchor_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_)).requires_grad_(true);
  }
  looks_up_rows_ = CanLookUpRows();
}

Zero3Shards::~Zero3Shards() = default;

GradientSink* Zero3Shards::SlotOf(int unit, size_t param) const {
  if (running_ == nullptr) return nullptr;
  const std::vector<int>& call_units = *running_->units;
  const auto in_call = std::find(call_units.begin(), call_units.end(), unit);
  if (in_call == call_units.end()) return nullptr;
  return running_->slots[static_cast<size_t>(in_call - call_units.begin())][param];
}

torch::Tensor Zero3Shards::ShardSlot::Use(const torch::Tensor& param, const torch::Tensor& value) {
  CountUse();
  return ShardedWeightFunction::apply(param, value, reinterpret_cast<int64_t>(this));
}

void Zero3Shards::ShardSlot::CountUse() { ++call_->uses[use_].pending; }

void Zero3Shards::ShardSlot::Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) {
  ShardedCall::Use& use = call_->uses[use_];
  {
    torch::NoGradGuard no_grad;
    const ParamUnit& unit = shards_->units_[static_cast<size_t>(use.unit)];
    // Not zero-filled: each parameter's first gradient writes its part (a matmul's with beta 0,
    // fused_linear.h), and ReduceScatterUse zeroes the parts no gradient reached.
    if (!use.grad.defined()) shards_->TakeGradBuffer(*call_, use_);
    int64_t n = 1;
    for (int64_t d : unit.shapes[param_]) n *= d;
    torch::Tensor part = use.grad.narrow(0, unit.offsets[param_], n).view(unit.shapes[param_]);
    const bool first = !use.written[param_];
    use.written[param_] = true;
    write(part, first);
  }
  Skip();
}

void Zero3Shards::ShardSlot::Skip() {
  if (--call_->uses[use_].pending == 0) shards_->ReduceScatterUse(*call_, use_);
}

// The identity on a ZeRO-3 call's output, whose backward - the first of the call's - gathers
// its units again.
struct RegatherOnBackward : torch::autograd::Function<RegatherOnBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor y, int64_t shards, int64_t call) {
    ctx->saved_data["shards"] = shards;
    ctx->saved_data["call"] = call;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* shards = reinterpret_cast<Zero3Shards*>(ctx->saved_data["shards"].toInt());
    shards->Regather(*reinterpret_cast<Zero3Shards::ShardedCall*>(ctx->saved_data["call"].toInt()), /*wait=*/true);
    return {grad[0], torch::Tensor(), torch::Tensor()};
  }
};

std::shared_ptr<SideStream::Done> Zero3Shards::GatherInto(int u, const torch::Tensor& full, torch::Tensor wide) {
  const ParamUnit& unit = units_[static_cast<size_t>(u)];
  const bool bf16 = full.scalar_type() == torch::kBFloat16;
  const torch::Tensor shard = bf16 && !unit.on_host ? unit.working : unit.flat.detach();
  // Written through an alias with a version counter of its own: autograd checks that the views it
  // saved of `full` were not modified since, and a gather in backward refills, not modifies.
  torch::Tensor target = torch::from_blob(full.data_ptr(), {unit.numel}, full.options());
  ++unit_gathers_;
  return side_->Run([&] {
    torch::NoGradGuard no_grad;
    GatherOnSide(unit, shard, target);
    if (wide.defined()) JoinVectors(unit, target, wide);
  });
}

void Zero3Shards::GatherOnSide(const ParamUnit& unit, const torch::Tensor& shard, torch::Tensor& target) {
  const bool bf16 = target.scalar_type() == torch::kBFloat16;
  Communicator& dp = dp_;
  if (!unit.on_host) {  // out of place: the collective reads the shard where it is
    AllGatherTensorFrom(dp, shard, target);
    return;
  }
  torch::Tensor mine = target.narrow(0, unit.shard_begin, unit.shard_end - unit.shard_begin);
  if (bf16) {
    // Uploaded in fp32 (the host keeps no bf16 copy: 2 bytes a parameter of host memory, the
    // scarcer one here) and cast on the device; the staging is the side stream's own memory.
    torch::Tensor staging = torch::empty({mine.numel()}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    staging.copy_(shard, /*non_blocking=*/true);
    mine.copy_(staging);
  } else {
    mine.copy_(shard, /*non_blocking=*/true);  // pinned host memory: the upload runs on the side stream
  }
  if (dp.world_size() == 1) return;
  if (bf16) {
    ThrowIfFailed(dp.AllGather16(reinterpret_cast<uint16_t*>(target.data_ptr()), static_cast<size_t>(unit.numel)));
  } else {
    AllGatherTensor(dp, target);
  }
}

bool Zero3Shards::KeepsGathered(const std::vector<int>& units) const {
  const int64_t keep = layout_.keep_gathered;
  if (keep <= 0 || units.size() != 1) return false;
  const auto it = std::find(layout_.block_units.begin(), layout_.block_units.end(), units.front());
  if (it == layout_.block_units.end()) return false;
  const int64_t position = it - layout_.block_units.begin(), layers = static_cast<int64_t>(layout_.block_units.size());
  return position >= layers - keep;
}

std::pair<std::vector<int>, bool> Zero3Shards::NextCall(const std::vector<int>& units) const {
  for (size_t i = 0; i + 1 < layout_.call_order.size(); ++i) {
    if (layout_.call_order[i].first == units) return layout_.call_order[i + 1];
  }
  return {{}, false};
}

void Zero3Shards::Prefetch(const std::vector<int>& units, bool bf16) {
  for (int u : units) {
    if (prefetched_.count(u)) continue;
    if (before_use_) before_use_(static_cast<size_t>(u));
    const ParamUnit& unit = units_[static_cast<size_t>(u)];
    const torch::ScalarType dtype = GatherType(unit, bf16, layout_.working_copies);
    torch::Tensor full = GatherBuffer(unit, dtype, device_), wide = WideBuffer(unit, dtype, device_);
    prefetched_[u] = {full, wide, GatherInto(u, full, wide)};
  }
}

torch::Tensor Zero3Shards::Run(const std::vector<int>& units, const torch::Tensor& x, const CallFn& fn,
                               bool matmul_weights, int64_t micro_batch) {
  const bool grad = torch::GradMode::is_enabled();
  auto call = std::make_shared<ShardedCall>();
  call->micro_batch = micro_batch;
  call->index = calls_.size();
  // This call's units (every unit is sharded under ZeRO-3): gathered ahead by the call before, or now.
  for (int u : units) {
    ShardedCall::Use use;
    use.unit = u;
    const torch::ScalarType dtype = GatherType(units_[static_cast<size_t>(u)], matmul_weights, layout_.working_copies);
    auto it = prefetched_.find(u);
    if (it != prefetched_.end() && it->second.full.scalar_type() == dtype) {
      use.full = it->second.full;
      use.wide = it->second.wide;
      use.ready = it->second.ready;
    } else {
      use.full = GatherBuffer(units_[static_cast<size_t>(u)], dtype, device_);
      use.wide = WideBuffer(units_[static_cast<size_t>(u)], dtype, device_);
      use.ready = GatherInto(u, use.full, use.wide);
    }
    if (it != prefetched_.end()) {
      if (!use.full.is_same(it->second.full)) {  // dropped while they may still be written
        side_->KeepUntilDone(it->second.full);
        side_->KeepUntilDone(it->second.wide);
      }
      prefetched_.erase(it);
    }
    call->uses.push_back(std::move(use));
  }
  // The next call's gathers go before this call's compute, so they run beside it.
  const auto [next, next_bf16] = NextCall(units);
  Prefetch(next, next_bf16);
  std::vector<std::vector<torch::Tensor>> views;
  RunningCall sinks;  // the gradients' slots, handed out by SlotOf (a use counted per access)
  sinks.units = &units;
  std::deque<ShardSlot>* slots = grad ? &slots_.emplace_back() : nullptr;
  for (size_t k = 0; k < units.size(); ++k) {
    ShardedCall::Use& use = call->uses[k];
    ParamUnit& unit = units_[static_cast<size_t>(use.unit)];
    side_->Wait(use.ready);
    std::vector<torch::Tensor> params = UnitViews(unit, use.full);
    if (use.wide.defined()) UseWideVectors(unit, use.wide, params);
    use.written.assign(params.size(), false);
    sinks.slots.emplace_back();
    for (size_t i = 0; i < params.size(); ++i) {
      if (grad) sinks.slots.back().push_back(&slots->emplace_back(this, call.get(), k, i));
    }
    views.push_back(std::move(params));
  }
  torch::Tensor y;
  {
    struct Current {  // the slots are this call's while its forward runs, and no longer
      const RunningCall*& view;
      ~Current() { view = nullptr; }
    } current{running_};
    if (grad) running_ = &sinks;
    y = fn(x, views);
  }
  // The gathered memory goes back; autograd's saved views of it are filled again in backward.
  // The stage's last call keeps it: its backward comes next (without a pipeline), and a gather
  // there would wait with nothing beside it. So do the layers parallel.keep_gathered names.
  if (!(grad && (next.empty() || KeepsGathered(units)))) {
    for (ShardedCall::Use& use : call->uses) {
      ReleaseMemory(use.full);
      use.filled = false;
    }
  }
  if (!grad || !y.requires_grad()) return y;
  calls_.push_back(call);
  return RegatherOnBackward::apply(y, reinterpret_cast<int64_t>(this), reinterpret_cast<int64_t>(call.get()));
}

void Zero3Shards::Regather(ShardedCall& call, bool wait) {
  for (ShardedCall::Use& use : call.uses) {
    if (use.filled || use.reduced) continue;
    RefillMemory(use.full);
    use.ready = GatherInto(use.unit, use.full);
    use.filled = true;
  }
  if (!wait) return;
  for (ShardedCall::Use& use : call.uses) side_->Wait(use.ready);
  // The call before it in the micro-batch comes next in the backward: its gathers now.
  if (call.index > 0) {
    ShardedCall& before = *calls_[call.index - 1];
    if (before.micro_batch == call.micro_batch) Regather(before, /*wait=*/false);
  }
}

// Gradient buffers are reused, not allocated per use: a buffer dropped while the side stream's
// reduce-scatter still reads it would, inside a CUDA graph's capture, stay out of the allocator
// until the capture ends (its record_stream is deferred), so a captured step would hold every
// use's fp32 gradient at once - the whole model's, per micro-batch. Reused, a step holds about two
// buffers per unit size (the one being reduced and the one being written), in eager steps too.
// A buffer is free once its reduce-scatter is queued, not done: the taker's stream waits for that,
// so the one released last (its reduce-scatter just queued) is never taken - it would make the
// backward wait for the reduce-scatter it should overlap - and the oldest release goes first.
void Zero3Shards::TakeGradBuffer(ShardedCall& call, size_t k) {
  ShardedCall::Use& use = call.uses[k];
  const int64_t numel = units_[static_cast<size_t>(use.unit)].numel;
  int best = -1;
  auto better = [&](const GradBuffer& b) {
    if (best < 0) return true;
    const GradBuffer& c = grad_buffers_[static_cast<size_t>(best)];
    const bool fits = b.buffer.numel() <= 2 * numel, fitted = c.buffer.numel() <= 2 * numel;  // not a far larger one
    return fits != fitted ? fits : b.released < c.released;
  };
  for (size_t i = 0; i < grad_buffers_.size(); ++i) {
    const GradBuffer& b = grad_buffers_[i];
    if (b.busy || b.buffer.numel() < numel || (b.released > 0 && b.released == releases_)) continue;
    if (better(b)) best = static_cast<int>(i);
  }
  if (best < 0) {
    grad_buffers_.push_back(
        {torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat).device(device_)), nullptr, false, 0});
    best = static_cast<int>(grad_buffers_.size() - 1);
  }
  GradBuffer& b = grad_buffers_[static_cast<size_t>(best)];
  side_->Wait(b.done);  // its last reduce-scatter has read it
  b.busy = true;
  use.grad = b.buffer.narrow(0, 0, numel);
  use.grad_buffer = best;
}

void Zero3Shards::ReduceScatterUse(ShardedCall& call, size_t k) {
  ShardedCall::Use& use = call.uses[k];
  if (use.reduced) return;
  use.reduced = true;
  ParamUnit& unit = units_[static_cast<size_t>(use.unit)];
  torch::NoGradGuard no_grad;
  const int64_t length = unit.shard_end - unit.shard_begin;
  if (!use.grad.defined()) {
    TakeGradBuffer(call, k);
    use.grad.zero_();
  } else {
    for (size_t i = 0; i < use.written.size();
         ++i) {  // a parameter no gradient reached (a guard: none is unused today)
      if (use.written[i]) continue;
      int64_t n = 1;
      for (int64_t d : unit.shapes[i]) n *= d;
      use.grad.narrow(0, unit.offsets[i], n).zero_();
    }
  }
  const torch::Tensor full = use.grad;
  const size_t u = static_cast<size_t>(use.unit);
  const ShardGradient to = NextShardGradient(u, full.options());
  const auto reduced = side_->Run([&] {
    torch::Tensor g = full;
    if (!unit.on_host && to.first) {  // reduce-scattered straight into the shard's gradient
      torch::Tensor shard = to.sum;
      ReduceScatterTensorTo(dp_, g, shard);
      return;
    }
    ReduceScatterTensor(dp_, g);  // each rank keeps its shard's sum
    // A host-streamed shard's sum goes to the host from a copy of its own: the host's download
    // runs on its copy stream, after this, while `full` (a reused buffer) is taken again once the
    // side stream is past this point. (Handed over in place, the next use's gradient could land
    // in it before the download had read it.)
    const torch::Tensor mine = g.narrow(0, unit.shard_begin, length);
    AddToShardGradient(u, to, unit.on_host ? mine.clone() : mine);
  });
  // The buffer is taken again once the reduce-scatter has read it (the next taker's stream waits).
  GradBuffer& buffer = grad_buffers_[static_cast<size_t>(use.grad_buffer)];
  buffer.done = reduced;
  buffer.busy = false;
  buffer.released = ++releases_;
  use.grad = torch::Tensor();
  use.grad_buffer = -1;
  side_->Wait(use.ready);      // a gather queued for a backward that never came (FinishGradients) is done first
  ReleaseMemory(use.full);     // after the backward that read it, on the compute stream
  use.wide = torch::Tensor();  // (autograd's saved views of it go with the backward's graph)
  use.filled = false;
}

// The shard's gradient sums every use of the step (micro-batches, a tied embedding's two, its
// lookup's rows): on the device, or for a host-streamed unit in host memory (the hook). The step's
// first contribution writes it; later ones add.
Zero3Shards::ShardGradient Zero3Shards::NextShardGradient(size_t u, const torch::TensorOptions& options) {
  ParamUnit& unit = units_[u];
  TORCH_CHECK(!unit.on_host || host_gradient_,
              "a host-streamed unit's gradient has nowhere to go: no SetHostGradient hook");
  if (!unit.on_host && !unit.flat.grad().defined())
    unit.flat.mutable_grad() = torch::zeros({unit.shard_end - unit.shard_begin}, options);
  return {unit.on_host ? torch::Tensor() : unit.flat.grad(),
          unit_reductions_.at(u)++ == 0};  // counted from BeginGradients
}

void Zero3Shards::AddToShardGradient(size_t u, const ShardGradient& to, const torch::Tensor& part) {
  if (units_[u].on_host) {
    host_gradient_(u, part);
    return;
  }
  torch::Tensor sum = to.sum;
  if (to.first) {
    sum.copy_(part);
  } else {
    sum.add_(part);
  }
}

void Zero3Shards::BeginGradients() { unit_reductions_.assign(units_.size(), 0); }

void Zero3Shards::FinishGradients() {
  for (const auto& call : calls_) {  // a parameter that received no gradient leaves its use open
    for (size_t k = 0; k < call->uses.size(); ++k) {
      ReduceScatterUse(*call, k);
    }
  }
  side_->WaitAll();
}

void Zero3Shards::EndStep() {
  side_->WaitAll();           // nothing still writes a gradient or a gathered buffer
  unsorted_lookups_.clear();  // (after the wait: a sort that failed part-way may have queued work)
  if (host_anchor_.defined()) side_->Synchronize();  // nor reads a host shard the optimizer writes next
  calls_.clear();
  slots_.clear();
  prefetched_.clear();
  for (GradBuffer& b : grad_buffers_) {  // a step that failed part-way left some taken; the wait above covers them
    b.busy = false;
    b.done = nullptr;
    b.released = 0;
  }
  releases_ = 0;
}

}  // namespace strata::worker
