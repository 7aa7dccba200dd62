// Activation capture of one extract task (internal to worker/, includes LibTorch).
//
// Chunks are fixed row ranges of the data: with S sequences of T tokens captured and B =
// extract.batch, chunk c holds sequences [c B, min((c + 1) B, S)), i.e. token rows
// [c B T, min((c + 1) B, S) T). For every chunk of the task not already in the store:
//   forward micro-batches of up to `micro` sequences through blocks 0..max(extract.layers),
//   copy each asked (layer, site) record to the host as [rows, row shape...] in its stored dtype
//   (ExtractRows in causal_lm.h: per-block sites, and at the last layer the final norm, logits
//   and - patch runs, whose blocks run with their sites replaced - the per-row loss),
//   and hand the whole chunk to a writer thread that stores it (ShardStore::PutActivationChunk,
//   with its token record: id, document and position per row) and reports it to the coordinator.
// Before the first chunk the run record (layers, sites, row shapes, rows) goes to the store, so a
// store alone can be read (activations/reader.h, OpenStores).
// The queue to the writer holds at most kMaxQueuedChunks chunks, so host memory stays bounded
// (queued + the one being written + the one being built) while the device computes the next
// chunk as the previous one is written.
// Out of memory on the device: the micro-batch is halved and the same sequences retried (the
// chunk boundaries do not move); the smaller micro-batch is kept for the rest of the task and
// each change is reported as an "oom" notice. Sequences are independent in a causal LM, so the
// stored rows do not depend on the micro-batch that computed them (up to kernel choice on GPU).
//
// Execution (extract.mode, "auto" decides from the device's free memory - see ChooseMode):
//   whole      the model sits on the device; each chunk runs through every block at once.
//   layerwise  for a model larger than the device: weights stay in host memory and visit the
//              device one part at a time. Chunks go in groups sized to a host-memory budget:
//              embed every chunk of the group, then for each block b: move b to the device, push
//              every micro-batch's hidden state through it (host -> device -> host), keep what is
//              asked, move b back. Weight traffic is (model bytes) per group, not per batch. The
//              group's chunks are stored after its last block. Same maths as whole, so on CPU the
//              stored bytes are identical.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "worker/nn/causal_lm.h"
#include "worker/task.h"
#include "worker/token_data.h"

namespace strata::worker {

class Extractor {
 public:
  // `device_memory`: what the device has (free = what this task may use). An error when the
  // model cannot be built or read from model.init_from.
  static Result<std::unique_ptr<Extractor>> Create(const TaskContext& context, TokenData data, torch::Device device,
                                                   MemorySnapshot device_memory);

  // Captures every chunk of context.chunks; Aborted when cancelled between micro-batches.
  Status Run();

  // The micro-batch in use now (sequences per forward): extract.batch, halved by each OOM.
  int64_t micro_batch() const { return micro_batch_; }

 private:
  Extractor(const TaskContext& context, TokenData data, torch::Device device, MemorySnapshot device_memory);
  Status Init();  // Create's work after the members are in place

  struct Chunk {
    storage::ActivationChunkInfo info;
    std::vector<std::pair<int64_t, std::string>> names;  // (layer, site) of each tensor
    std::vector<torch::Tensor> tensors;                  // host, contiguous, [rows, row shape...]
  };
  // kWhole or kLayerwise, with the numbers behind the choice (reported as a "plan" event).
  std::pair<ExtractMode, std::string> ChooseMode() const;
  Result<Chunk> Compute(uint64_t chunk);
  // Layerwise: computes `chunks` (all not yet stored) and hands each to `push` in order.
  Status ComputeLayerwise(const std::vector<uint64_t>& chunks, const std::function<bool(Chunk)>& push);
  Chunk NewChunk(uint64_t chunk_index) const;
  // What the store keeps of the run beside its chunks (ShardStore::PutActivationRun).
  storage::ActivationRunInfo RunRecord() const;
  // The chunk's token record: per row (token id, document, position), storage::kActivationTokensSite.
  Result<std::vector<int64_t>> TokenRows(const storage::ActivationChunkInfo& chunk) const;
  // data.documents' start offsets into document_starts_ (none without it: a sequence is a document).
  Status LoadDocumentStarts();
  torch::Tensor ToHost(const torch::Tensor& t) const;  // pinned on CUDA, contiguous
  // Sequences [begin, end) of the data: [end - begin, sequence] int64 ids on the host.
  Result<torch::Tensor> Tokens(int64_t begin, int64_t end) const;
  // One forward of `tokens` (from Tokens) -> host tensors per asked (layer, site), in order.
  std::vector<torch::Tensor> Forward(const torch::Tensor& tokens);

  const TaskContext& context_;
  TokenData data_;
  torch::Device device_;
  std::shared_ptr<CausalLm> model_;
  MemorySnapshot device_memory_;
  torch::ScalarType compute_type_ = torch::kFloat;
  // ChooseMode's (whole or layerwise) and why, decided before the weights are placed.
  ExtractMode mode_ = ExtractMode::kWhole;
  std::string mode_reason_;
  int64_t sequences_ = 0;  // captured sequences in total (all chunks of the run)
  int64_t micro_batch_ = 1;
  torch::ScalarType stored_type_ = torch::kFloat;
  std::vector<uint64_t> document_starts_;  // data.documents, ascending; empty without it
};

}  // namespace strata::worker
