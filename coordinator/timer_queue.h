// Deadlines of the coordinator's loop (heartbeat checks, grace periods, the out-of-memory snapshot
// wait, stall windows, extract reservations), fired by RunDue on the loop's thread in deadline
// order. Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "coordinator/clock.h"

namespace strata::coordinator {

class TimerQueue {
 public:
  using TimerId = uint64_t;

  explicit TimerQueue(const Clock& clock) : clock_(clock) {}

  // Runs `fire` once, on the first RunDue at or after now + delay_ms.
  TimerId After(int64_t delay_ms, std::function<void()> fire);
  // Runs `fire` every period_ms (first at now + period_ms), until cancelled.
  TimerId Every(int64_t period_ms, std::function<void()> fire);
  // A cancelled (or already fired one-shot) timer is ignored.
  void Cancel(TimerId id);

  // Fires every timer due now; timers a callback adds fire in a later RunDue.
  void RunDue();
  bool empty() const { return timers_.empty(); }

 private:
  struct Timer {
    TimerId id;
    int64_t period_ms;  // 0: one-shot
    std::function<void()> fire;
  };
  const Clock& clock_;
  TimerId next_id_ = 1;
  std::multimap<int64_t, Timer> timers_;  // by deadline (steady ms)
  std::set<TimerId> firing_;              // due in the RunDue under way and not cancelled
};

}  // namespace strata::coordinator
