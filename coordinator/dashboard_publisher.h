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

  Cluster& c_;
  std::map<std::string, RunEventCache> event_cache_;  // by run id
};

}  // namespace strata::coordinator
