// strata-coordinator: parses flags, wires the coordinator, serves until told to stop.
#include <csignal>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "coordinator/coordinator.h"

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
  app.add_option("--heartbeat-timeout-ms", options.heartbeat_timeout_ms, "mark a silent worker lost after this")
      ->check(CLI::Range(200, 3600000));
  CLI11_PARSE(app, argc, argv);

  strata::log::Init("coordinator");
  auto coordinator = strata::coordinator::Coordinator::Create(options);
  if (!coordinator.ok()) {
    STRATA_LOG(kError) << coordinator.status().ToString();
    return 1;
  }
  g_coordinator = coordinator->get();
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  strata::Status st = (*coordinator)->Run();
  return st.ok() ? 0 : 1;
}
