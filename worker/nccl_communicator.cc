// NCCL collectives for GPU workers (built only against a CUDA LibTorch). Buffers are device
// memory; every operation is enqueued on the calling thread's current CUDA stream, so it orders
// with the compute around it without a host sync.
//
// Bootstrap: rank 0 makes the NCCL unique id and broadcasts it over the task's ZeroMQ world
// (which the coordinator set up with every rank's address), then every rank joins. Groups are
// ncclCommSplit of the world, called by every rank in the same order.
//
// Uneven buffers: NCCL's in-place reduce-scatter and all-gather need count % n == 0. Otherwise
// reduce-scatter falls back to an all-reduce (every block defined, a superset of the contract) and
// all-gather to "zero what is not mine, then all-reduce" (x + 0 is exact).
//
// Point-to-point (pipeline stages) runs on a stream of its own per communicator: a blocking send
// of micro-batch i+1 must not wait behind the receive of micro-batch i's gradient on the compute
// stream (1F1B would deadlock with large messages). The compute stream waits for each transfer
// to finish, so buffers are never reused early. The trainer gives each direction its own
// communicator, so each keeps one order of operations on every rank.
#include "worker/nccl_communicator.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace strata::worker {
namespace {

Status NcclStatus(ncclResult_t result, ncclComm_t comm, const char* what) {
  if (result == ncclSuccess || result == ncclInProgress) return Status::Ok();
  std::string detail = ncclGetErrorString(result);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) detail += std::string(": ") + last;
  }
  return Unavailable(std::string("NCCL ") + what + " failed: " + detail);
}

