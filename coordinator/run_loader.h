// Loads the journal's runs at start: a restart after kill -9 goes on where the journal says (a
// running run expects its workers to re-register; a recovering one waits its grace period again).
// A run record that does not decode stops the start unless options.salvage, which keeps it under
// "salvaged/" and loads the rest.
#pragma once

#include "coordinator/cluster.h"
#include "coordinator/extract_scheduler.h"
#include "coordinator/train_run.h"

namespace strata::coordinator {

class RunLoader {
 public:
  RunLoader(Cluster& c, TrainRun& train, ExtractScheduler& extract) : c_(c), train_(train), extract_(extract) {}
  Status Load();

 private:
  Status UnreadableRunRecord(const std::string& key, const std::vector<uint8_t>& bytes, const std::string& why);

  Cluster& c_;
  TrainRun& train_;
  ExtractScheduler& extract_;
};

}  // namespace strata::coordinator
