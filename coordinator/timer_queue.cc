#include "coordinator/timer_queue.h"

#include <vector>

#include "common/net.h"

namespace strata::coordinator {

int64_t SystemClock::SteadyMs() const { return net::SteadyMs(); }
int64_t SystemClock::UnixMs() const { return net::NowUnixMs(); }
SystemClock& SystemClock::Get() {
  static SystemClock clock;
  return clock;
}

TimerQueue::TimerId TimerQueue::After(int64_t delay_ms, std::function<void()> fire) {
  const TimerId id = next_id_++;
  timers_.emplace(clock_.SteadyMs() + delay_ms, Timer{id, 0, std::move(fire)});
  return id;
}

TimerQueue::TimerId TimerQueue::Every(int64_t period_ms, std::function<void()> fire) {
  const TimerId id = next_id_++;
  timers_.emplace(clock_.SteadyMs() + period_ms, Timer{id, period_ms, std::move(fire)});
  return id;
}

void TimerQueue::Cancel(TimerId id) {
  firing_.erase(id);
  for (auto it = timers_.begin(); it != timers_.end(); ++it) {
    if (it->second.id == id) {
      timers_.erase(it);
      return;
    }
  }
}

void TimerQueue::RunDue() {
  const int64_t now = clock_.SteadyMs();
  std::vector<Timer> due;
  while (!timers_.empty() && timers_.begin()->first <= now) {
    due.push_back(std::move(timers_.begin()->second));
    timers_.erase(timers_.begin());
  }
  // Periodic timers are re-armed before any callback runs, so a callback may cancel its own.
  for (const Timer& t : due) {
    if (t.period_ms > 0) timers_.emplace(now + t.period_ms, t);
    firing_.insert(t.id);
  }
  for (Timer& t : due) {
    // A callback may have cancelled a later timer of this batch: skip it if so.
    if (firing_.erase(t.id)) t.fire();
  }
}

}  // namespace strata::coordinator
