// What the coordinator's rooms share: the options, the clock and timer queue, the journal, the way
// out to peers, the worker registry and the runs; and the few run operations every room uses
// (Transition, FailRun, cancelling and releasing a run's ranks). One thread (the loop's) owns it;
// nothing here is thread-safe.
#pragma once

#include <functional>
#include <map>
#include <random>
#include <string>

#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/journal.h"
#include "coordinator/run_entry.h"
#include "coordinator/timer_queue.h"
#include "coordinator/worker_registry.h"

namespace strata::coordinator {

// Where messages to workers and clients go: the ROUTER socket in the coordinator, a recorder in
// tests.
class Outbox {
 public:
  virtual ~Outbox() = default;
  // Best effort: a peer that is gone is noticed by its heartbeat timeout, not here.
  virtual void Send(const std::string& identity, const std::string& bytes) = 0;
};

class Cluster {
 public:
  Cluster(const CoordinatorOptions& options, const Clock& clock, TimerQueue& timers, Journal& journal, Outbox& outbox)
      : options(options),
        clock(clock),
        timers(timers),
        journal(journal),
        outbox(outbox),
        workers(clock, options.heartbeat_timeout_ms) {}

  const CoordinatorOptions& options;
  const Clock& clock;
  TimerQueue& timers;
  Journal& journal;
  Outbox& outbox;
  WorkerRegistry workers;
  std::map<std::string, RunEntry> runs;
  std::mt19937_64 rng{std::random_device{}()};
  // Admission: starts pending runs on idle workers (wired by the coordinator).
  std::function<void()> schedule = [] {};

  RunEntry* FindRun(const std::string& id);
  void Schedule() { schedule(); }

  // The run enters `to` and its record (with the events added since) is journaled in one batch.
  // Timers of the phase it leaves no longer fire.
  void Transition(RunEntry& run, Phase to);
  // Calls fire(run) after delay_ms if the run is still in the phase it is in now.
  void AtPhaseDeadline(RunEntry& run, int64_t delay_ms, std::function<void(RunEntry&)> fire);
  void AddEvent(RunEntry& run, EventKind kind, const std::string& message) { journal.AddEvent(run, kind, message); }
  void Persist(RunEntry& run) { static_cast<void>(journal.Persist(run)); }

  // The run failed: journaled with `why`, its ranks stopped and its workers freed for others.
  void FailRun(RunEntry& run, const std::string& why);
  void SendCancel(const WorkerEntry& w, const std::string& run_id, const std::string& why, int64_t snapshot_step = 0);
  // Tells every live worker of the run (but `except`) to stop its task.
  void CancelRanks(const RunEntry& run, const std::string& why, const std::string& except = "");
  // The run's workers that are still on it become idle.
  void ReleaseWorkers(RunEntry& run);
};

}  // namespace strata::coordinator
