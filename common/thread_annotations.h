// Clang's thread-safety analysis (-Wthread-safety): which mutex guards which member, checked at
// compile time. The clang build that the fuzzers use (scripts/fuzz.sh, build-fuzz/) compiles the
// control-plane libraries with these checks as errors, and scripts/thread-safety.sh checks every
// product file that uses them (the LibTorch ones too); GCC ignores the attributes.
//
//   Mutex mutex_;
//   std::deque<Item> queue_ STRATA_GUARDED_BY(mutex_);
//   void Push(Item item) STRATA_EXCLUDES(mutex_) { MutexLock lock(mutex_); queue_.push_back(item); }
//
// std::mutex carries no annotations in libstdc++, so state shared between threads uses Mutex and
// MutexLock (a std::mutex and a scoped lock that clang can see), and CondVar (which waits on a
// MutexLock) instead of std::condition_variable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define STRATA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define STRATA_THREAD_ANNOTATION(x)
#endif

#define STRATA_CAPABILITY(x) STRATA_THREAD_ANNOTATION(capability(x))
#define STRATA_SCOPED_CAPABILITY STRATA_THREAD_ANNOTATION(scoped_lockable)
#define STRATA_GUARDED_BY(x) STRATA_THREAD_ANNOTATION(guarded_by(x))
#define STRATA_PT_GUARDED_BY(x) STRATA_THREAD_ANNOTATION(pt_guarded_by(x))
#define STRATA_REQUIRES(...) STRATA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define STRATA_EXCLUDES(...) STRATA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define STRATA_ACQUIRE(...) STRATA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define STRATA_RELEASE(...) STRATA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define STRATA_NO_THREAD_SAFETY_ANALYSIS STRATA_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace strata {

class STRATA_CAPABILITY("mutex") Mutex {
 public:
  void lock() STRATA_ACQUIRE() { mutex_.lock(); }
  void unlock() STRATA_RELEASE() { mutex_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Holds `mutex` for its scope; Unlock/Lock let a loop drop it around slow work.
class STRATA_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) STRATA_ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() STRATA_RELEASE() = default;
  void Unlock() STRATA_RELEASE() { lock_.unlock(); }
  void Lock() STRATA_ACQUIRE() { lock_.lock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// A condition variable whose waits take the MutexLock that holds its mutex. The predicate runs
// with the mutex held (the analysis cannot see that through the lambda, hence the annotation).
class CondVar {
 public:
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }
  template <typename Predicate>
  void Wait(MutexLock& lock, Predicate ready) STRATA_NO_THREAD_SAFETY_ANALYSIS {
    cv_.wait(lock.lock_, ready);
  }
  // False when `timeout` passed with `ready` still false.
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(MutexLock& lock, std::chrono::duration<Rep, Period> timeout,
               Predicate ready) STRATA_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.wait_for(lock.lock_, timeout, ready);
  }

 private:
  std::condition_variable cv_;
};

}  // namespace strata
