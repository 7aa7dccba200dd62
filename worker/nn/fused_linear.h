// A linear layer whose weight gradient the backward's matmul writes itself (internal to worker/,
// includes LibTorch): Megatron's gradient-accumulation fusion.
//
// For y = x W^T + b (x [..., in], W [out, in], b [out]), backward needs
//   dx = dy W,   dW = dy^T x (summed over every row of x),   db = sum of dy's rows.
// LibTorch's linear returns dW in W's dtype: for a bf16 working copy of an fp32 parameter that is
// a bf16 [out, in] tensor, which the gradient sink then widens into the fp32 buffer (a copy on the
// step's first use, an add after). Here the dW matmul writes fp32 straight into that buffer:
// cuBLAS bf16 x bf16 -> fp32 with beta = 0 on the step's first use and beta = 1 after. No bf16 dW
// is written or read again, and dW is not rounded to bf16 on its way (more exact than autocast's).
// dx and db are torch::linear's.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace strata::worker {

// Where a parameter's gradient goes (StageModel's gradient sink: one per parameter and step).
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Forward, the ordinary route: `value` (the parameter itself or its working copy), counted as
  // one more use, with a backward that writes its gradient into the sink.
  virtual torch::Tensor Use(const torch::Tensor& param, const torch::Tensor& value) = 0;
  // Forward, for an op that will Write itself: one more use this step.
  virtual void CountUse() = 0;
  // Backward: `write(buffer, first)` puts one use's gradient into the fp32 buffer (the parameter's
  // shape): written when `first` (the step's first use; the old contents are garbage), else added.
  virtual void Write(const std::function<void(torch::Tensor& buffer, bool first)>& write) = 0;
};

// Weight gradients put off until a collective they can run beside (tensor parallel's backward,
// Megatron's overlap of the weight-gradient matmuls with the column-parallel input gradient's
// reduce-scatter): a matmul that reads f's output (stage_model.h) computes dx at once - f's
// backward sums it over the ranks - and queues dW here; f's backward starts its collective on a
// side stream and runs the queue meanwhile. dW's value is the same whenever it runs (the same dy
// and x), and each parameter's writes keep their order. One backward at a time (not thread-safe).
class DeferredWeightGradients {
 public:
  void Defer(std::function<void()> write) { pending_.push_back(std::move(write)); }
  // Runs the queued writes in the order queued; returns how many ran.
  int64_t RunAll();
  // Drops the queued writes unrun (a backward that failed part-way: its gradients are discarded).
  void Clear() { pending_.clear(); }
  bool empty() const { return pending_.empty(); }

 private:
  std::vector<std::function<void()>> pending_;
};

// Rows of a matmul's input that are ready before the rest (tensor parallel's forward overlap,
// tensor_parallel.h): the rows [begin, end) - this rank's own tokens of a sequence-parallel
// gather - may be multiplied at once; `wait_rest()` must return before any other row is read (the
// compute stream then waits for the gather running beside).
struct RowsAhead {
  int64_t begin = 0, end = 0;  // rows of the input flattened to [rows, in]
  std::function<void()> wait_rest;
};

// x W^T + b (torch::linear's value; bias may be undefined), all in W's dtype. With `ahead`, the
// rows it names first, then the others after its wait, by the ops torch::linear folds to over
// fewer rows: the same bits on CPU; a GPU's matmul may pick another kernel for fewer rows and
// round otherwise.
torch::Tensor LinearRows(const torch::Tensor& x, const torch::Tensor& working, const torch::Tensor& bias,
                         const RowsAhead* ahead);

// LinearIntoGradient's backward, for an op that computes x W^T inside a larger one (tensor
// parallel's row-parallel matmul and its sum, tensor_parallel.h): with dy [..., out] and x
// [..., in] as the forward saw it (in W's dtype), puts dW = dy^T x into the sink (queued on
// `defer` when not null) and returns dx = dy W in `x_type` when `want_dx`, else undefined. The
// forward counted the use (GradientSink::CountUse).
torch::Tensor LinearIntoGradientBackward(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& working,
                                         GradientSink* sink, DeferredWeightGradients* defer, bool want_dx,
                                         torch::ScalarType x_type);

// x W^T + b with W = `working` (a bf16 working copy or the fp32 parameter itself) and `param`
// the parameter whose gradient goes to `sink` (counted as one use when grad mode is on; param
// carries no gradient through autograd). `bias` may be undefined; its gradient goes through
// autograd as torch::linear's does. `defer`: where the backward queues its weight gradient's write
// (null: written at once). `ahead`: the forward's rows in two turns (LinearRows).
torch::Tensor LinearIntoGradient(const torch::Tensor& x, const torch::Tensor& param, const torch::Tensor& working,
                                 const torch::Tensor& bias, GradientSink* sink,
                                 DeferredWeightGradients* defer = nullptr, const RowsAhead* ahead = nullptr);

}  // namespace strata::worker
