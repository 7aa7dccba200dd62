// Activation capture of one extract task (internal to worker/, includes LibTorch).
//
// Chunks are fixed row ranges of the data: with S sequences of T tokens captured and B =
// extract.batch, chunk c holds sequences [c B, min((c + 1) B, S)), i.e. token rows
// [c B T, min((c + 1) B, S) T). For every chunk of the task not already in the store:
//   forward micro-batches of up to `micro` sequences through blocks 0..max(extract.layers),
//   copy each asked (layer, site) output to the host as [rows, hidden] in the stored dtype,
//   and hand the whole chunk to a writer thread that stores it (ShardStore::PutActivationChunk)
//   and reports it to the coordinator.
// The queue to the writer holds at most kMaxQueuedChunks chunks, so host memory stays bounded
// (queued + the one being written + the one being built) while the device computes the next
// chunk as the previous one is written.
// Out of memory on the device: the micro-batch is halved and the same sequences retried (the
// chunk boundaries do not move); the smaller micro-batch is kept for the rest of the task and
// each change is reported as an "oom" notice. Sequences are independent in a causal LM, so the
// stored rows do not depend on the micro-batch that computed them (up to kernel choice on GPU).
#pragma once

#include <torch/torch.h>

#include "worker/causal_lm.h"
#include "worker/task.h"
#include "worker/token_data.h"

namespace strata::worker {

class Extractor {
 public:
  Extractor(const TaskContext& context, TokenData data, torch::Device device);

  // Captures every chunk of context.chunks; Aborted when cancelled between micro-batches.
  Status Run();

  // The micro-batch in use now (sequences per forward): extract.batch, halved by each OOM.
  int64_t micro_batch() const { return micro_batch_; }

 private:
  struct Chunk {
    storage::ActivationChunkInfo info;
    std::vector<std::pair<int64_t, std::string>> names;  // (layer, site) of each tensor
    std::vector<torch::Tensor> tensors;                  // host, contiguous, [rows, hidden]
  };
  Result<Chunk> Compute(uint64_t chunk);
  // One forward of sequences [begin, end) -> host tensors per asked (layer, site), in order.
  std::vector<torch::Tensor> Forward(int64_t begin, int64_t end);

  const TaskContext& context_;
  TokenData data_;
  torch::Device device_;
  std::shared_ptr<CausalLm> model_;
  Status init_status_;
  int64_t sequences_ = 0;  // captured sequences in total (all chunks of the run)
  int64_t micro_batch_ = 1;
  torch::ScalarType stored_type_ = torch::kFloat;
};

}  // namespace strata::worker
