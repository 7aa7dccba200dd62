#include "worker/train/trainer.h"

#ifdef STRATA_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "worker/nn/causal_lm.h"
#include "worker/nn/hf_format.h"
#include "worker/nn/lora.h"
#include "worker/nn/torch_compat.h"
#include "worker/train/device_memory.h"

namespace strata::worker {
namespace {

// The partition of the world into groups of ranks that differ only in the coordinate `vary`.
std::vector<std::vector<uint32_t>> GroupsAlong(const shard::MeshShape& mesh, char vary) {
  std::vector<std::vector<uint32_t>> groups;
  std::map<std::vector<int64_t>, size_t> index;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const shard::MeshPosition p = shard::PositionOf(mesh, r);
    std::vector<int64_t> key = {vary == 's' ? -1 : p.stage, vary == 'd' ? -1 : p.dp_rank, vary == 't' ? -1 : p.tp_rank};
    auto [it, inserted] = index.emplace(key, groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(static_cast<uint32_t>(r));
  }
  return groups;
}

std::string MeshName(const shard::MeshShape& m) {
  return "dp=" + std::to_string(m.dp) + " x pp=" + std::to_string(m.pp) + " x tp=" + std::to_string(m.tp);
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::Create(const TaskContext& context, TokenData data, torch::Device device) {
  std::unique_ptr<Trainer> trainer(new Trainer(context, std::move(data), device));
  STRATA_RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

Trainer::Trainer(const TaskContext& context, TokenData data, torch::Device device)
    : context_(context), data_(std::move(data)), device_(device), mesh_(shard::MeshOf(context.spec.parallel)) {}

Status Trainer::Init() {
  const TaskContext& context = context_;
  if (mesh_.size() != static_cast<int64_t>(context.world_size)) {
    return InvalidArgument("the run's mesh " + MeshName(mesh_) + " needs " + std::to_string(mesh_.size()) +
                           " workers but the task has " + std::to_string(context.world_size));
  }
  position_ = shard::PositionOf(mesh_, context.rank);
  STRATA_RETURN_IF_ERROR(BuildGroups());
  // Where the weights come from. A resume: the checkpoint, loaded later into uninitialised
  // units. init_from: each rank reads only the tensors it holds a part of from the memory-mapped
  // files, one at a time. Otherwise each rank draws the parameters it holds from the seed
  // (ParameterDraw), so any mesh starts from exactly the weights of a single worker.
  const bool resuming = !context.resume.run_id.empty();
  const ModelSpec& model_spec = context.spec.model;
  // LoRA: a checkpoint holds only the adapters, so the frozen base is read (or drawn) on a
  // resume too; the adapters start from InitialLoraAdapters, or from the checkpoint.
  const bool lora = context.spec.lora.enabled;
  const bool base_needed = !resuming || lora;
  StageModel::WeightLoader adapter_load, base_load;
  std::optional<ParameterDraw> draw;
  uint64_t read_bytes = 0;
  double draw_seconds = 0;  // of the load's time, drawing (the rest: placing, quantizing)
  torch::Device draw_device = torch::kCPU;
  const auto load_start = std::chrono::steady_clock::now();
  std::optional<model::HfCheckpoint> checkpoint;
  Status load_status;
  if (base_needed && !model_spec.init_from.empty()) {
    auto opened = model::HfCheckpoint::Open(model_spec.init_from);
    if (!opened.ok()) return opened.status();
    checkpoint.emplace(std::move(*opened));
    base_load = [&](const model::Parameter& p, const StageModel::WeightUse& use) {
      if (!load_status.ok()) return;  // the first error is the one reported
      load_status = WithHfParameter(*checkpoint, model_spec, p, [&](const torch::Tensor& whole) {
        read_bytes += static_cast<uint64_t>(whole.nbytes());
        use(whole);
      });
    };
  } else if (base_needed) {
    // Drawn a parameter at a time, only those this rank holds, and every mesh starts from the
    // same weights. A frozen LoRA base is drawn where it is held, on the device (a 70B QLoRA base
    // in seconds, quantized there as it is drawn); trained units on the host, whence each unit
    // takes its fp32 masters (wherever offload keeps them).
    draw.emplace(model_spec, context.spec.train.seed);
    draw_device = lora ? device_ : torch::Device(torch::kCPU);
    base_load = [&](const model::Parameter& p, const StageModel::WeightUse& use) {
      const auto start = std::chrono::steady_clock::now();
      torch::Tensor drawn = (*draw)(p, draw_device);
      if (drawn.is_cuda()) torch::cuda::synchronize(drawn.device().index());  // the draw's time, not the queue's
      draw_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      read_bytes += static_cast<uint64_t>(drawn.nbytes());
      use(drawn);
    };
  }
  std::map<std::string, torch::Tensor> adapters;
  if (lora && !resuming) {
    // model.adapter_from: training continues from that adapter (its config is [lora]'s).
    if (model_spec.adapter_from.empty()) {
      adapters = InitialLoraAdapters(model_spec, context.spec.lora, context.spec.train.seed);
    } else {
      STRATA_ASSIGN_OR_RETURN(adapters, ReadPeftAdapter(model_spec.adapter_from, model_spec, context.spec.lora));
    }
    adapter_load = [&](const model::Parameter& p, const StageModel::WeightUse& use) { use(adapters.at(p.name)); };
  }
  // Full training: the units are the model, filled from its source. LoRA: the units are the
  // adapters, and the base (frozen) comes from the source.
  model_ =
      std::make_unique<StageModel>(context.spec, mesh_, position_, lora ? adapter_load : base_load, device_,
                                   StageModel::Groups{dp_group_.get(), tp_group_.get()}, lora ? base_load : nullptr);
  STRATA_RETURN_IF_ERROR(load_status);
  if (read_bytes > 0) {  // a model's load is the first minutes of a large run: say where they went
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    std::ostringstream what;
    what << std::fixed << std::setprecision(1) << "rank " << context.rank << (checkpoint ? " read " : " drew ")
         << double(read_bytes) / double(1ull << 30) << " GiB"
         << (checkpoint ? " of " + model_spec.init_from : std::string(" from the seed")) << " and placed its part on "
         << device_.str() << (context.spec.lora.base == LoraBase::kNf4 ? " (the base as NF4)" : "") << " in " << seconds
         << " s";
    if (!checkpoint) {
      what << " (" << draw_seconds << " s of it drawing, on "
           << (draw_device.is_cuda() ? draw_device.str() : std::to_string(at::get_num_threads()) + " threads") << ")";
    }
    STRATA_LOG(kInfo) << what.str();
  }
  draw.reset();
  adapters.clear();
  UnitOptimizer::Options optimizer;
  optimizer.eight_bit = context.spec.train.optimizer == Optimizer::kAdamW8bit;
  optimizer.offload =
      context.spec.parallel.offload != Offload::kNone;  // "optimizer", or "optimizer+params" (stage_model.h)
  // The host AdamW's threads: on a GPU this process's share of the host's cores (one worker per
  // GPU) but one, which issues the next forward beside the update; on a CPU worker its [worker]
  // threads, which run its own step too.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  optimizer.host_threads =
      device_.is_cuda() ? std::max(1, cores / std::max<int>(1, static_cast<int>(torch::cuda::device_count())) - 1)
                        : static_cast<int>(std::clamp<int64_t>(context.spec.worker.threads, 1, cores));
  optimizer_ = std::make_unique<UnitOptimizer>(*model_, context.spec.parallel.zero, mesh_.dp, position_.tp_rank,
                                               device_, optimizer);
  optimizer_->SetGroups(UnitOptimizer::Groups{dp_group_.get(), tie_group_.get(), tp_group_.get()});
  // A unit's gradient is complete: its reduction (or its download, offloaded) starts beside the
  // rest of the backward (optimizer.h).
  model_->SetGradientReady([opt = optimizer_.get()](size_t unit) { opt->GradientReady(unit); });
  if (optimizer.offload) {  // the update runs beside the backward's end and the next forward (optimizer.h)
    model_->SetBeforeUse([opt = optimizer_.get()](size_t unit) { opt->WaitForUnit(unit); });
    model_->SetHostGradient(
        [opt = optimizer_.get()](size_t unit, const torch::Tensor& grad) { opt->HostGradient(unit, grad); });
  }
  // A static schedule (step_graph.h): no offloaded update to wait for (the forward's waits are
  // issued from the host, optimizer.h). Collectives are captured with the step - ZeRO-3's gathers
  // and reduce-scatters (on a side stream the capture forks and joins), tensor parallelism's
  // all-reduces (on the step's stream) and the pipeline's sends and receives (on the
  // communicators' transfer streams, joined at the schedule's end): they are queued in the same
  // order on every step.
  // QLoRA's NF4 linears are kernels on the current stream with no host wait (nf4_linear.h), so
  // they capture as any op.
  const bool graphable = context.spec.train.cuda_graphs && device_.is_cuda() && !optimizer.offload;
  step_graph_ = std::make_unique<StepGraph>(device_, graphable);
  return Status::Ok();
}

Status Trainer::BuildGroups() {
  Communicator& world = *context_.communicator;
  STRATA_ASSIGN_OR_RETURN(dp_group_, world.Split(GroupsAlong(mesh_, 'd')));
  STRATA_ASSIGN_OR_RETURN(tp_group_, world.Split(GroupsAlong(mesh_, 't')));
  STRATA_ASSIGN_OR_RETURN(pipe_forward_, world.Split(GroupsAlong(mesh_, 's')));
  STRATA_ASSIGN_OR_RETURN(pipe_backward_, world.Split(GroupsAlong(mesh_, 's')));
  // 1F1B keeps at most pp micro-batches in flight on a stage: a ring of pp + 1 never waits on a
  // send still in flight unless the peer is that far behind.
  const auto ring = static_cast<size_t>(mesh_.pp + 1);
  send_forward_ = std::make_unique<PipelineSender>(pipe_forward_.get(), ring);
  send_backward_ = std::make_unique<PipelineSender>(pipe_backward_.get(), ring);
  // GPT-2's tied embedding lives on the first and the last stage: those two sum its gradient.
  std::vector<std::vector<uint32_t>> tie;
  for (const auto& pipe : GroupsAlong(mesh_, 's')) {
    if (mesh_.pp > 1) {
      tie.push_back({pipe.front(), pipe.back()});
      for (size_t i = 1; i + 1 < pipe.size(); ++i) tie.push_back({pipe[i]});
    } else {
      tie.push_back(pipe);
    }
  }
  STRATA_ASSIGN_OR_RETURN(tie_group_, world.Split(tie));
  return Status::Ok();
}

int64_t Trainer::optimizer_state_elements() const { return optimizer_->state_elements(); }
int64_t Trainer::unit_gathers() const { return model_->unit_gathers(); }
int64_t Trainer::units_reduced_in_backward() const { return optimizer_->units_reduced_in_backward(); }
const TensorParallelOverlapCounts& Trainer::tp_overlap_counts() const { return model_->tp_overlap_counts(); }
int64_t Trainer::optimizer_state_bytes() const { return optimizer_->state_bytes(); }

std::vector<std::pair<std::string, torch::Tensor>> Trainer::parameters() {
  const Status settled = optimizer_->Settle();  // an offloaded update still running (optimizer.h)
  TORCH_CHECK(settled.ok(), settled.message());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& unit : model_->units()) {
    if (unit.sharded || unit.tied_copy) continue;
    for (size_t i = 0; i < unit.names.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : unit.shapes[i]) n *= d;
      out.emplace_back(unit.names[i], unit.flat.detach().narrow(0, unit.offsets[i], n).view(unit.shapes[i]));
    }
  }
  return out;
}

Result<double> Trainer::Step() {
  const auto& spec = context_.spec;
  const int64_t local_batch = spec.train.global_batch / mesh_.dp;
  const int64_t t = spec.model.sequence;
  auto offsets = data_.BatchOffsets(spec.train.seed, step_, spec.train.global_batch, t);
  auto window = torch::empty({local_batch, t + 1}, torch::kLong);
  auto* w = window.data_ptr<int64_t>();
  for (int64_t row = 0; row < local_batch; ++row) {
    const int64_t start = offsets[position_.dp_rank * local_batch + row];
    STRATA_RETURN_IF_ERROR(data_.Read(start, t + 1, w + row * (t + 1)));
  }
  // A test's memory spike in this step (fault_injector.h); freed with the step.
  torch::Tensor ballast;
  if (const int64_t bytes = context_.faults->StepBallastBytesPerSequence(step_ + 1, context_.rank); bytes > 0) {
    try {
      ballast = torch::ones({bytes * micro_batch()}, torch::TensorOptions().dtype(torch::kByte).device(device_));
    } catch (const std::exception& e) {
      if (!compat::IsOutOfMemory(e)) throw;
      return OutOfMemoryInStep(e);
    }
  }
  torch::Tensor loss_sum;
  int64_t schedule_peak = 0;
  // The sums a failed step started in its backward are left running (DiscardGradients): this
  // step's writes of those gradients come after them. Outside the step's graph; nothing otherwise.
  optimizer_->JoinBackwardReductions();
  try {
    auto schedule = [this](const torch::Tensor& on_device, torch::Tensor* sum) { return RunSchedule(on_device, sum); };
    STRATA_ASSIGN_OR_RETURN(loss_sum, step_graph_->Run(window, schedule, &schedule_peak, [this] {
      model_->EndStep();
      send_forward_->Forget();
      send_backward_->Forget();
    }));
  } catch (const std::exception& e) {
    // Out of memory, or a collective failed inside autograd (a peer was lost or the task was
    // cancelled). The micro-batches' activations are gone with the schedule's frame; the partly
    // accumulated gradients are cleared, so a replay of this step starts clean.
    model_->EndStep();
    ClearGradients();
    if (compat::IsOutOfMemory(e)) {
      return OutOfMemoryInStep(e);
    }
    if (!dynamic_cast<const std::runtime_error*>(&e)) throw;  // a bug, not a lost peer: Guarded reports it
    return Unavailable(std::string("step ") + std::to_string(step_ + 1) + " failed: " + e.what());
  }
  model_->EndStep();
  last_step_memory_.schedule_peak_bytes = schedule_peak;
  ResetPeakMemory(device_);
  auto loss = Update(loss_sum);
  last_step_memory_.update_peak_bytes = PeakMemory(device_);
  return loss;
}

Status Trainer::OutOfMemoryInStep(const std::exception& e) const {
  return Status(StatusCode::kResourceExhausted, "out of memory in step " + std::to_string(step_ + 1) +
                                                    " at micro-batch " + std::to_string(micro_batch()) + " on " +
                                                    device_.str() + ": " + compat::OutOfMemoryDetail(e));
}

int64_t Trainer::micro_batch() const { return context_.spec.micro_batch_rows(); }

void Trainer::ClearGradients() {
  // An offloaded update of the step before may still run (optimizer.h): it finishes first. If it
  // failed, the state is torn (state_intact) and nothing is left to clear.
  if (optimizer_->Settle().ok()) optimizer_->DiscardGradients();
}

Result<double> Trainer::Update(const torch::Tensor& loss_sum) {
  torch::NoGradGuard no_grad;
  const auto& tr = context_.spec.train;
  const UnitOptimizer::Groups groups{dp_group_.get(), tie_group_.get(), tp_group_.get()};
  STRATA_RETURN_IF_ERROR(optimizer_->Settle());  // the step before's offloaded update (optimizer.h)
  try {
    const torch::Tensor square_sum = optimizer_->ReduceGradients(groups, step_graph_->replaying());
    // The loss (from the last stage's tensor-parallel rank 0) and the squared norm: one all-reduce.
    const bool reports_loss = model_->last_stage() && position_.tp_rank == 0;
    auto scalars = torch::stack({reports_loss ? loss_sum : torch::zeros_like(loss_sum), square_sum}).contiguous();
    AllReduceTensor(*context_.communicator, scalars);
    scalars = scalars.to(torch::kCPU);
    const double mean_loss = scalars[0].item<double>() / static_cast<double>(mesh_.dp);
    if (!std::isfinite(mean_loss)) {
      return Internal("loss became " + std::to_string(mean_loss) + " at step " + std::to_string(step_ + 1) +
                      "; lower train.lr or set train.grad_clip");
    }
    const double norm = std::sqrt(scalars[1].item<double>());
    last_grad_norm_ = norm;
    const double clip = tr.grad_clip > 0 && norm > tr.grad_clip ? tr.grad_clip / (norm + 1e-6) : 1.0;

    // From here on this rank changes its state: a failure part-way leaves it torn.
    torn_ = true;
    ++step_;
    const double lr = LearningRate(tr, step_);
    optimizer_->Apply(tr, step_, lr, clip, groups);
    torn_ = false;
    return mean_loss;
  } catch (const std::exception& e) {
    if (!torn_) ClearGradients();
    const std::string where = "step " + std::to_string(torn_ ? step_ : step_ + 1) + (torn_ ? " (in its update)" : "");
    if (compat::IsOutOfMemory(e)) {
      return Status(StatusCode::kResourceExhausted,
                    "out of memory in " + where + " on " + device_.str() + ": " + compat::OutOfMemoryDetail(e));
    }
    if (!dynamic_cast<const std::runtime_error*>(&e)) throw;
    return Unavailable(where + " failed: " + e.what());
  }
}

torch::Tensor Trainer::Logits(const torch::Tensor& tokens) {
  TORCH_CHECK(mesh_.pp == 1 && mesh_.tp == 1 && context_.spec.parallel.zero < 3,
              "Logits needs the whole model on one rank");
  const Status settled = optimizer_->Settle();  // an offloaded update still running (optimizer.h)
  TORCH_CHECK(settled.ok(), settled.message());
  torch::NoGradGuard no_grad;
  compat::AutocastGuard autocast(device_, context_.spec.train.precision == Precision::kBf16);
  auto logits = model_->Head(model_->Blocks(model_->Embed(tokens.to(device_))));
  return logits.to(torch::kCPU, torch::kFloat).contiguous();
}

}  // namespace strata::worker