// What the world and its groups share: the aborted flag and every live NCCL communicator, so
// Abort() from any thread (the executor's cancel watcher) aborts them all: ncclCommAbort makes
// kernels stuck waiting for a dead peer return, so a failed run never hangs its survivors.
struct NcclShared {
  std::atomic<bool> aborted{false};
  std::mutex mutex;
  std::vector<ncclComm_t*> comms;  // guarded by mutex; entries are set to null once aborted
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, uint32_t rank, uint32_t world, int device, std::shared_ptr<NcclShared> shared)
      : comm_(comm), rank_(rank), world_(world), device_(device), aborted_(std::move(shared)) {
    std::lock_guard<std::mutex> lock(aborted_->mutex);
    aborted_->comms.push_back(&comm_);
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(aborted_->mutex);
      auto& comms = aborted_->comms;
      comms.erase(std::remove(comms.begin(), comms.end(), &comm_), comms.end());
      if (comm_) {
        if (aborted_->aborted.load()) {
          ncclCommAbort(comm_);
        } else {
          ncclCommDestroy(comm_);
        }
      }
    }
    if (p2p_stream_) cudaStreamDestroy(p2p_stream_);
    if (p2p_done_) cudaEventDestroy(p2p_done_);
    if (compute_ready_) cudaEventDestroy(compute_ready_);
  }

  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return world_; }
  bool device_buffers() const override { return true; }
  void Abort() override {
    std::lock_guard<std::mutex> lock(aborted_->mutex);
    aborted_->aborted.store(true);
    for (ncclComm_t* comm : aborted_->comms) {
      if (*comm) ncclCommAbort(*comm);
      *comm = nullptr;
    }
  }

  Status AllReduceSum(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    return NcclStatus(ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, Stream()), comm_, "all-reduce");
  }

  Status ReduceScatterSum(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    if (count % world_ != 0) return AllReduceSum(data, count);
    const size_t block = count / world_;
    return NcclStatus(ncclReduceScatter(data, data + rank_ * block, block, ncclFloat, ncclSum, comm_, Stream()), comm_,
                      "reduce-scatter");
  }

  Status AllGather(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    if (count % world_ != 0) {
      const auto [begin, end] = ShardRange(count, world_, rank_);
      cudaStream_t stream = Stream();
      if (cudaMemsetAsync(data, 0, begin * sizeof(float), stream) != cudaSuccess ||
          cudaMemsetAsync(data + end, 0, (count - end) * sizeof(float), stream) != cudaSuccess) {
        return Internal("cudaMemsetAsync failed before an uneven all-gather");
      }
      return AllReduceSum(data, count);
    }
    const size_t block = count / world_;
    return NcclStatus(ncclAllGather(data + rank_ * block, data, block, ncclFloat, comm_, Stream()), comm_, "all-gather");
  }

  Status Broadcast(float* data, size_t count, uint32_t root) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (root >= world_) return InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank");
    if (world_ == 1) return Status::Ok();
    return NcclStatus(ncclBroadcast(data, data, count, ncclFloat, static_cast<int>(root), comm_, Stream()), comm_, "broadcast");
  }

  Status Send(const void* data, size_t bytes, uint32_t peer) override {
    return PointToPoint([&](cudaStream_t s) { return ncclSend(data, bytes, ncclUint8, static_cast<int>(peer), comm_, s); },
                        "send");
  }

  Status Recv(void* data, size_t bytes, uint32_t peer) override {
    return PointToPoint([&](cudaStream_t s) { return ncclRecv(data, bytes, ncclUint8, static_cast<int>(peer), comm_, s); },
                        "recv");
  }

  Result<std::unique_ptr<Communicator>> Split(const std::vector<std::vector<uint32_t>>& groups) override {
    STRATA_RETURN_IF_ERROR(Ready());
    int color = -1, key = 0;
    uint32_t size = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].size(); ++i) {
        if (groups[g][i] != rank_) continue;
        color = static_cast<int>(g);
        key = static_cast<int>(i);
        size = static_cast<uint32_t>(groups[g].size());
      }
    }
    if (color < 0) return InvalidArgument("split: rank " + std::to_string(rank_) + " is in none of the groups");
    c10::cuda::CUDAGuard guard(device_);
    ncclComm_t sub = nullptr;
    STRATA_RETURN_IF_ERROR(NcclStatus(ncclCommSplit(comm_, color, key, &sub, nullptr), comm_, "communicator split"));
    return std::unique_ptr<Communicator>(
        std::make_unique<NcclCommunicator>(sub, static_cast<uint32_t>(key), size, device_, aborted_));
  }

 private:
  Status Ready() const { return aborted_->aborted.load() ? Aborted("communicator aborted") : Status::Ok(); }
  cudaStream_t Stream() const { return c10::cuda::getCurrentCUDAStream(device_).stream(); }

  template <typename Op>
  Status PointToPoint(Op op, const char* what) {
    STRATA_RETURN_IF_ERROR(Ready());
    if (!p2p_stream_) {
      if (cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&p2p_done_, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming) != cudaSuccess) {
        return Internal("cannot create the point-to-point CUDA stream");
      }
    }
    cudaStream_t compute = Stream();
    cudaEventRecord(compute_ready_, compute);       // the buffer is written (send) or allocated (recv)
    cudaStreamWaitEvent(p2p_stream_, compute_ready_, 0);
    STRATA_RETURN_IF_ERROR(NcclStatus(op(p2p_stream_), comm_, what));
    cudaEventRecord(p2p_done_, p2p_stream_);
    cudaStreamWaitEvent(compute, p2p_done_, 0);     // nothing on compute touches the buffer before
    return Status::Ok();
  }

  ncclComm_t comm_;
  uint32_t rank_, world_;
  int device_;
  std::shared_ptr<NcclShared> aborted_;  // shared by the world and its groups
  cudaStream_t p2p_stream_ = nullptr;
  cudaEvent_t p2p_done_ = nullptr, compute_ready_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device) {
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0, "the id travels as floats");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0) STRATA_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, "unique id"));
  // The ZeroMQ broadcast copies bytes, so the id arrives bit for bit.
  STRATA_RETURN_IF_ERROR(bootstrap.Broadcast(reinterpret_cast<float*>(&id), sizeof(id) / sizeof(float), 0));
  c10::cuda::CUDAGuard guard(device);
  ncclComm_t comm = nullptr;
  STRATA_RETURN_IF_ERROR(NcclStatus(
      ncclCommInitRank(&comm, static_cast<int>(bootstrap.world_size()), id, static_cast<int>(bootstrap.rank())), nullptr,
      "init"));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      comm, bootstrap.rank(), bootstrap.world_size(), device, std::make_shared<NcclShared>()));
}

}  // namespace strata::worker
