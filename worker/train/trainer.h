// Training of one rank of a dp x pp x tp mesh (internal to worker/, includes LibTorch).
//
// Step on data-parallel replica d of dp, global batch B, micro-batches of m rows:
//   rows [d B/dp, (d+1) B/dp) of the step's global batch, cut into M = (B/dp)/m micro-batches;
//   each micro-batch's loss is scaled by m/(B/dp), so the accumulated gradient is that of the
//   replica's mean loss whatever m (gradient accumulation);
//   pipeline (pp stages, 1F1B; Narayanan et al. 2021): stage s runs min(pp-s-1, M) forwards,
//   then alternates one forward and one backward, then drains the remaining backwards. Stages
//   exchange activations forward and their gradients backward; at most pp-s micro-batches of
//   activations are alive on stage s;
//   tensor parallel inside each block (stage_model.h);
//   GPT-2's tied embedding: the first and last stage each hold wte and sum its gradient;
//   data parallel: per parameter unit, gradients are summed over the dp group and divided by dp,
//   which equals one worker's step on all B rows (up to float summation order).
// ZeRO (Rajbhandari et al. 2020) over the dp group, per unit: 1 keeps AdamW moments for this
// rank's 1/dp of the unit and updates only that, then all-gathers the parameters; 2 reduce-
// scatters the gradients instead of all-reducing them; 3 also keeps only the 1/dp parameter
// shard (stage_model.h). The update is element-wise, so every stage computes the same step.
// The clipping norm and the loss are one all-reduce of two scalars over the whole world: each
// element is counted once (by its data-parallel shard owner, by tensor-parallel rank 0 when
// replicated, never in the tied copy).
// AdamW (Loshchilov & Hutter) with bias correction, decay on matrices only, lr from the schedule:
//   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#pragma once

#include <torch/torch.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shard/layout.h"
#include "worker/task.h"
#include "worker/token_data.h"
#include "worker/train/optimizer.h"
#include "worker/train/stage_model.h"
#include "worker/train/step_graph.h"

namespace strata::worker {

// One rank's checkpoint shard in host memory, between the copy and the write.
struct HostCheckpoint {
  int64_t step = 0;
  // Where the shard goes in the store: the run's id, or, when an earlier attempt of the run left
  // this step's shard here cut for another mesh, a key of this mesh and rank (RecutKey).
  std::string key_run;
  std::vector<std::pair<std::string, torch::Tensor>> pieces;  // piece name -> contiguous host copy
  std::vector<storage::CheckpointTensorInfo> existing;        // already committed: nothing to write
  int64_t bytes() const {
    int64_t n = 0;
    for (const auto& [name, t] : pieces) n += t.numel() * t.element_size();
    return n;
  }
};

// A committed shard: its pieces under (key_run, step) in the worker's store.
struct SavedShard {
  std::string key_run;
  std::vector<storage::CheckpointTensorInfo> tensors;
};

class Trainer {
 public:
  // A rank's trainer, its part of the model placed (drawn from the seed, read from
  // model.init_from, or left for Resume). An error when init_from cannot be loaded or the mesh
  // does not match the task's world.
  static Result<std::unique_ptr<Trainer>> Create(const TaskContext& context, TokenData data, torch::Device device);

  // Runs step `step_` + 1; returns the global mean loss (the same on every rank). Out of memory
  // returns kResourceExhausted: before the update, no rank changed anything (the update waits on a
  // world all-reduce the failed rank never joins), so state_intact() holds and the step can be
  // replayed, here or under another plan from a snapshot of this state.
  Result<double> Step();
  // False after an update that stopped part-way (a failure after its first parameter change):
  // this rank's state is then neither step_ nor step_ + 1 and must not be saved.
  bool state_intact() const { return !torn_ && !optimizer_->failed(); }
  // Sequences per forward of this rank (parallel.micro_batch, 0 = the per-rank batch).
  int64_t micro_batch() const;
  int64_t step() const { return step_; }
  // Peak memory of the last Step's phases on this rank.
  const StepMemory& last_step_memory() const { return last_step_memory_; }
  // Whether the last Step's forwards and backwards ran as a CUDA graph (step_graph.h).
  bool last_step_replayed_graph() const { return step_graph_->replaying(); }
  // The global L2 norm of the last step's gradient (over every rank's share), before clipping.
  double last_grad_norm() const { return last_grad_norm_; }

