// Trainer's schedule of one step: micro-batches through this rank's pipeline stage in 1F1B order
// (trainer.h has the maths), gradients accumulated into the units. Split from trainer.cc.
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
#include "worker/nn/torch_compat.h"
#include "worker/train/device_memory.h"

namespace strata::worker {

Status Trainer::RunSchedule(const torch::Tensor& window, torch::Tensor* loss_sum) {
  const auto& spec = context_.spec;
  const int64_t local_batch = window.size(0);
  const int64_t t = spec.model.sequence;
  const int64_t micro = micro_batch();
  const int64_t count = local_batch / micro;
  const double share = static_cast<double>(micro) / static_cast<double>(local_batch);
  // Sequence parallel: a stage sends its tensor-parallel rank's tokens (stage_model.h).
  const int64_t tokens_held = shard::SequenceParallel(spec, mesh_.tp) ? t / mesh_.tp : t;
  const std::vector<int64_t> activation_shape = {micro, tokens_held, spec.model.hidden};
  const auto stage = static_cast<uint32_t>(position_.stage);

  struct InFlight {
    torch::Tensor input;   // received activation (leaf), undefined on the first stage
    torch::Tensor output;  // scaled loss (last stage) or the activation sent on
  };
  std::deque<InFlight> in_flight;
  auto forward = [&](int64_t i) {
    auto rows = window.narrow(0, i * micro, micro);
    InFlight f;
    compat::AutocastGuard autocast(device_, spec.train.precision == Precision::kBf16);
    torch::Tensor x;
    if (model_->first_stage()) {
      x = model_->Embed(rows.narrow(1, 0, t));
    } else {
      f.input = RecvTensor(*pipe_forward_, activation_shape, device_, stage - 1).requires_grad_(true);
      x = f.input;
    }
    x = model_->Blocks(x);
    if (model_->last_stage()) {
      auto loss = model_->HeadLoss(x, rows.narrow(1, 1, t));
      *loss_sum += loss.detach() * share;
      f.output = loss * share;
    } else {
      send_forward_->Send(x, stage + 1);
      f.output = x;
    }
    in_flight.push_back(std::move(f));
    model_->ForwardDone();
  };
  auto backward = [&] {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    if (model_->last_stage()) {
      f.output.backward();
    } else {
      auto grad = RecvTensor(*pipe_backward_, activation_shape, device_, stage + 1);
      f.output.backward(grad.to(f.output.scalar_type()));
    }
    model_->EndBackward();
    if (!model_->first_stage()) send_backward_->Send(f.input.grad(), stage - 1);
  };
  // 1F1B: warm up with the forwards the later stages need to start, then one forward and one
  // backward at a time, then drain.
  model_->BeginGradients(count);
  const int64_t warmup = std::min<int64_t>(mesh_.pp - 1 - position_.stage, count);
  for (int64_t i = 0; i < warmup; ++i) forward(i);
  for (int64_t i = warmup; i < count; ++i) {
    forward(i);
    backward();
  }
  while (!in_flight.empty()) backward();
  send_forward_->Join(device_);
  send_backward_->Join(device_);
  if (context_.faults->SyncInStep(step_ + 1))
    (void)loss_sum->item<float>();  // a test's refused capture (fault_injector.h)
  model_->FinishGradients();
  optimizer_->JoinBackwardReductions();  // inside the step's graph, as the reductions it joins
  return Status::Ok();
}

}  // namespace strata::worker
