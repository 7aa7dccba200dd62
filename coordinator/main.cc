// strata-coordinator: parses flags, wires the coordinator, serves until told to stop.
#include <CLI/CLI.hpp>
#include <csignal>

#include "common/log.h"
#include "common/private_files.h"
#include "common/service_notify.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_server.h"

namespace {
strata::coordinator::Coordinator* g_coordinator = nullptr;
void OnSignal(int) {
  if (g_coordinator) g_coordinator->RequestStop();
}
}  // namespace

int main(int argc, char** argv) {
  strata::coordinator::CoordinatorOptions options;
  CLI::App app{"Strata coordinator: plans and supervises runs on the cluster's workers"};
  app.add_option("--listen", options.listen, "ZeroMQ endpoint to bind (ipc://PATH or tcp://HOST:PORT)");
  app.add_option("--state-dir", options.state_dir, "directory of the metadata store")->required();
  app.add_flag("--salvage", options.salvage,
               "start even if the metadata store is damaged, keeping what is intact (damaged files are kept in "
               "STATE_DIR/metadata/damaged-TIME/, undecodable records under the salvaged/ prefix)");
  app.add_option("--keys", options.keys_dir,
                 "CURVE key directory from `strata keygen` (required for tcp://): only authorized_keys may connect");
  app.add_option("--heartbeat-timeout-ms", options.heartbeat_timeout_ms, "mark a silent worker lost after this")
      ->check(CLI::Range(200, 3600000));
  app.add_option("--replace-grace-ms", options.replace_grace_ms,
                 "extract runs: how long a lost worker's unfinished chunks wait for it before others take them")
      ->check(CLI::Range(0, 86400000));
  app.add_option(
         "--stall-window-ms", options.stall_window_ms,
         "after a rank's collective times out naming no one (NCCL), wait this long for the other ranks' reports; "
         "the ranks that send none are treated as lost")
      ->check(CLI::Range(100, 3600000));
  app.add_option(
         "--grow-back-min-saving-s", options.grow_back_min_saving_s,
         "a run shrunk by a lost worker takes idle workers back at its next checkpoint when that saves at least "
         "this many seconds over its remaining steps (-1: never)")
      ->check(CLI::Range(-1, 86400));
  std::string http_address, http_token_file;
  app.add_option("--http", http_address,
                 "serve the dashboard, /api/state and /metrics on HOST:PORT (off by default; "
                 "PORT alone binds 127.0.0.1)");
  app.add_option("--http-token-file", http_token_file,
                 "file whose first line is the token that POST requests "
                 "(cancel) must send as Authorization: Bearer");
  bool http_public_read = false;
  app.add_flag("--http-public-read", http_public_read,
               "with --http on a non-loopback address: serve reads (/api/state, /metrics) without the token");
  std::string umask = strata::kDefaultDaemonUmask;
  app.add_option("--umask", umask,
                 "umask for everything this daemon creates (store, checkpoints, logs, sockets); the default 0077 "
                 "keeps them to this user (the systemd units pass their group-readable UMask)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  strata::log::Init("coordinator");
  if (auto st = strata::ApplyUmask(umask); !st.ok()) {
    STRATA_LOG(kError) << st.message();
    return 2;
  }
  // systemd (Type=notify): READY once serving, a status line, watchdog pings from the event loop.
  // Without NOTIFY_SOCKET these do nothing.
  strata::ServiceNotifier notifier;
  options.on_ready = [&](const std::string& summary) { notifier.Ready(summary); };
  options.on_tick = [&] { notifier.WatchdogPing(); };
  options.on_status = [&](const std::string& summary) { notifier.SetStatus(summary); };
  std::unique_ptr<strata::coordinator::HttpServer> http;
  // Only with a dashboard: a snapshot copies every worker (with its memory history) 4 times a
  // second on the event loop, which at 10,000 workers is most of the loop's spare time.
  if (!http_address.empty()) {
    options.publish_snapshot = [&](std::shared_ptr<const strata::coordinator::DashboardSnapshot> snapshot) {
      if (http) http->Publish(std::move(snapshot));
    };
  }
  auto coordinator = strata::coordinator::Coordinator::Create(options);
  if (!coordinator.ok()) {
    STRATA_LOG(kError) << coordinator.status().ToString();
    return 1;
  }
  if (!http_address.empty()) {
    strata::Status st = [&]() -> strata::Status {
      STRATA_ASSIGN_OR_RETURN(auto address, strata::coordinator::ParseHttpAddress(http_address));
      strata::coordinator::HttpServerOptions http_options;
      http_options.host = address.first;
      http_options.port = address.second;
      http_options.public_read = http_public_read;
      http_options.coordinator_endpoint = strata::coordinator::LocalEndpointFor(options.listen);
      if (!http_token_file.empty()) {
        STRATA_ASSIGN_OR_RETURN(http_options.token, strata::coordinator::ReadTokenFile(http_token_file));
      }
      if (!options.keys_dir.empty()) {
        // Cancels reach the coordinator through its CURVE-guarded socket, with the CLI's pair.
        auto keys = strata::curve::LoadClientKeys(options.keys_dir);
        if (keys.ok()) {
          http_options.keys = std::move(keys).value();
        } else {
          STRATA_LOG(kWarn) << "dashboard: cancelling from it will fail: " << keys.status().message()
                            << " (it needs client.key/client.pub from `strata keygen` in " << options.keys_dir << ")";
        }
      }
      STRATA_ASSIGN_OR_RETURN(http, strata::coordinator::HttpServer::Start(http_options));
      return strata::Status::Ok();
    }();
    if (!st.ok()) {
      STRATA_LOG(kError) << st.ToString();
      return 1;
    }
  }
  g_coordinator = coordinator->get();
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  strata::Status st = (*coordinator)->Run();
  notifier.Stopping("coordinator stopping");
  return st.ok() ? 0 : 1;
}
