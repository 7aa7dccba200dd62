// Data-parallel training of one rank (any CausalLm family) (internal to worker/, includes LibTorch).
//
// One step on rank r of n, global batch B:
//   rows [r B/n, (r+1) B/n) of the step's global batch  ->  local mean loss L_r, grads g_r
//   all-reduce( [g_r ; L_r] ) / n  ->  mean gradient and mean loss of the global batch
// which equals a single worker's step on all B rows (up to float summation order).
// With micro-batches of m rows, each micro-batch loss is scaled by m / local rows before
// backward, so the accumulated gradient is the same whatever m (gradient accumulation).
// ZeRO (Rajbhandari et al. 2020) over the n ranks, on the flat vector of all parameters split
// into n shards (ShardRange): stage 1 all-reduces gradients but each rank keeps AdamW moments
// (2 x 4 bytes/param) for its shard only and updates only that shard, then the shards are
// all-gathered; stage 2 reduce-scatters the gradients instead (each rank receives only its
// shard's sum: half the traffic). The update is element-wise, so every stage computes the same
// parameters as stage 0 (the clipping norm is summed in another order).
// AdamW (Loshchilov & Hutter) with bias correction, decay on matrices only, lr from the schedule:
//   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "worker/causal_lm.h"
#include "worker/task.h"
#include "worker/token_data.h"

namespace strata::worker {

class Trainer {
 public:
  Trainer(const TaskContext& context, TokenData data, torch::Device device);

  // Not OK when model.init_from could not be loaded (the trainer must not be used then).
  const Status& init_status() const { return init_status_; }

  // Runs step `step_` + 1; returns the global mean loss.
  Result<double> Step();
  int64_t step() const { return step_; }

  // Writes this rank's shard of the checkpoint at the current step into the store and commits it
  // there: parameters with index % n == rank, and their AdamW moments (stage 0) or this rank's
  // flat shard of the moments, named "zero/adam_m/BEGIN:END:TOTAL" (stages 1-2).
  Result<std::vector<storage::CheckpointTensorInfo>> SaveCheckpointShard();

  // Parameters by name, in a fixed order.
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const { return params_; }
  // Elements of AdamW state this rank holds per moment (all parameters at stage 0, a 1/n shard above).
  int64_t optimizer_state_elements() const;

 private:
  void AdamW();
  // Stages 1-2: exchange gradients, update this rank's shard, all-gather the parameters.
  Result<double> ShardedStep(const torch::Tensor& loss_sum);

  const TaskContext& context_;
  TokenData data_;
  torch::Device device_;
  std::shared_ptr<CausalLm> model_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;  // stage 0: one pair per parameter
  // Stages 1-2 (host memory, as the ZeroMQ collectives run there): the flat shard's moments and
  // its weight-decay mask (1 on matrices).
  int64_t total_elements_ = 0, shard_begin_ = 0, shard_end_ = 0;
  torch::Tensor shard_exp_avg_, shard_exp_avg_sq_, shard_decay_mask_;
  int64_t step_ = 0;
  Status init_status_;
};

}  // namespace strata::worker
