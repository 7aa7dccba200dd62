// AdamW over one rank's parameter units (internal to worker/, includes LibTorch): the moments it
// keeps, the gradient reduction over the data-parallel group, and the fused update (kernels/).
//
// Per unit u, with g the unit's flat gradient on this rank:
//   reduce   g is summed over the tied-embedding group (GPT-2's wte on the first and last stage),
//            then over the dp group - all-reduce (ZeRO 0, 1) or reduce-scatter (ZeRO 2; ZeRO 3
//            reduce-scattered it in backward) - and divided by dp;
//   norm     sum of g^2 over this rank's shard, each element counted once (norm mask: not in the
//            tied copy, tensor-parallel rank 0 for replicated parameters);
//   apply    AdamW with bias correction on the optimizer range [begin, end) - the whole unit, or
//            this rank's 1/dp shard under ZeRO >= 1 - decay on matrices only (decay mask):
//              p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//              p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//            then ZeRO 1/2 all-gather the updated unit.
// The trainer all-reduces the loss and the squared norm between reduce and apply, so the clip
// factor is known before any parameter changes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/run_spec.h"
#include "worker/stage_model.h"

namespace strata::worker {

class UnitOptimizer {
 public:
  struct Moments {
    torch::Tensor exp_avg, exp_avg_sq, decay_mask, norm_mask;  // over the unit's optimizer range
    int64_t begin = 0, end = 0;                                 // that range, in the unit's flat vector
  };
  struct Groups {
    Communicator* dp = nullptr;   // the data-parallel group
    Communicator* tie = nullptr;  // GPT-2's tied embedding: the first and last stage
  };

  // Zeroed moments for every unit of `model`: this rank's ZeRO shard of each when zero >= 1.
  UnitOptimizer(StageModel& model, int64_t zero, int64_t dp, int64_t tp_rank, torch::Device device);

  // Reduces every unit's gradient (above) and returns the squared norm of this rank's share, a
  // scalar on the device. The reduced gradients are kept for Apply.
  torch::Tensor ReduceGradients(const Groups& groups);
  // The update of step `step` with learning rate `lr` and gradient scale `clip`; clears the
  // gradients. A failure part-way leaves the units torn (some updated, some not).
  void Apply(const TrainSpec& train, int64_t step, double lr, double clip, const Groups& groups);
  // Drops the reduced gradients and clears the units' (a step that will be replayed).
  void DiscardGradients();

  Moments& moments(size_t unit) { return moments_[unit]; }
  const Moments& moments(size_t unit) const { return moments_[unit]; }
  // Elements this rank holds per moment.
  int64_t state_elements() const;

 private:
  StageModel& model_;
  const int64_t zero_, dp_;
  const torch::Device device_;
  std::vector<Moments> moments_;  // one per unit
  std::vector<torch::Tensor> reduced_;  // ReduceGradients' result per unit, until Apply
  torch::Tensor norm_scratch_;          // kernels::MaskedSquareSum's partial sums, on the device
};

}  // namespace strata::worker
