// The coordinator: one per cluster. One event loop thread owns all cluster and run state (this
// class is not thread-safe, except RequestStop). Workers and clients talk to it over one ZeroMQ
// ROUTER socket with schema Envelopes; runs, events and checkpoint manifests persist in its
// RocksDB metadata store, so a restart after kill -9 reloads them and workers re-attach.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace strata::coordinator {

struct CoordinatorOptions {
  std::string listen = "ipc:///tmp/strata-coordinator.sock";
  std::string state_dir;                // holds the metadata store
  int heartbeat_interval_ms = 500;      // told to workers at registration
  int heartbeat_timeout_ms = 2000;      // a worker silent this long is marked lost
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