  // Writes this rank's pieces of the checkpoint at the current step (shard/layout.h: parameters
  // and AdamW moments, each its tensor-parallel slice cut by data-parallel rank) and commits them:
  // CopyCheckpointShard, then WriteCheckpointShard.
  Result<SavedShard> SaveCheckpointShard();
  // The part that must pause training: host copies of this rank's pieces (or, when an earlier
  // attempt already committed the same pieces of this step here, their infos).
  Result<HostCheckpoint> CopyCheckpointShard();
  // The rest, on any thread (touches no trainer state): stage the copies in `store` and commit.
  // On an error `copy` keeps only the pieces not staged yet, so that trying again (after a full
  // disk has room) writes the rest, not everything twice.
  static Result<SavedShard> WriteCheckpointShard(storage::ShardStore& store, HostCheckpoint* copy);

  // Loads the checkpoint at `resume` (written under any mesh): reads the pieces of the tensors this
  // rank holds from the stores the manifest names, assembles them, keeps its slice and shard of
  // the parameters and AdamW moments, and continues from that step (the data position and the
  // learning-rate schedule follow from the step).
  Status Resume(const ResumePoint& resume);

  // Logits [b, t, vocab] (fp32, on the host) of the current parameters for `tokens`: the whole
  // model must be on this rank (pp = tp = 1, zero < 3). For checks against other tools.
  torch::Tensor Logits(const torch::Tensor& tokens);

  // LoRA: the frozen base this rank holds, by name (empty otherwise; parameters() are the adapters).
  std::vector<std::pair<std::string, torch::Tensor>> frozen_parameters() const { return model_->frozen_parameters(); }
  // This rank's parameters by name (its tensor-parallel slices of its stage's layers; views of
  // the live values). Not with ZeRO-3, where a rank holds no whole parameter.
  std::vector<std::pair<std::string, torch::Tensor>> parameters();
  // Elements of AdamW state this rank holds per moment.
  int64_t optimizer_state_elements() const;
  int64_t optimizer_state_bytes() const;
  // ZeRO-3: whole units this rank has gathered (StageModel::unit_gathers).
  int64_t unit_gathers() const;
  // Units whose gradient reduction runs beside the backward (optimizer.h).
  int64_t units_reduced_in_backward() const;
  // Tensor-parallel communication run beside the compute (StageModel).
  const TensorParallelOverlapCounts& tp_overlap_counts() const;
  // Under offload, where the last settled update's time went (optimizer.h; for benchmarks).
  const UnitOptimizer::OffloadTimes& offload_times() const { return optimizer_->offload_times(); }
  const shard::MeshPosition& position() const { return position_; }

 private:
  Trainer(const TaskContext& context, TokenData data, torch::Device device);
  Status Init();  // Create's work after the members are in place
  Status BuildGroups();
  void ClearGradients();
  void CollectCheckpointPieces(std::vector<std::pair<std::string, torch::Tensor>>* pieces,
                               std::set<std::string>* names);
  Status OutOfMemoryInStep(const std::exception& e) const;
  Status RunSchedule(const torch::Tensor& window, torch::Tensor* loss_sum);
  Result<double> Update(const torch::Tensor& loss_sum);

  const TaskContext& context_;
  TokenData data_;
  torch::Device device_;
  shard::MeshShape mesh_;
  shard::MeshPosition position_;
  // The pipeline has one group per direction (activations forward, gradients backward), so each
  // keeps a single order of transfers on every rank (nccl_communicator.cc).
  std::unique_ptr<Communicator> dp_group_, tp_group_, pipe_forward_, pipe_backward_, tie_group_;
  std::unique_ptr<PipelineSender> send_forward_, send_backward_;  // over pipe_forward_ / pipe_backward_
  std::unique_ptr<StageModel> model_;
  std::unique_ptr<UnitOptimizer> optimizer_;
  std::unique_ptr<StepGraph> step_graph_;  // the schedule as one CUDA graph where it is static
  std::vector<torch::Tensor>
      checkpoint_blocks_;  // GPU workers: the page-locked host copy of the last checkpoint, reused
  int64_t step_ = 0;
  bool torn_ = false;
  StepMemory last_step_memory_;
  double last_grad_norm_ = 0;
};

}  // namespace strata::worker
