// A training step's forwards and backwards as one CUDA graph (internal to worker/, includes
// LibTorch).
//
// Why: a small model's step is bound by the CPU issuing kernels, not by the GPU running them.
// GPT-2 124M at 8 x 1024 on an H100 queued ~1,000 kernels a step; the GPU ran them in 25.7 ms
// and the step took 28.4 ms. A captured graph issues the whole schedule with one call.
//
// How (PyTorch's whole-network capture, for the trainer's schedule):
//   first step of a shape  eager, on this object's stream (lazy set-ups such as that stream's
//                          cuBLAS workspace happen outside the capture);
//   second step            captured on that stream into a private memory pool, then replayed;
//   every later step       the batch copied into the captured input, then one replay.
// A graph replays fixed addresses, so everything it touches stays put: the token window and the
// loss sum are tensors owned here; parameters and their gradient buffers are updated and zeroed
// in place by the optimizer (optimizer.cc); activations live in the graph's pool between steps.
// Nothing inside the schedule may wait on the host: the loss is read after the replay, and the
// rotary tables are built once (model_family.h). The optimizer's update stays outside the graph:
// it reads the loss and the gradient norm on the host first (trainer.cc).
//
// The caller decides eligibility: a CUDA device, no offloaded update, train.cuda_graphs.
// Collectives are captured with the rest - NCCL collectives and point-to-point transfers replay
// from a graph, and the schedule queues them in the same order every step: ZeRO-3's gathers and
// reduce-scatters (on a side stream, which the capture forks from this object's stream and joins
// again), tensor parallelism's all-reduces (on this stream) and a pipeline stage's sends and
// receives (on the communicators' transfer streams, joined at the schedule's end). Memory that
// another stream still reads when it is dropped (the caching allocator's record_stream) stays out
// of reuse until the capture ends, so ZeRO-3's gradient buffers and the pipeline's send buffers
// are reused rather than dropped (stage_model.h). A capture that fails (an op that synchronises,
// out of memory) is logged, the step runs eagerly, and graphs stay off.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"

namespace strata::worker {

class StepGraph {
 public:
  // The schedule of one step: forwards and backwards over `window` (tokens [rows, t + 1] on the
  // device), adding the loss into `loss_sum` (a zeroed fp32 scalar on the device).
  using Schedule = std::function<Status(const torch::Tensor& window, torch::Tensor* loss_sum)>;

  // `enabled`: the caller's eligibility (above); when false every step runs eagerly.
  StepGraph(torch::Device device, bool enabled);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs `schedule` for `window` (tokens on the host) as described above and returns the loss
  // sum (on the device; valid until the next Run). `schedule_peak` gets the step's peak of
  // allocated bytes: measured for eager and captured steps, the capture's for replays. After a
  // capture that failed, `discard` runs before the step runs again op by op: it drops what the
  // refused schedule left on the host (nothing of it ran on the device; events it recorded
  // belong to the dead capture).
  Result<torch::Tensor> Run(const torch::Tensor& window, const Schedule& schedule, int64_t* schedule_peak,
                            const std::function<void()>& discard = nullptr);

  // Forgets the graph: the next Run starts again with an eager step (parameters were replaced).
  void Reset();
  // Whether the last Run replayed (or captured) a graph.
  bool replaying() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace strata::worker
