// Communicator: collectives and point-to-point transfers among the ranks of one task, or of a
// group of them (Split: the data-parallel, tensor-parallel and pipeline groups of a mesh).
// Implementations: ZeroMQ (CPU workers, host buffers) and NCCL (GPU workers, device buffers)
// behind the same interface. All ranks of a group must call the same collectives in the same
// order. Not thread-safe, except Abort(), which also aborts every group split from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/status.h"

namespace strata::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual uint32_t rank() const = 0;
  virtual uint32_t world_size() const = 0;
  // Every collective returns Aborted after Abort(), DeadlineExceeded if a peer stays silent too
  // long. Buffers of `count` floats are split into world_size() blocks, rank r owning
  // ShardRange(count, world_size(), r) (the ZeRO shard of rank r).

  // Element-wise sum of `count` floats over all ranks, in place. Every rank ends with identical
  // bytes.
  virtual Status AllReduceSum(float* data, size_t count) = 0;
  // Element-wise sum, in place, of which only this rank's block is defined afterwards (the
  // others hold partial sums). Half the traffic of an all-reduce.
  virtual Status ReduceScatterSum(float* data, size_t count) = 0;
  // Every rank contributes its own block of `data`; afterwards every rank holds all blocks.
  virtual Status AllGather(float* data, size_t count) = 0;
  // The same over 16-bit elements (bf16 parameters gathered for the compute, ZeRO-3): blocks as
  // above, counted in elements.
  virtual Status AllGather16(uint16_t* data, size_t count) = 0;
  // Sums of bf16 elements (tensor-parallel activations of a bf16 run: half the bytes of widening
  // them to fp32), each partial sum rounded to bf16 as the ring or tree forms it (NCCL's bf16 sum;
  // the ZeroMQ ring's). In place, as AllReduceSum; and out of place, as ReduceScatterSumTo.
  virtual Status AllReduceSumBf16(uint16_t* data, size_t count) = 0;
  virtual Status ReduceScatterSumBf16To(uint16_t* data, uint16_t* block, size_t count) = 0;
  // Copies `root`'s `count` floats to every rank.
  virtual Status Broadcast(float* data, size_t count, uint32_t root) = 0;
  // Out of place, where an implementation can save the copy (NCCL): `block` (this rank's block's
  // length) gets this rank's block of the sum of every rank's `data`, whose contents are then
  // undefined; and `data` gets every rank's `mine` (its block). The defaults run the in-place
  // collective and copy with memcpy: host buffers only (a device-buffer communicator overrides).
  virtual Status ReduceScatterSumTo(float* data, float* block, size_t count);
  virtual Status AllGatherFrom(const float* mine, float* data, size_t count);
  virtual Status AllGather16From(const uint16_t* mine, uint16_t* data, size_t count);
  // Point-to-point, for pipeline stages: `bytes` bytes to / from rank `peer` of this group.
  // Sends are buffered (ZeroMQ) or stream-ordered (NCCL): a send never waits for its receive.
  // NCCL: a send runs on transfer_stream() after the work the calling thread's current stream has
  // queued so far, and that stream does not wait for it - the caller keeps the buffer's memory
  // from reuse until the transfer stream has passed it (the caching allocator's record_stream);
  // a receive's buffer is ready for the current stream's later work.
  virtual Status Send(const void* data, size_t bytes, uint32_t peer) = 0;
  virtual Status Recv(void* data, size_t bytes, uint32_t peer) = 0;
  // The CUDA stream (cudaStream_t) sends run on; null where a send copies its buffer at once.
  virtual void* transfer_stream() { return nullptr; }
  // Every rank calls Split with the same partition of this communicator's ranks (each rank in
  // exactly one group); returns the communicator of this rank's group, ranked by position in it.
  virtual Result<std::unique_ptr<Communicator>> Split(const std::vector<std::vector<uint32_t>>& groups) = 0;
  // Where buffers passed to this communicator live: device memory (NCCL) or host memory.
  virtual bool device_buffers() const { return false; }
  // Makes the pending and every later call return Aborted (a failed run never hangs its peers).
  virtual void Abort() = 0;
  // The error the next collective would return (Aborted, DeadlineExceeded), or OK. A caller that
  // synced with work the communicator enqueued asynchronously (NCCL) calls it to learn whether that
  // work was whole or cut short by an abort.
  virtual Status Check() const { return Status::Ok(); }
  // The world rank this one gave up waiting for (a receive or the task's start-up handshake ran
  // past its deadline), or -1: the watchdog's answer to "who did not arrive".
  virtual int64_t missing_peer() const { return -1; }
};

// For the stage model's collectives on tensors (worker/train/stage_model.h, tensor_parallel.h), which run
// inside autograd, where a failure can only leave as an exception: throws std::runtime_error
// carrying the status.
inline void ThrowIfFailed(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

// [begin, end) of rank's block of a `count`-element buffer split over `world` ranks (sizes differ
// by at most one element).
inline std::pair<size_t, size_t> ShardRange(size_t count, uint32_t world, uint32_t rank) {
  return {count * rank / world, count * (rank + 1) / world};
}

inline Status Communicator::ReduceScatterSumTo(float* data, float* block, size_t count) {
  STRATA_RETURN_IF_ERROR(ReduceScatterSum(data, count));
  const auto [begin, end] = ShardRange(count, world_size(), rank());
  if (end > begin) std::memcpy(block, data + begin, (end - begin) * sizeof(float));
  return Status::Ok();
}

// `mine` into this rank's block of `data` (host buffers), for the in-place gather after it.
template <typename T>
void PlaceOwnBlock(const T* mine, T* data, size_t count, uint32_t world, uint32_t rank) {
  const auto [begin, end] = ShardRange(count, world, rank);
  if (end > begin && data + begin != mine) std::memmove(data + begin, mine, (end - begin) * sizeof(T));
}

inline Status Communicator::AllGatherFrom(const float* mine, float* data, size_t count) {
  PlaceOwnBlock(mine, data, count, world_size(), rank());
  return AllGather(data, count);
}

inline Status Communicator::AllGather16From(const uint16_t* mine, uint16_t* data, size_t count) {
  PlaceOwnBlock(mine, data, count, world_size(), rank());
  return AllGather16(data, count);
}

struct ZmqCommunicatorOptions {
  uint32_t rank = 0;
  std::vector<std::string> peer_addresses;  // data-plane address of every rank, by rank
  uint64_t task_token = 0;                  // frames carrying another token are stale: dropped
  int peer_timeout_ms = 120000;             // how long to wait for a peer before giving up
  // Required when the addresses are tcp://: this rank's inbound socket becomes a CURVE server
  // with curve->own that admits only curve->authorized, and it reaches its neighbour as a CURVE
  // client with the server key carried in the neighbour's address (see curve::AddressWithKey).
  // ZAP: the communicator then creates its own ZeroMQ context (ignoring `context`), whose ZAP
  // handler the task thread serves while it waits for chunks. The worker's control context has
  // no server socket, so it needs no ZAP handler; a fresh context per task never has to rebind
  // inproc://zeromq.zap.01, and the handler is owned by the thread that owns the data sockets.
  std::optional<curve::ClientKeys> curve;
};

// Binds this rank's address (peer_addresses[rank]); connects to a peer when it first sends there.
Result<std::unique_ptr<Communicator>> CreateZmqCommunicator(zmq::context_t& context,
                                                            const ZmqCommunicatorOptions& options);

// A world of one rank (every collective is a no-op), for single-device tools and benchmarks.
std::unique_ptr<Communicator> CreateSoloCommunicator();

}  // namespace strata::worker
