// The coordinator's HTTP dashboard: GET / (page), GET /api/state (JSON), GET /metrics
// (Prometheus), POST /api/runs/<id>/cancel (Authorization: Bearer <token>), GET /healthz (for
// Kubernetes probes: 200 while the event loop keeps publishing snapshots, else 503).
//
// It runs on its own threads and never touches the coordinator's state: the event loop hands it
// immutable snapshots (Publish), and a cancel goes to the coordinator over its normal control
// endpoint, like `strata cancel`, so the event loop stays the only owner of runs and workers.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/curve.h"
#include "common/status.h"
#include "coordinator/dashboard.h"

namespace strata::coordinator {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                           // 0: any free port (see HttpServer::port())
  std::string token;                      // empty: POST endpoints answer 403
  std::string coordinator_endpoint;       // ZeroMQ endpoint cancels are sent to
  std::optional<curve::ClientKeys> keys;  // for a coordinator with --keys (CURVE), as the CLI's
  // A host that is not a loopback address makes reads (/api/state, /metrics) need the token too,
  // unless this is set (--http-public-read); Start refuses such a host with neither.
  bool public_read = false;
  // Slow clients: a connection is served only once its whole request has arrived; until then it
  // waits at most request_deadline_ms, and at the caps the oldest such waiting connection is
  // closed to make room (docs/dashboard.md, "Slow and many clients").
  int request_deadline_ms = 10000;
  int max_connections_per_address = 32;
  int max_connections = 256;
  // GET /healthz answers 503 once the newest snapshot is older than this: the event loop publishes
  // one every ~250 ms, so an older one means it is stuck (what systemd's watchdog sees too).
  int health_stale_ms = 10000;
};

class HttpServer {
 public:
  // Binds (so a taken port is an error here, not later) and starts serving.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options);
  virtual ~HttpServer() = default;  // stops serving

  virtual int port() const = 0;
  // Thread-safe; the newest snapshot wins.
  virtual void Publish(std::shared_ptr<const DashboardSnapshot> snapshot) = 0;
};

// True for 127.0.0.0/8, ::1 and "localhost": a dashboard bound there is reachable from this
// machine only, so it serves reads without the token (and checks the Host header instead).
bool IsLoopbackHost(const std::string& host);

// "HOST:PORT", ":PORT" or "PORT" (host 127.0.0.1).
Result<std::pair<std::string, int>> ParseHttpAddress(const std::string& address);
// The token is the file's first line; the file must exist and be non-empty.
Result<std::string> ReadTokenFile(const std::string& path);
// Where a client on this host reaches a coordinator bound to `listen` (tcp://* -> 127.0.0.1).
std::string LocalEndpointFor(const std::string& listen);

}  // namespace strata::coordinator
