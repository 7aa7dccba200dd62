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
//
// Hang watchdog: an NCCL call returns once enqueued, so a collective whose peer never comes blocks
// whatever later waits on the stream (a loss read, a host copy), with no deadline of its own. Every
// operation records a CUDA event after itself; a watchdog thread per world polls the oldest
// unfinished one, and when it is older than the deadline (or NCCL reports an asynchronous error)
// it marks the world timed out and aborts every communicator of it, which makes the stuck kernels
// return. Every later call, and Check(), then returns DeadlineExceeded with what timed out. NCCL
// cannot say which rank did not arrive; the coordinator works that out from which ranks report a
// stall of their own (schema Stalled.rankKnown).
#include "worker/comm/nccl_communicator.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "common/log.h"
#include "common/net.h"
#include "common/thread_annotations.h"

namespace strata::worker {
namespace {

// Where a failed call is: the file's name (not the build machine's path) and its line.
std::string CallSite(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

Status NcclStatus(ncclResult_t result, ncclComm_t comm, const char* what, const char* file, int line) {
  if (result == ncclSuccess || result == ncclInProgress) return Status::Ok();
  std::string detail = ncclGetErrorString(result);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) detail += std::string(": ") + last;
  }
  return Unavailable(std::string("NCCL ") + what + " failed (" + CallSite(file, line) + "): " + detail);
}

Status CudaStatus(cudaError_t result, const char* call, const char* file, int line) {
  if (result == cudaSuccess) return Status::Ok();
  return Internal(std::string(call) + " failed (" + CallSite(file, line) + "): " + cudaGetErrorString(result));
}

// A CUDA call whose failure cannot be returned (a destructor, the watchdog): logged with its site.
void LogIfCudaFailed(cudaError_t result, const char* call, const char* file, int line) {
  if (result != cudaSuccess) {
    STRATA_LOG(kWarn) << call << " failed (" << CallSite(file, line) << "): " << cudaGetErrorString(result);
  }
}

// Every NCCL and CUDA call is checked, naming the call and its file:line.
#define STRATA_NCCL_STATUS(call, comm, what) NcclStatus((call), (comm), (what), __FILE__, __LINE__)
#define STRATA_CUDA_STATUS(call) CudaStatus((call), #call, __FILE__, __LINE__)
#define STRATA_CUDA_LOG(call) LogIfCudaFailed((call), #call, __FILE__, __LINE__)
// A collective enqueued on the compute stream (NcclCommunicator::Tracked).
#define STRATA_TRACKED(call, what) Tracked((call), (what), __FILE__, __LINE__)

// What the world and its groups share: the aborted flag, every live NCCL communicator (so Abort()
// from any thread, the executor's cancel watcher or the watchdog, aborts them all: ncclCommAbort
// makes kernels stuck waiting for a dead peer return, so a failed run never hangs its survivors),
// and the watchdog's queue of operations not yet seen finished.
class NcclShared {
 public:
  NcclShared(int device, int timeout_ms, std::function<void(const std::string&)> on_timeout)
      : device_(device), timeout_ms_(timeout_ms), on_timeout_(std::move(on_timeout)) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~NcclShared() {
    stop_.store(true);
    watchdog_.join();
    for (const Pending& p : pending_) STRATA_CUDA_LOG(cudaEventDestroy(p.done));
    for (cudaEvent_t e : free_events_) STRATA_CUDA_LOG(cudaEventDestroy(e));
  }

