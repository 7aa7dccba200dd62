// The coordinator: one per cluster. One event loop thread owns all cluster and run state (this
// class is not thread-safe, except RequestStop). Workers and clients talk to it over one ZeroMQ
// ROUTER socket with schema Envelopes; runs, events and checkpoint manifests persist in its
// RocksDB metadata store, so a restart after kill -9 reloads them and workers re-attach.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace strata::coordinator {

struct DashboardSnapshot;  // coordinator/dashboard.h
class Clock;               // coordinator/clock.h

struct CoordinatorOptions {
  std::string listen = "ipc:///tmp/strata-coordinator.sock";
  std::string state_dir;            // holds the metadata store
  int heartbeat_interval_ms = 500;  // told to workers at registration
  int heartbeat_timeout_ms = 2000;  // a worker silent this long is marked lost
  // Extract runs: how long a lost worker's unfinished chunks wait for it to come back (its store
  // may already hold some of them) before they go to the other workers.
  int replace_grace_ms = 10000;
  // After a rank runs out of memory, how long the run waits for every rank to save its state of
  // the last whole step (the replay's start) before replaying from its latest complete checkpoint.
  int snapshot_timeout_ms = 60000;
  // When a rank's collective times out without knowing on whom (NCCL), how long the coordinator
  // waits for the run's other ranks to report theirs: the ranks that do not are the ones that did
  // not arrive. Victims enqueue the same collective within about a step of each other.
  int stall_window_ms = 3000;
  // A run that a lost worker made smaller takes workers back at its next complete checkpoint
  // (stop, resume on the larger mesh) when the time that saves over its remaining steps, at its
  // measured speed, is at least this; < 0: never.
  int grow_back_min_saving_s = 30;
  // CURVE key directory (`strata keygen`): required for tcp:// listen addresses, optional for
  // ipc://. With it only clients whose public key is in authorized_keys may connect.
  std::string keys_dir;
  // A damaged metadata store (or run record) stops the coordinator with a message naming it; with
  // salvage it starts with what is intact (storage::StoreOptions::salvage; records that do not
  // decode are moved under "salvaged/" and logged, never deleted).
  bool salvage = false;
  // Optional hooks for a service manager (main.cc wires them to systemd's sd_notify); all run on
  // the event-loop thread, so a stuck loop stops calling them.
  std::function<void(const std::string& summary)> on_ready;   // once: bound, store loaded
  std::function<void()> on_tick;                              // every loop turn (<= 100 ms apart)
  std::function<void(const std::string& summary)> on_status;  // about once a second: workers, runs
  // Optional: receives an immutable snapshot of workers and runs about every 250 ms, on the
  // event-loop thread (main.cc hands it to the HTTP dashboard, which only ever reads snapshots).
  std::function<void(std::shared_ptr<const DashboardSnapshot>)> publish_snapshot;
  // The clock every deadline and timestamp comes from (not owned; must outlive the coordinator).
  // Null: the system's. Tests pass a FakeClock and move time instead of sleeping.
  const Clock* clock = nullptr;
};

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options);
  virtual ~Coordinator() = default;

  // Serves until a client asks for shutdown or RequestStop() is called.
  virtual Status Run() = 0;
  // Thread- and signal-safe.
  virtual void RequestStop() = 0;
};

}  // namespace strata::coordinator
