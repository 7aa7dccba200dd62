// The coordinator without its socket: the rooms, wired to each other, over a clock, a timer queue
// and an Outbox. The coordinator's loop feeds it messages and turns its timers; tests do the same
// with a FakeClock and a recording Outbox, deterministically and without sockets.
// Not thread-safe: one thread (the loop's) owns it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "coordinator/admission.h"
#include "coordinator/checkpoint_committer.h"
#include "coordinator/cluster.h"
#include "coordinator/dashboard_publisher.h"
#include "coordinator/extract_scheduler.h"
#include "coordinator/rpc_handlers.h"
#include "coordinator/run_files.h"
#include "coordinator/train_run.h"

namespace strata::coordinator {

class CoordinatorCore {
 public:
  // `options`, `clock` and `outbox` must outlive it. `on_shutdown` runs when a client asks for it.
  CoordinatorCore(const CoordinatorOptions& options, const Clock& clock, std::unique_ptr<storage::ShardStore> store,
                  Outbox& outbox, std::function<void()> on_shutdown);

  // Loads the journal's runs (once, before the first message).
  Status Load();
  // Handles one message from `identity`, then journals what it changed.
  void Dispatch(const std::string& identity, Envelope::Reader root);
  // Fires the timers due by the clock, then journals what they changed.
  void RunDueTimers();

  std::string Summary() const { return dashboard_.Summary(); }
  Cluster& cluster() { return cluster_; }
  Journal& journal() { return journal_; }

 private:
  TimerQueue timers_;
  Journal journal_;
  Cluster cluster_;
  CheckpointCommitter committer_;
  RunFiles files_;
  TrainRun train_;
  ExtractScheduler extract_;
  Admission admission_;
  RpcHandlers rpc_;
  DashboardPublisher dashboard_;
};

}  // namespace strata::coordinator
