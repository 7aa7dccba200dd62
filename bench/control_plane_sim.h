// control_plane_bench's simulated workers: each speaks the real worker protocol (a ZeroMQ DEALER
// socket, Cap'n Proto envelopes, as worker/worker.cc does) to a real coordinator, spread over
// forked sender processes that report through one shared mapping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cpbench {

inline int64_t SteadyUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What the senders tell the main thread. It lives in a MAP_SHARED mapping: the workers are spread
// over child processes, because each simulated worker costs the sender two descriptors (its
// socket's mailbox and its connection) and a container's hard limit (often 20k) cannot be raised.
struct Shared {
  static constexpr int kMaxAssignments = 256;
  struct Assignment {
    char run_id[128];
    int64_t arrived_us;
  };
  std::atomic<bool> stop{false};
  std::atomic<int64_t> registered{0};
  std::atomic<int64_t> heartbeats_sent{0};
  std::atomic<int64_t> heartbeats_dropped{0};  // EAGAIN on a full pipe: the coordinator is behind
  std::atomic<int64_t> errors_received{0};     // e.g. "unknown worker; register again" after a loss
  std::atomic<int> heartbeat_interval_ms{500};
  std::atomic<int> assignments_claimed{0};
  std::atomic<int> assignments_published{0};  // slots [0, published) are complete
  Assignment assignments[kMaxAssignments];

  void AddAssignment(const std::string& run_id, int64_t arrived_us) {
    const int slot = assignments_claimed.fetch_add(1);
    if (slot >= kMaxAssignments) return;
    snprintf(assignments[slot].run_id, sizeof(assignments[slot].run_id), "%s", run_id.c_str());
    assignments[slot].arrived_us = arrived_us;
    int expected = slot;  // publish in slot order (assignments come one submit at a time)
    while (!assignments_published.compare_exchange_weak(expected, slot + 1)) expected = slot;
  }
  int64_t FindAssignment(const std::string& run_id) const {
    const int published = std::min(assignments_published.load(), kMaxAssignments);
    for (int i = 0; i < published; ++i) {
      if (run_id == assignments[i].run_id) return assignments[i].arrived_us;
    }
    return -1;
  }
};

struct SenderOptions {
  int threads = 2;                 // sender threads in the process
  int workers_per_process = 4000;  // each costs the sender ~2 descriptors
  int workers_per_host = 8;        // simulated hosts of that many workers
};

// In forked sender process `process` of `processes`: its share of the `workers` simulated workers
// (every processes-th, from `process`) register with `endpoint` and heartbeat until shared.stop.
void RunSenderProcess(int process, int processes, int workers, const SenderOptions& options, Shared& shared,
                      const std::string& endpoint, const std::string& state_dir);

}  // namespace cpbench
