// The coordinator's sense of time, injected so tests drive it instead of sleeping. Steady time
// orders deadlines; Unix time only stamps records (events, runs, metrics lines).
#pragma once

#include <atomic>
#include <cstdint>

namespace strata::coordinator {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t SteadyMs() const = 0;
  virtual int64_t UnixMs() const = 0;
};

// The real clocks (common/net.h).
class SystemClock final : public Clock {
 public:
  int64_t SteadyMs() const override;
  int64_t UnixMs() const override;
  static SystemClock& Get();
};

// Time that moves only when a test says so. Advance() may be called from the test's thread while
// the coordinator's loop reads it: both values are atomics.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : steady_ms_(start_ms) {}
  int64_t SteadyMs() const override { return steady_ms_.load(); }
  int64_t UnixMs() const override { return kUnixEpochOffsetMs + steady_ms_.load(); }
  void Advance(int64_t ms) { steady_ms_.fetch_add(ms); }

 private:
  static constexpr int64_t kUnixEpochOffsetMs = 1'800'000'000'000;
  std::atomic<int64_t> steady_ms_;
};

}  // namespace strata::coordinator
