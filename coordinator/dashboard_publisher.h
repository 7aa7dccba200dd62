// Copies what the HTTP dashboard shows into an immutable snapshot (the HTTP thread never sees the
// loop's workers or runs), and the one-line summary for the service manager. Events are re-read
// from the journal only for runs that logged new ones. Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/cluster.h"
#include "coordinator/dashboard.h"

namespace strata::coordinator {

class DashboardPublisher {
 public:
  explicit DashboardPublisher(Cluster& c) : c_(c) {}

  // Hands a fresh snapshot to options.publish_snapshot (if set).
  void Publish();
  // "serving ipc://...: 2/3 workers live, 1 runs running, 0 pending" (for `systemctl status`).
  std::string Summary() const;

 private:
  struct RunEventCache {
    uint64_t seq = ~uint64_t{0};
    std::vector<DashboardEvent> events;  // the last 100
    uint64_t checkpoints = 0, workers_lost = 0, ooms = 0;
  };
  void RefreshEvents(const RunEntry& run, RunEventCache& cache);
  void RebuildWorkers(int64_t now);

  // The worker list is rebuilt at most this often (the page polls once a second) and shared by
  // the snapshots between: copying 10,000 workers four times a second held the loop ~2% of the
  // time, which the slowest 1% of its requests waited behind.
  static constexpr int64_t kWorkerListEveryMs = 1000;

  Cluster& c_;
  std::map<std::string, RunEventCache> event_cache_;  // by run id
  SharedVector<DashboardWorker> workers_;
  int64_t workers_built_ms_ = -1;
  uint64_t workers_signature_ = 0;  // of what changes workers' states (Publish)
};

}  // namespace strata::coordinator
