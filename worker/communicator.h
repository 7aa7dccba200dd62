// Communicator: collectives among the ranks of one task. Implementations: ZeroMQ (CPU workers,
// here) and NCCL (GPU workers, later) behind the same interface. All ranks must call the same
// collectives in the same order. Not thread-safe, except Abort().
#pragma once

#include <zmq.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual uint32_t rank() const = 0;
  virtual uint32_t world_size() const = 0;
  // Element-wise sum of `count` floats over all ranks, in place. Every rank ends with identical
  // bytes. Returns Aborted after Abort(), DeadlineExceeded if a peer stays silent too long.
  virtual Status AllReduceSum(float* data, size_t count) = 0;
  // Makes the pending and every later call return Aborted (a failed run never hangs its peers).
  virtual void Abort() = 0;
};

struct ZmqCommunicatorOptions {
  uint32_t rank = 0;
  std::vector<std::string> peer_addresses;  // data-plane address of every rank, by rank
  uint64_t task_token = 0;                  // frames carrying another token are stale: dropped
  int peer_timeout_ms = 120000;             // how long to wait for a peer before giving up
};

// Binds this rank's address (peer_addresses[rank]) and connects to its ring neighbour.
Result<std::unique_ptr<Communicator>> CreateZmqCommunicator(zmq::context_t& context, const ZmqCommunicatorOptions& options);

}  // namespace strata::worker
