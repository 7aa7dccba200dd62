// A communicator whose peers are this rank's copies, for GPU tests on a machine with one GPU (the
// seam a second GPU would fill). Every other rank of a group is taken to hold what this rank holds
// - its data, gradients, shards and activations - so each collective is a device op on the calling
// thread's current stream where NCCL's kernel would run: a sum multiplies by the group's size, a
// gather repeats this rank's block in every block. What it exercises is the stream order around
// the step's collectives - side streams, their joins, CUDA graph capture - with real device work
// in the collectives' places, which a host-staged ZeroMQ run cannot capture. Each collective
// first marks what it will write as NaN and waits about 20 us on its stream: a read that does not
// wait for it shows in the losses. Its losses are not a
// real mesh's: a ZeRO shard or tensor-parallel slice of another rank is replaced by this one's.
// Pipeline stages need a peer to send to: Send and Recv are refused.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "worker/comm/communicator.h"

namespace strata::worker {

std::unique_ptr<Communicator> CreateMirrorCommunicator(uint32_t world, uint32_t rank, torch::Device device);

}  // namespace strata::worker
