// strata-worker: parses flags, wires the LibTorch executor into the control loop, serves.
#include <CLI/CLI.hpp>
#include <csignal>

#include "common/byte_size.h"
#include "common/log.h"
#include "common/private_files.h"
#include "common/service_notify.h"
#include "worker/net_interface.h"
#include "worker/task.h"
#include "worker/torch_executor.h"
#include "worker/worker.h"

namespace {
strata::worker::Worker* g_worker = nullptr;
void OnSignal(int) {
  if (g_worker) g_worker->RequestStop();
}
}  // namespace

int main(int argc, char** argv) {
  strata::worker::WorkerOptions options;
  strata::worker::TorchExecutorOptions exec_options;
  CLI::App app{"Strata worker: runs its shard of a run on one device"};
  app.add_option("--name", options.name, "stable worker name, e.g. worker-0")->required();
  app.add_option("--coordinator", options.coordinator, "coordinator endpoint")->required();
  app.add_option("--store", options.store_path, "directory of this worker's shard store")->required();
  app.add_option("--data-address", options.data_address, "endpoint peers reach this worker at (ipc:// or tcp://)")
      ->required();
  app.add_option("--device", exec_options.device, "cpu or cuda:N");
  std::string memory_limit;
  app.add_option(
      "--memory-limit", memory_limit,
      "use at most this much memory, e.g. 8GiB: CUDA caps the caching allocator (emulates a smaller card); "
      "CPU limits the address space the process may add after startup (RLIMIT_AS), so allocations past it fail");
  app.add_option("--serve-address", options.serve_address,
                 "endpoint of this worker's store server (activation reads by `strata activations get`; checkpoint "
                 "reads and copies from other hosts)");
  app.add_option(
      "--host", options.host,
      "host name this worker reports (default: the machine's); workers of a host read each other's stores by "
      "path, and a cluster spanning hosts keeps every checkpoint shard on two of them");
  std::string net_interface;
  app.add_option("--net-interface", net_interface,
                 "network interface (e.g. eth1, ib0) that NCCL uses across hosts: sets NCCL_SOCKET_IFNAME before any "
                 "communicator is made; name the one on the network the other hosts reach (CPU workers' ZeroMQ data "
                 "plane uses --data-address and ignores it)");
  app.add_option("--peer-timeout-ms", options.peer_timeout_ms, "give up on a silent peer after this");
  app.add_option("--stuck-task-restart-ms", options.stuck_task_restart_ms,
                 "restart this worker process (same pid) when a cancelled task has not stopped after this");
  app.add_option("--keys", options.keys_dir,
                 "CURVE key directory from `strata keygen` (required for tcp:// coordinator or data address)");
  app.add_flag(
      "--salvage", options.salvage_store,
      "open a damaged store anyway, keeping what is intact (the damaged files are kept in STORE/damaged-TIME/; "
      "the coordinator marks the checkpoints it no longer holds unreadable)");
  app.set_version_flag("--version", [] { return strata::worker::TorchBuildInfo(); });
  std::string umask = strata::kDefaultDaemonUmask;
  app.add_option("--umask", umask,
                 "umask for everything this daemon creates (store, checkpoints, logs, sockets); the default 0077 "
                 "keeps them to this user (the systemd units pass their group-readable UMask)")
      ->capture_default_str();
  std::vector<std::string> faults;
  app.add_option("--inject-fault", faults, "")->group("");  // tests only: worker/fault_injector.h
  CLI11_PARSE(app, argc, argv);
  for (int i = 0; i < argc; ++i) {  // a restarted worker suffers no injected fault again
    const std::string arg = argv[i];
    if (arg == "--inject-fault") {
      ++i;
    } else if (arg.rfind("--inject-fault=", 0) != 0) {
      options.restart_argv.push_back(arg);
    }
  }

  strata::log::Init(options.name);
  if (!faults.empty()) {
    auto injector = strata::worker::ParseFaults(faults);
    if (!injector.ok()) {
      STRATA_LOG(kError) << injector.status().message();
      return 2;
    }
    options.faults = std::move(injector).value();
    STRATA_LOG(kWarn) << "test faults injected: " << faults.size();
  }
  if (auto st = strata::ApplyUmask(umask); !st.ok()) {
    STRATA_LOG(kError) << st.message();
    return 2;
  }
  // Here, before the executor and the worker start threads (setenv is not thread-safe) and before
  // any task creates an NCCL communicator.
  if (auto st = strata::worker::UseNetInterface(net_interface); !st.ok()) {
    STRATA_LOG(kError) << st.message();
    return 2;
  }
  if (!net_interface.empty()) STRATA_LOG(kInfo) << "NCCL_SOCKET_IFNAME=" << net_interface << " (--net-interface)";
  if (!memory_limit.empty()) {
    auto bytes = strata::ParseByteSize(memory_limit, "--memory-limit");
    if (!bytes.ok()) {
      STRATA_LOG(kError) << bytes.status().message();
      return 2;
    }
    exec_options.memory_limit_bytes = *bytes;
  }
  // systemd (Type=notify): READY once registered with the coordinator, a status line, watchdog
  // pings from the control loop. Without NOTIFY_SOCKET these do nothing.
  strata::ServiceNotifier notifier;
  options.on_ready = [&](const std::string& status) { notifier.Ready(status); };
  options.on_tick = [&] { notifier.WatchdogPing(); };
  options.on_status = [&](const std::string& status) { notifier.SetStatus(status); };
  auto executor = strata::worker::CreateTorchExecutor(exec_options);
  if (!executor.ok()) {
    STRATA_LOG(kError) << executor.status().ToString();
    return 2;
  }
  auto worker = strata::worker::Worker::Create(options, std::move(executor).value());
  if (!worker.ok()) {
    STRATA_LOG(kError) << worker.status().ToString();
    return 1;
  }
  if (exec_options.memory_limit_bytes > 0 && exec_options.device.rfind("cuda", 0) != 0) {
    // Last: the store, sockets and threads are in place, so the limit counts only what tasks add.
    if (auto st = strata::worker::LimitCpuMemory(exec_options.memory_limit_bytes); !st.ok()) {
      STRATA_LOG(kError) << st.message();
      return 2;
    }
  }
  g_worker = worker->get();
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  const bool ok = (*worker)->Run().ok();
  notifier.Stopping(options.name + " stopped");
  return ok ? 0 : 1;
}
