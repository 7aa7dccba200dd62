// Copies of other workers' checkpoint shards into this worker's store (private to worker/).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/store_client.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/thread_annotations.h"
#include "schema/envelope.h"
#include "storage/shard_store.h"
#include "worker/outbox.h"

namespace strata::worker {

// Copies checkpoint shards of other workers into this worker's store (ReplicateShard), one at a
// time on its own thread, a piece at a time (host memory holds one piece), and reports each copy
// through the outbox once it is committed (durable). A request for a copy already committed (the
// coordinator restarted and asked again) is answered at once.
class ShardReplicator {
 public:
  ShardReplicator(storage::ShardStore* store, std::string store_path, std::optional<curve::ClientKeys> keys,
                  Outbox* outbox)
      : store_(store), store_path_(std::move(store_path)), keys_(std::move(keys)), outbox_(outbox) {}
  ~ShardReplicator() {
    stopping_.store(true);  // a copy in progress stops at its next piece
    std::thread thread;
    {
      MutexLock lock(mutex_);
      stop_ = true;
      thread = std::move(thread_);
    }
    wake_.NotifyAll();
    if (thread.joinable()) thread.join();
  }

  struct Request {
    std::string run_id, source, source_key_run, key_run;
    int64_t step = 0;
    uint32_t rank = 0;
    std::vector<std::string> names;
  };

  void Add(Request request) STRATA_EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      queue_.push_back(std::move(request));
      if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    }
    wake_.NotifyAll();
  }

 private:
  void Loop() STRATA_EXCLUDES(mutex_) {
    while (true) {
      Request r;
      {
        MutexLock lock(mutex_);
        wake_.Wait(lock, [&]() STRATA_REQUIRES(mutex_) { return stop_ || !queue_.empty(); });
        if (stop_) return;
        r = std::move(queue_.front());
        queue_.pop_front();
      }
      const auto start = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      Status st = Copy(r, &bytes);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (st.ok()) {
        STRATA_LOG(kInfo) << "copied rank " << r.rank << "'s shard of checkpoint " << r.run_id << "@" << r.step << " ("
                          << bytes / (1 << 20) << " MiB, " << r.names.size() << " pieces) from " << r.source << " in "
                          << seconds << " s";
      } else {
        STRATA_LOG(kWarn) << "could not copy rank " << r.rank << "'s shard of checkpoint " << r.run_id << "@" << r.step
                          << ": " << st.message();
      }
      schema::EnvelopeBuilder msg;
      auto done = msg.root().initShardReplicated();
      done.setRunId(r.run_id);
      done.setStep(r.step);
      done.setRank(r.rank);
      done.setStorePath(store_path_);
      done.setKeyRun(r.key_run);
      if (!st.ok()) done.setError(st.message());
      outbox_->Push(msg.Serialize());
    }
  }

  Status Copy(const Request& r, uint64_t* bytes) {
    STRATA_ASSIGN_OR_RETURN(auto existing, store_->GetCheckpoint(r.key_run, r.step));
    if (existing) return Status::Ok();  // committed by an earlier request
    STRATA_ASSIGN_OR_RETURN(auto client, client::StoreClient::Connect(r.source, keys_, 30000));
    for (const auto& name : r.names) {
      if (stopping_.load()) return Aborted("the worker is stopping");
      STRATA_ASSIGN_OR_RETURN(storage::Tensor piece, client->ReadCheckpointPiece(r.source_key_run, r.step, name));
      STRATA_RETURN_IF_ERROR(
          store_->PutCheckpointTensor(r.key_run, r.step, name, {piece.dtype, piece.shape, piece.bytes}));
      *bytes += piece.bytes.size();
    }
    return store_->CommitCheckpoint(r.key_run, r.step);
  }

  storage::ShardStore* store_;
  std::string store_path_;
  std::optional<curve::ClientKeys> keys_;
  Outbox* outbox_;
  Mutex mutex_;
  CondVar wake_;
  std::deque<Request> queue_ STRATA_GUARDED_BY(mutex_);
  bool stop_ STRATA_GUARDED_BY(mutex_) = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_ STRATA_GUARDED_BY(mutex_);  // started by the first Add; joined by the destructor
};

}  // namespace strata::worker
