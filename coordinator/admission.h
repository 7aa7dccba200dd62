// Admission: starts pending runs, oldest first (FIFO: a big run waits rather than being
// overtaken), on idle workers; plans the mesh of runs left to the planner ("auto") and fails runs
// no plan can ever place. Not thread-safe: the loop thread owns it.
#pragma once

#include <vector>

#include "coordinator/cluster.h"
#include "coordinator/extract_scheduler.h"
#include "coordinator/train_run.h"

namespace strata::coordinator {

class Admission {
 public:
  Admission(Cluster& c, TrainRun& train, ExtractScheduler& extract) : c_(c), train_(train), extract_(extract) {}

  // Running extract runs' unassigned chunks first, then pending runs in submission order.
  void Schedule();

 private:
  bool FailUnplaceableExtract(RunEntry& run);
  bool PlanRun(RunEntry& run, std::vector<WorkerEntry*>* idle);

  Cluster& c_;
  TrainRun& train_;
  ExtractScheduler& extract_;
};

}  // namespace strata::coordinator
