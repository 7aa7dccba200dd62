#include "worker/train/step_graph.h"

#ifdef STRATA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <chrono>
#include <optional>
#include <sstream>

#include "common/log.h"
#include "worker/train/device_memory.h"

namespace strata::worker {

struct StepGraph::State {
  explicit State(torch::Device d) : device(d) {}
  enum class Phase { kEager, kCapture, kReplay, kOff };
  torch::Device device;
  Phase phase = Phase::kEager;
  std::vector<int64_t> shape;  // the window shape the graph is for
  torch::Tensor window;        // the captured input: tokens on the device
  torch::Tensor loss_sum;      // the captured output
  int64_t captured_peak = 0;   // allocated bytes at the capture's peak
  bool replayed = false;
#ifdef STRATA_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;  // capture needs a stream other than the default
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

StepGraph::StepGraph(torch::Device device, bool enabled) : state_(std::make_unique<State>(device)) {
  if (!enabled) state_->phase = State::Phase::kOff;
}
StepGraph::~StepGraph() = default;

void StepGraph::Reset() {
  if (state_->phase == State::Phase::kOff) return;
#ifdef STRATA_WITH_CUDA
  state_->graph.reset();  // releases the graph's memory pool
#endif
  state_->phase = State::Phase::kEager;
  state_->shape.clear();
}

bool StepGraph::replaying() const { return state_->replayed; }

Result<torch::Tensor> StepGraph::Run(const torch::Tensor& window, const Schedule& schedule, int64_t* schedule_peak,
                                     const std::function<void()>& discard) {
  State& s = *state_;
  s.replayed = false;
  const torch::Device device = s.device;
  auto eager = [&]() -> Result<torch::Tensor> {
    ResetPeakMemory(device);
    torch::Tensor on_device = window.to(device);
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    STRATA_RETURN_IF_ERROR(schedule(on_device, &loss_sum));
    *schedule_peak = PeakMemory(device);
    return loss_sum;
  };
#ifndef STRATA_WITH_CUDA
  return eager();
#else
  if (!device.is_cuda() || s.phase == State::Phase::kOff) return eager();
  if (s.shape != window.sizes().vec()) {  // a new micro-batch plan or window: start over
    Reset();
    s.shape = window.sizes().vec();
  }
  if (!s.stream) s.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
  c10::cuda::CUDAStream& side = *s.stream;
  // The side stream starts after everything queued so far (the last update); the caller's stream
  // continues after the step.
  at::cuda::CUDAEvent before;
  before.record(main);
  before.block(side);
  Result<torch::Tensor> out = torch::Tensor();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    if (!s.window.defined() || s.window.sizes() != window.sizes()) {
      s.window = torch::empty(window.sizes(), window.options().device(device));
      s.loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    }
    s.window.copy_(window);
    switch (s.phase) {
      case State::Phase::kEager: {
        ResetPeakMemory(device);
        s.loss_sum.zero_();
        Status status = schedule(s.window, &s.loss_sum);
        *schedule_peak = PeakMemory(device);
        out = status.ok() ? Result<torch::Tensor>(s.loss_sum) : Result<torch::Tensor>(status);
        if (status.ok()) s.phase = State::Phase::kCapture;
        break;
      }
      case State::Phase::kCapture: {
        // What the warm-up step left cached on the side stream goes back, so the graph's pool
        // can take it.
        c10::cuda::device_synchronize();
        c10::cuda::CUDACachingAllocator::emptyCache();
        ResetPeakMemory(device);
        const auto start = std::chrono::steady_clock::now();
        auto graph = std::make_unique<at::cuda::CUDAGraph>();
        // Thread-local: other threads of the worker (heartbeats reading free memory, checkpoint
        // writers) may call CUDA while this one captures.
        graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
        std::string failure;
        Status status;
        try {
          s.loss_sum.zero_();
          status = schedule(s.window, &s.loss_sum);
        } catch (const std::exception& e) {
          failure = e.what();
        }
        try {
          graph->capture_end();
        } catch (const std::exception& e) {
          if (failure.empty()) failure = e.what();
        }
        if (failure.empty() && !status.ok()) failure = status.ToString();
        if (!failure.empty()) {
          (void)cudaGetLastError();  // a refused capture leaves its error behind
          graph.reset();
          s.phase = State::Phase::kOff;
          const auto line = failure.find('\n');
          STRATA_LOG(kWarn) << "the step could not be captured as a CUDA graph (" << failure.substr(0, line)
                            << "); it runs op by op from now on (train.cuda_graphs = false skips the attempt)";
          // The whole message names the call that was refused (LibTorch adds its frames).
          if (line != std::string::npos) STRATA_LOG(kInfo) << "the refused capture's full error: " << failure;
          break;  // out stays empty: run eagerly below, off the side stream
        }
        s.captured_peak = PeakMemory(device);
        graph->replay();
        s.graph = std::move(graph);
        s.phase = State::Phase::kReplay;
        s.replayed = true;
        *schedule_peak = s.captured_peak;
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        std::ostringstream what;
        what.precision(1);
        what << std::fixed << "the step's forwards and backwards run as one CUDA graph from now on (captured in " << ms
             << " ms)";
        STRATA_LOG(kInfo) << what.str();
        out = s.loss_sum;
        break;
      }
      case State::Phase::kReplay:
        s.graph->replay();
        s.replayed = true;
        *schedule_peak = s.captured_peak;
        out = s.loss_sum;
        break;
      case State::Phase::kOff:
        break;
    }
  }
  at::cuda::CUDAEvent after;
  after.record(side);
  after.block(main);
  if (s.phase == State::Phase::kOff) {
    if (discard) discard();
    return eager();
  }
  return out;
#endif
}

}  // namespace strata::worker
