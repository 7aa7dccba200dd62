// Tensors between ranks: collectives on fp32 tensors of any device (host staging where the
// communicator needs host buffers) and a pipeline stage's sends and receives.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "worker/comm/communicator.h"

namespace strata::worker {

// Collectives on fp32 tensors of any device: host staging when the communicator needs host
// buffers. Throw std::runtime_error on failure (they run inside autograd).
void AllReduceTensor(Communicator& comm, torch::Tensor& t);
void ReduceScatterTensor(Communicator& comm, torch::Tensor& t);
void AllGatherTensor(Communicator& comm, torch::Tensor& t);
// Out of place (no copy of this rank's share where the communicator reads and writes the buffers
// directly): `block` gets this rank's share of the sum of `t` (left undefined); `full` gets every
// rank's `mine` (fp32 or bf16; its share, ShardRange).
void ReduceScatterTensorTo(Communicator& comm, torch::Tensor& t, torch::Tensor& block);
void AllGatherTensorFrom(Communicator& comm, const torch::Tensor& mine, torch::Tensor& full);
void SendTensor(Communicator& comm, const torch::Tensor& t, uint32_t peer);

// A pipeline stage's sends in one direction (activations forward, their gradients backward) from
// a ring of reused fp32 buffers. Where the communicator sends on a transfer stream of its own
// (NCCL), the compute stream goes on while a send runs, so a buffer is written again only after
// its last send is done (the compute stream waits for that, not the host). Reused, not dropped:
// a buffer dropped while the transfer stream still reads it would stay out of the allocator until
// a CUDA graph's capture ends (step_graph.h), one per micro-batch. Elsewhere it is SendTensor.
class PipelineSender {
 public:
  // `slots`: buffers in the ring (the most sends in flight, plus one).
  PipelineSender(Communicator* comm, size_t slots);
  ~PipelineSender();
  PipelineSender(const PipelineSender&) = delete;
  PipelineSender& operator=(const PipelineSender&) = delete;

  void Send(const torch::Tensor& t, uint32_t peer);
  // At the end of a step's schedule: the calling thread's current stream waits for every send
  // (a CUDA graph's capture must join the transfer stream), and the ring forgets its sends.
  void Join(const torch::Device& device);
  // After a refused CUDA-graph capture (step_graph.h): its sends never ran; their events are dropped.
  void Forget();

 private:
  struct Slot;
  Communicator* comm_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};
torch::Tensor RecvTensor(Communicator& comm, const std::vector<int64_t>& shape, const torch::Device& device,
                         uint32_t peer);

}  // namespace strata::worker