  void Add(ncclComm_t* comm) STRATA_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    comms_.push_back(comm);
  }
  // Destroys (or, after an abort, aborts) the communicator and forgets it.
  void Remove(ncclComm_t* comm) STRATA_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
    if (*comm && aborted_.load()) {
      ncclCommAbort(*comm);
    } else if (*comm) {
      ncclCommDestroy(*comm);
    }
    *comm = nullptr;
  }

  void Abort() STRATA_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    AbortLocked();
  }

  // Aborted after Abort(), DeadlineExceeded after the watchdog fired, else OK. Never waits for
  // mutex_, which an abort that does not return keeps.
  Status Check() STRATA_EXCLUDES(reason_mutex_) {
    if (!aborted_.load()) return Status::Ok();
    MutexLock lock(reason_mutex_);
    return timed_out_.empty() ? Aborted("communicator aborted") : DeadlineExceeded(timed_out_);
  }

  // Called right after an operation was enqueued on `stream`: the watchdog starts its clock. An
  // operation captured into a CUDA graph (step_graph.h) is not run now and its event could not be
  // queried; a replay is watched through what the host waits for after it (the loss's
  // all-reduce, queued behind the replay on the same stream).
  void Track(cudaStream_t stream, const char* what, uint32_t rank) STRATA_EXCLUDES(mutex_) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return;
    cudaEvent_t done = nullptr;
    {
      MutexLock lock(mutex_);
      if (!free_events_.empty()) {
        done = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (!done && cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess)
      return;                                            // unwatched, not wrong
    if (cudaEventRecord(done, stream) != cudaSuccess) {  // unwatched: the collective's own result says why
      (void)cudaGetLastError();
      MutexLock lock(mutex_);
      free_events_.push_back(done);
      return;
    }
    MutexLock lock(mutex_);
    pending_.push_back({done, net::SteadyMs(), what, rank});
  }

 private:
  struct Pending {
    cudaEvent_t done;
    int64_t issued_ms;
    const char* what;
    uint32_t rank;  // in the communicator that issued it
  };

  void AbortLocked() STRATA_REQUIRES(mutex_) {
    aborted_.store(true);
    for (ncclComm_t* comm : comms_) {
      if (*comm) ncclCommAbort(*comm);
      *comm = nullptr;
    }
  }

  // Every later call fails with `why`, the task hears of it at once (it may be blocked on the very
  // collective), then the communicators are aborted (mutex_ held). That abort may itself never
  // return (a dead in-node peer); the worker then restarts its process on the next cancel.
  void Fire(const std::string& why) STRATA_REQUIRES(mutex_) STRATA_EXCLUDES(reason_mutex_) {
    {
      MutexLock lock(reason_mutex_);
      timed_out_ = why;
    }
    aborted_.store(true);
    if (on_timeout_) on_timeout_(why);
    AbortLocked();
  }

  void Watch() STRATA_EXCLUDES(mutex_) {
    STRATA_CUDA_LOG(cudaSetDevice(device_));  // event queries need this thread on the device's context
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      MutexLock lock(mutex_);
      if (aborted_.load()) continue;  // already aborted: nothing left to watch
      const int64_t now = net::SteadyMs();
      while (!pending_.empty()) {
        const Pending& oldest = pending_.front();
        const cudaError_t state = cudaEventQuery(oldest.done);
        if (state == cudaErrorNotReady) {
          if (now - oldest.issued_ms > timeout_ms_) {
            Fire(std::string("an NCCL ") + oldest.what + " of rank " + std::to_string(oldest.rank) + " issued " +
                 std::to_string((now - oldest.issued_ms) / 1000) + " s ago has not finished (deadline " +
                 std::to_string(timeout_ms_ / 1000) + " s, --peer-timeout-ms): a peer did not arrive or stalled");
          }
          break;
        }
        free_events_.push_back(oldest.done);  // finished (or failed: the call that waits on it sees that)
        pending_.pop_front();
      }
      for (ncclComm_t* comm : comms_) {
        ncclResult_t async = ncclSuccess;
        if (!*comm || ncclCommGetAsyncError(*comm, &async) != ncclSuccess) continue;
        if (async != ncclSuccess && async != ncclInProgress) {
          Fire(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async));
          break;
        }
      }
    }
  }

  const int device_;
  const int timeout_ms_;
  const std::function<void(const std::string&)> on_timeout_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> stop_{false};
  Mutex mutex_;
  std::vector<ncclComm_t*> comms_ STRATA_GUARDED_BY(mutex_);  // entries are set to null once aborted
  std::deque<Pending> pending_ STRATA_GUARDED_BY(mutex_);     // oldest first
  std::vector<cudaEvent_t> free_events_ STRATA_GUARDED_BY(mutex_);
  Mutex reason_mutex_;
  std::string timed_out_ STRATA_GUARDED_BY(reason_mutex_);  // why the watchdog aborted
  std::thread watchdog_;                                    // last: starts after everything it reads
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, uint32_t rank, uint32_t world, int device, std::shared_ptr<NcclShared> shared)
      : comm_(comm), rank_(rank), world_(world), device_(device), shared_(std::move(shared)) {
    shared_->Add(&comm_);
  }

  ~NcclCommunicator() override {
    shared_->Remove(&comm_);
    if (p2p_stream_) STRATA_CUDA_LOG(cudaStreamDestroy(p2p_stream_));
    if (p2p_done_) STRATA_CUDA_LOG(cudaEventDestroy(p2p_done_));
    if (compute_ready_) STRATA_CUDA_LOG(cudaEventDestroy(compute_ready_));
  }

  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return world_; }
  bool device_buffers() const override { return true; }
  void Abort() override { shared_->Abort(); }
  Status Check() const override { return shared_->Check(); }

  Status AllReduceSum(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    return STRATA_TRACKED(ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, Stream()), "all-reduce");
  }

  Status ReduceScatterSum(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    if (count % world_ != 0) return AllReduceSum(data, count);
    const size_t block = count / world_;
    return STRATA_TRACKED(ncclReduceScatter(data, data + rank_ * block, block, ncclFloat, ncclSum, comm_, Stream()),
                          "reduce-scatter");
  }

  Status AllGather(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    if (count % world_ != 0) {
      const auto [begin, end] = ShardRange(count, world_, rank_);
      cudaStream_t stream = Stream();
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaMemsetAsync(data, 0, begin * sizeof(float), stream)));
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaMemsetAsync(data + end, 0, (count - end) * sizeof(float), stream)));
      return AllReduceSum(data, count);
    }
    const size_t block = count / world_;
    return STRATA_TRACKED(ncclAllGather(data + rank_ * block, data, block, ncclFloat, comm_, Stream()), "all-gather");
  }

  Status AllGather16(uint16_t* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    if (count % world_ != 0) {  // as AllGather: zero what is not mine, then sum (x + 0 is exact in bf16 too)
      const auto [begin, end] = ShardRange(count, world_, rank_);
      cudaStream_t stream = Stream();
      STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaMemsetAsync(data, 0, begin * sizeof(uint16_t), stream)));
      STRATA_RETURN_IF_ERROR(
          STRATA_CUDA_STATUS(cudaMemsetAsync(data + end, 0, (count - end) * sizeof(uint16_t), stream)));
      return STRATA_TRACKED(ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, comm_, Stream()),
                            "all-gather (16-bit, uneven)");
    }
    const size_t block = count / world_;
    return STRATA_TRACKED(ncclAllGather(data + rank_ * block, data, block, ncclBfloat16, comm_, Stream()),
                          "all-gather (16-bit)");
  }

  Status AllReduceSumBf16(uint16_t* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (world_ == 1) return Status::Ok();
    return STRATA_TRACKED(ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, comm_, Stream()),
                          "all-reduce (bf16)");
  }

  Status ReduceScatterSumBf16To(uint16_t* data, uint16_t* block, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    const auto [begin, end] = ShardRange(count, world_, rank_);
    if (world_ == 1 || count % world_ != 0) {
      STRATA_RETURN_IF_ERROR(AllReduceSumBf16(data, count));
      return Copy(block, data + begin, (end - begin) * sizeof(uint16_t));
    }
    return STRATA_TRACKED(ncclReduceScatter(data, block, count / world_, ncclBfloat16, ncclSum, comm_, Stream()),
                          "reduce-scatter (bf16)");
  }

  // Out of place (communicator.h): NCCL reads `mine` / writes `block` directly, saving the copy
  // the in-place forms need. An uneven count takes the in-place fallback and one device copy.
  Status ReduceScatterSumTo(float* data, float* block, size_t count) override {
    STRATA_RETURN_IF_ERROR(Ready());
    const auto [begin, end] = ShardRange(count, world_, rank_);
    if (world_ == 1 || count % world_ != 0) {
      STRATA_RETURN_IF_ERROR(world_ == 1 ? Status::Ok() : AllReduceSum(data, count));
      return Copy(block, data + begin, (end - begin) * sizeof(float));
    }
    return STRATA_TRACKED(ncclReduceScatter(data, block, count / world_, ncclFloat, ncclSum, comm_, Stream()),
                          "reduce-scatter");
  }

  Status AllGatherFrom(const float* mine, float* data, size_t count) override {
    return AllGatherOutOfPlace(mine, data, count, ncclFloat, "all-gather");
  }

  Status AllGather16From(const uint16_t* mine, uint16_t* data, size_t count) override {
    return AllGatherOutOfPlace(mine, data, count, ncclBfloat16, "all-gather (16-bit)");
  }

  Status Broadcast(float* data, size_t count, uint32_t root) override {
    STRATA_RETURN_IF_ERROR(Ready());
    if (root >= world_) return InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank");
    if (world_ == 1) return Status::Ok();
    return STRATA_TRACKED(ncclBroadcast(data, data, count, ncclFloat, static_cast<int>(root), comm_, Stream()),
                          "broadcast");
  }

  Status Send(const void* data, size_t bytes, uint32_t peer) override {
    return PointToPoint(
        [&](cudaStream_t s) { return ncclSend(data, bytes, ncclUint8, static_cast<int>(peer), comm_, s); }, "send",
        /*compute_waits=*/false);
  }

  Status Recv(void* data, size_t bytes, uint32_t peer) override {
    return PointToPoint(
        [&](cudaStream_t s) { return ncclRecv(data, bytes, ncclUint8, static_cast<int>(peer), comm_, s); }, "recv",
        /*compute_waits=*/true);
  }

  void* transfer_stream() override {
    if (!p2p_stream_ && !CreateTransferStream().ok()) return nullptr;
    return p2p_stream_;
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
    STRATA_RETURN_IF_ERROR(
        STRATA_NCCL_STATUS(ncclCommSplit(comm_, color, key, &sub, nullptr), comm_, "communicator split"));
    return std::unique_ptr<Communicator>(
        std::make_unique<NcclCommunicator>(sub, static_cast<uint32_t>(key), size, device_, shared_));
  }

 private:
  Status Ready() const { return shared_->Check(); }
  template <typename T>
  Status AllGatherOutOfPlace(const T* mine, T* data, size_t count, ncclDataType_t type, const char* what) {
    STRATA_RETURN_IF_ERROR(Ready());
    const auto [begin, end] = ShardRange(count, world_, rank_);
    if (world_ == 1 || count % world_ != 0) {  // in place: the uneven fallback (above)
      if (data + begin != mine) STRATA_RETURN_IF_ERROR(Copy(data + begin, mine, (end - begin) * sizeof(T)));
      if constexpr (sizeof(T) == sizeof(uint16_t)) {
        return AllGather16(data, count);
      } else {
        return AllGather(data, count);
      }
    }
    return STRATA_TRACKED(ncclAllGather(mine, data, count / world_, type, comm_, Stream()), what);
  }
  // A device-to-device copy on the current stream.
  Status Copy(void* to, const void* from, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    return STRATA_CUDA_STATUS(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, Stream()));
  }
  cudaStream_t Stream() const { return c10::cuda::getCurrentCUDAStream(device_).stream(); }
  // A collective just enqueued on the compute stream: its result, and the watchdog's clock started.
  Status Tracked(ncclResult_t result, const char* what, const char* file, int line) {
    STRATA_RETURN_IF_ERROR(NcclStatus(result, comm_, what, file, line));
    shared_->Track(Stream(), what, rank_);
    return Status::Ok();
  }

  Status CreateTransferStream() {
    if (p2p_stream_) return Status::Ok();
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking)));
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaEventCreateWithFlags(&p2p_done_, cudaEventDisableTiming)));
    return STRATA_CUDA_STATUS(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  }

  // `compute_waits`: the compute stream waits for the transfer (a receive, whose buffer it reads
  // next); a send's compute goes on at once (the caller keeps its buffer, communicator.h).
  template <typename Op>
  Status PointToPoint(Op op, const char* what, bool compute_waits) {
    STRATA_RETURN_IF_ERROR(Ready());
    STRATA_RETURN_IF_ERROR(CreateTransferStream());
    cudaStream_t compute = Stream();
    // The buffer is written (send) or allocated (recv).
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaEventRecord(compute_ready_, compute)));
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaStreamWaitEvent(p2p_stream_, compute_ready_, 0)));
    STRATA_RETURN_IF_ERROR(STRATA_NCCL_STATUS(op(p2p_stream_), comm_, what));
    shared_->Track(p2p_stream_, what, rank_);
    if (!compute_waits) return Status::Ok();
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaEventRecord(p2p_done_, p2p_stream_)));
    // Nothing on compute touches the buffer before.
    STRATA_RETURN_IF_ERROR(STRATA_CUDA_STATUS(cudaStreamWaitEvent(compute, p2p_done_, 0)));
    return Status::Ok();
  }

  ncclComm_t comm_;
  uint32_t rank_, world_;
  int device_;
  std::shared_ptr<NcclShared> shared_;  // shared by the world and its groups
  cudaStream_t p2p_stream_ = nullptr;
  cudaEvent_t p2p_done_ = nullptr, compute_ready_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device, int timeout_ms,
                                                             std::function<void(const std::string&)> on_timeout) {
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0, "the id travels as floats");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0) STRATA_RETURN_IF_ERROR(STRATA_NCCL_STATUS(ncclGetUniqueId(&id), nullptr, "unique id"));
  // The ZeroMQ broadcast copies bytes, so the id arrives bit for bit.
  STRATA_RETURN_IF_ERROR(bootstrap.Broadcast(reinterpret_cast<float*>(&id), sizeof(id) / sizeof(float), 0));
  c10::cuda::CUDAGuard guard(device);
  ncclComm_t comm = nullptr;
  STRATA_RETURN_IF_ERROR(STRATA_NCCL_STATUS(
      ncclCommInitRank(&comm, static_cast<int>(bootstrap.world_size()), id, static_cast<int>(bootstrap.rank())),
      nullptr, "init"));
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(comm, bootstrap.rank(), bootstrap.world_size(), device,
                                         std::make_shared<NcclShared>(device, timeout_ms, std::move(on_timeout))));
}

}  // namespace strata::worker
