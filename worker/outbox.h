// The control thread's outgoing messages (private to worker/; worker.h has the thread table).
#pragma once

#include <deque>
#include <string>
#include <utility>

#include "common/thread_annotations.h"
#include "schema/envelope.h"
#include "storage/shard_store.h"

namespace strata::worker {

// Messages the task thread wants sent; the control thread drains and sends them.
class Outbox {
 public:
  void Push(std::string bytes) STRATA_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    queue_.push_back(std::move(bytes));
  }
  std::deque<std::string> Take() STRATA_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return std::exchange(queue_, {});
  }

 private:
  Mutex mutex_;
  std::deque<std::string> queue_ STRATA_GUARDED_BY(mutex_);
};

inline ::DType ToWire(storage::DType d) { return static_cast<::DType>(static_cast<uint8_t>(d)); }

}  // namespace strata::worker
