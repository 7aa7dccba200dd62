// A parameter unit: what a rank gathers, shards and updates together - the embedding, one block,
// the head (stage_model.h builds them; zero3_shards.h gathers and reduce-scatters them; the
// optimizer, optimizer.h, updates them). Its parameters live in one flat fp32 tensor and their
// gradients in another, so a unit costs one collective and ZeRO shards are plain ranges.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace strata::worker {

struct ParamUnit {
  std::string label;                         // "embed", "block 3", "head", "wte (tied copy)"
  std::vector<std::string> names;            // the model's parameter names
  std::vector<std::vector<int64_t>> shapes;  // this rank's tensor-parallel slices
  std::vector<std::vector<int64_t>> full_shapes;
  std::vector<int64_t> offsets;  // of each parameter in the unit's flat vector
  std::vector<bool> replicated;  // the same on every tensor-parallel rank
  // Replicated, but its gradient here is only this rank's part, summed over the tensor-parallel
  // ranks before the update (optimizer.h): under sequence parallelism, what is read with this
  // rank's tokens only (a block's norms and the biases added after its reduce-scatters, the final
  // norm); on any tp > 1, a weight every head shares (qwen3's q/k norms), read with this rank's
  // heads only (shard::HeadSharedWeight).
  std::vector<bool> tp_partial;
  // Split by output rows (shard::ColumnParallel). Read through ParamView::Linear, such a matrix
  // reads f's output: its weight gradient can wait for f's backward.
  std::vector<bool> column_parallel;
  int64_t numel = 0;
  int64_t shard_begin = 0, shard_end = 0;  // this data-parallel rank's range of the flat vector
  bool sharded = false;                    // ZeRO-3: `flat` holds [shard_begin, shard_end) only
  bool tied_copy = false;                  // GPT-2's wte on the last stage (the first stage's is the one counted)
  // offload = "optimizer+params": `flat` (this rank's shard) lives in pinned host memory, is no
  // autograd leaf and has no gradient of its own (each use's gradient goes to SetHostGradient).
  bool on_host = false;
  // fp32. ZeRO-3: this rank's shard, a leaf whose gradient is the shard's. Otherwise the whole
  // vector, aliased by one leaf per parameter (`params`), whose gradients are views of `grad`.
  torch::Tensor flat;
  std::vector<torch::Tensor> params;
  torch::Tensor grad;
  // Gradient sink (units that are neither ZeRO-3 shards nor recomputed, nor a one-stage tied
  // embedding, which stays with AccumulateGrad: stage_model.cc says why): every use of a
  // parameter goes through a function whose backward writes the step's first gradient of it
  // into `grad` and adds the later ones, in place of autograd's AccumulateGrad. So `grad` needs
  // no zeroing between steps, and no gradient is widened to fp32 and added to a zero buffer.
  bool sink = false;
  std::vector<int> received;  // this step's gradients per parameter so far (sink units)
  std::vector<int> uses;      // this step's forward uses per parameter so far (sink units)
  // The bf16 working copy of `flat` that the matmuls of a CUDA bf16 run read (sink units, and
  // ZeRO-3 shards without recompute, whose copy is what is gathered; refreshed after every
  // update, StageModel::RefreshWorkingWeights), in place of autograd's cast of every fp32 weight
  // at every use. Undefined otherwise.
  torch::Tensor working;
  std::vector<torch::Tensor> working_params;  // its per-parameter views, made once
};

// Views of `flat` (the unit's whole flat vector, or a buffer laid out as it: a gathered copy, the
// gradient, the bf16 working copy), one per parameter, shaped as this rank's slices.
inline std::vector<torch::Tensor> UnitViews(const ParamUnit& unit, const torch::Tensor& full_flat) {
  std::vector<torch::Tensor> views;
  for (size_t i = 0; i < unit.names.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : unit.shapes[i]) n *= d;
    views.push_back(full_flat.narrow(0, unit.offsets[i], n).view(unit.shapes[i]));
  }
  return views;
}

}  // namespace strata::worker
