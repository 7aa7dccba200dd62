// `strata keygen`, `strata up` and `strata down`: keys, and the local cluster's daemons.
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/command_set.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "client/cluster_calls.h"
#include "client/cluster_file.h"
#include "common/byte_size.h"
#include "common/curve.h"
#include "common/net.h"
#include "schema/envelope.h"

extern char** environ;

namespace strata::cli {

namespace fs = std::filesystem;

// STATE_DIR/cluster.json and the processes `strata up` started (client/cluster_file.h).
using client::AwaitExitOf;
using client::ClusterFile;
using client::ClusterFilePath;
using client::ClusterProcess;
using client::EnsureHttpTokenFile;
using client::FindStrataProcesses;
using client::IsStrataProcess;
using client::PickLocalPort;
using client::ReadClusterFile;
using client::WriteClusterFile;

// ------------------------------------------------------------------ keygen

int CmdKeygen(const std::string& dir, bool force) {
  Status st = curve::WriteKeyDirectory(dir, force);
  if (!st.ok()) return Fail(st);
  std::cout << "CURVE keys written to " << dir << " (secret keys mode 0600, directory 0700):\n"
            << "  coordinator.key/.pub  the coordinator's pair: start it with --keys " << dir << "\n"
            << "  client.key/.pub       the CLI's and workers' pair (already in authorized_keys)\n"
            << "  authorized_keys       public keys allowed to connect, one a line\n"
            << "Copy the directory without coordinator.key to each worker host and point the CLI at it with\n"
            << "--keys, $STRATA_KEYS or STATE_DIR/keys. See docs/security.md." << std::endl;
  return kExitOk;
}

namespace {

// ------------------------------------------------------------------ up / down

std::string BinaryDir() {
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : exe.parent_path().string();
}

// Starts a detached child (own session, so it outlives this CLI) with output to `log_path`.
Result<int> SpawnDaemon(const std::vector<std::string>& argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return IoError("cannot start " + argv[0] + ": " + std::strerror(rc));
  return static_cast<int>(pid);
}

std::string LogTail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "  " + all[i] + "\n";
  return out.empty() ? "  (empty)\n" : out;
}
}  // namespace

int CmdUp(GlobalOptions& g, const UpOptions& up) {
  // Every flag is checked before anything starts: a worker refusing its flag after the
  // coordinator is up would leave a coordinator running for nothing.
  if (!up.memory_limit.empty()) {
    auto limit = ParseByteSize(up.memory_limit, "--memory-limit");
    if (!limit.ok()) return Fail(limit.status());
    if (*limit == 0)
      return Fail(
          InvalidArgument("--memory-limit " + up.memory_limit + " is 0; give a size such as 8GiB, or leave it out"));
  }
  if (!up.net_interface.empty() && if_nametoindex(up.net_interface.c_str()) == 0) {
    return Fail(InvalidArgument("--net-interface " + up.net_interface +
                                ": this host has no such network interface; name "
                                "one it has (list them with `ip -br addr`), or leave the flag out"));
  }
  if (up.hosts > (up.gpus > 0 ? up.gpus : up.workers)) {
    return Fail(InvalidArgument("--hosts " + std::to_string(up.hosts) + " is more than the " +
                                std::to_string(up.gpus > 0 ? up.gpus : up.workers) +
                                " workers; a host needs a worker"));
  }
  const int workers = up.gpus > 0 ? up.gpus : up.workers;
  const std::string dir = fs::absolute(g.state_dir).lexically_normal().string();
  std::error_code ec;
  fs::create_directories(dir + "/logs", ec);
  if (ec) return Fail(IoError("cannot create " + dir + ": " + ec.message()));
  // The ipc sockets live here: only the owner may reach them (ipc:// runs without CURVE).
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return Fail(IoError("cannot make " + dir + " private (chmod 700): " + ec.message()));
  ClusterFile file;
  if (auto existing = ReadClusterFile(dir); existing.ok()) file = *existing;
  file.state_dir = dir;
  file.endpoint = "ipc://" + dir + "/coordinator.sock";
  if (file.endpoint.size() > 100) {
    return Fail(InvalidArgument("--state-dir " + dir + " is too long for an ipc socket path; use a shorter one"));
  }
  // Pointers from find() are valid until the next find() (the vector may grow).
  auto find = [&](const std::string& name) -> ClusterProcess* {
    for (auto& p : file.processes) {
      if (p.name == name) return &p;
    }
    file.processes.push_back({name, 0});
    return &file.processes.back();
  };
  // Keys in reach (--keys, $STRATA_KEYS, STATE_DIR/keys) make a CURVE cluster even on ipc://, so
  // the keys later commands pick up always match the cluster's.
  std::vector<std::string> keys_args;
  if (const std::string keys = client::ResolveKeysDir(g); !keys.empty()) {
    if (!fs::exists(keys + "/coordinator.key")) {
      return Fail(InvalidArgument("the key directory " + keys +
                                  " has no coordinator.key, so a local coordinator "
                                  "cannot use it; unset STRATA_KEYS / drop --keys, or make one with `strata keygen`"));
    }
    keys_args = {"--keys", fs::absolute(keys).string()};
  }
  const std::string bin = BinaryDir();
  int started = 0;
  std::vector<int> started_pids;
  // A process killed a moment ago may still hold its store's lock or its socket: its successor
  // starts once it is gone.
  auto await_exit = [&](const ClusterProcess& p) -> Status {
    constexpr int kExitWaitMs = 30000;
    if (AwaitExitOf(p.pid, kExitWaitMs)) return Status::Ok();
    const std::string pid = std::to_string(p.pid);
    return Unavailable(
        p.name + " (pid " + pid + ") is still exiting after " + std::to_string(kExitWaitMs / 1000) +
        " s, holding its store and sockets (a thread in disk sleep?); see `ps -L -o pid,tid,stat,wchan -p " + pid +
        "` and run `strata up` again once it is gone");
  };
  ClusterProcess* coord = find("coordinator");
  if (Status st = await_exit(*coord); !st.ok()) return Fail(st);
  if (!IsStrataProcess(coord->pid)) {
    std::vector<std::string> argv = {bin + "/strata-coordinator",
                                     "--listen",
                                     file.endpoint,
                                     "--state-dir",
                                     dir + "/coordinator",
                                     "--heartbeat-timeout-ms",
                                     std::to_string(up.heartbeat_timeout_ms),
                                     "--replace-grace-ms",
                                     std::to_string(up.replace_grace_ms),
                                     "--grow-back-min-saving-s",
                                     std::to_string(up.grow_back_min_saving_s)};
    argv.insert(argv.end(), keys_args.begin(), keys_args.end());
    if (up.salvage) argv.push_back("--salvage");
    // The dashboard on loopback, its port kept across restarts when free (docs/dashboard.md).
    auto token_file = EnsureHttpTokenFile(dir);
    if (!token_file.ok()) return Fail(token_file.status());
    const size_t colon = file.http.rfind(':');
    auto port = PickLocalPort(colon == std::string::npos ? 0 : std::atoi(file.http.c_str() + colon + 1));
    if (!port.ok()) return Fail(port.status());
    file.http = "http://127.0.0.1:" + std::to_string(*port);
    argv.insert(argv.end(), {"--http", "127.0.0.1:" + std::to_string(*port), "--http-token-file", *token_file});
    auto pid = SpawnDaemon(argv, dir + "/logs/coordinator.log");
    if (!pid.ok()) return Fail(pid.status());
    coord->pid = *pid;
    started_pids.push_back(*pid);
    ++started;
  }
  for (int i = 0; i < workers; ++i) {
    const std::string name = "worker-" + std::to_string(i);
    ClusterProcess* p = find(name);
    if (Status st = await_exit(*p); !st.ok()) return Fail(st);
    if (IsStrataProcess(p->pid)) continue;
    std::vector<std::string> argv = {bin + "/strata-worker",
                                     "--name",
                                     name,
                                     "--coordinator",
                                     file.endpoint,
                                     "--store",
                                     dir + "/workers/" + name,
                                     "--data-address",
                                     "ipc://" + dir + "/" + name + ".data.sock",
                                     "--serve-address",
                                     "ipc://" + dir + "/" + name + ".serve.sock"};
    if (up.gpus > 0) argv.insert(argv.end(), {"--device", "cuda:" + std::to_string(i)});
    if (up.hosts > 1) argv.insert(argv.end(), {"--host", "host-" + std::to_string(i % up.hosts)});
    if (!up.memory_limit.empty()) argv.insert(argv.end(), {"--memory-limit", up.memory_limit});
    if (!up.net_interface.empty()) argv.insert(argv.end(), {"--net-interface", up.net_interface});
    argv.insert(argv.end(), {"--peer-timeout-ms", std::to_string(up.peer_timeout_ms), "--stuck-task-restart-ms",
                             std::to_string(up.stuck_task_restart_ms)});
    argv.insert(argv.end(), keys_args.begin(), keys_args.end());
    if (up.salvage) argv.push_back("--salvage");
    for (const auto& fault : up.inject_faults) argv.insert(argv.end(), {"--inject-fault", fault});
    auto pid = SpawnDaemon(argv, dir + "/logs/" + name + ".log");
    if (!pid.ok()) return Fail(pid.status());
    p->pid = *pid;
    started_pids.push_back(*pid);
    ++started;
  }
  if (Status st = WriteClusterFile(file); !st.ok()) {
    // Nothing may run that `strata down` cannot find: stop what this call started (what ran
    // before is in the cluster.json left as it was).
    for (int pid : started_pids) {
      if (IsStrataProcess(pid)) kill(pid, SIGTERM);
    }
    return Fail(Status(st.code(),
                       st.message() + (started_pids.empty() ? "" : "; the processes this call started were stopped")));
  }
  // Wait until the coordinator answers and every worker has registered.
  const int64_t deadline = net::SteadyMs() + 60000;
  int live = 0;
  while (net::SteadyMs() < deadline) {
    auto count = client::CountLiveWorkers(g, file.endpoint);
    if (count.ok() && (live = *count) >= workers) break;
    for (const auto& p : file.processes) {
      if (p.name != "coordinator" && p.name.rfind("worker-", 0) != 0) continue;
      if (p.name != "coordinator" && std::stoi(p.name.substr(7)) >= workers) continue;
      if (!IsStrataProcess(p.pid)) {
        const std::string log = dir + "/logs/" + p.name + ".log";
        return Fail(Unavailable(p.name + " exited at start; the end of " + log + ":\n" + LogTail(log, 8)));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (live < workers) {
    return Fail(DeadlineExceeded("only " + std::to_string(live) + " of " + std::to_string(workers) +
                                 " workers registered within 60 s; see the logs in " + dir + "/logs"));
  }
  std::cout << "cluster up: coordinator at " << file.endpoint << ", " << live << " worker(s) (" << started
            << " process(es) started)\nstate and logs: " << dir << std::endl;
  if (!file.http.empty())
    std::cout << "dashboard: " << file.http << " (token for actions: " << dir << "/http.token)" << std::endl;
  return kExitOk;
}

// Returns once every process of the cluster has exited: asked to shut down, then SIGTERM, each
// given `grace_s`, then SIGKILL (2 s). What survives even that is named, with its pid, cluster.json
// is kept (so `strata down` can be run again) and the exit code is 1.
int CmdDown(GlobalOptions& g, int grace_s) {
  auto file = ReadClusterFile(g.state_dir);
  if (!file.ok()) {
    // No readable cluster.json (deleted, or emptied by an older `up` on a full disk): stop the
    // daemons of this state directory that are still running, found by their command lines.
    const std::string dir = fs::absolute(g.state_dir).lexically_normal().string();
    std::vector<ClusterProcess> found = FindStrataProcesses(dir);
    if (found.empty()) return Fail(file.status());
    std::cerr << "strata: " << file.status().message() << "; stopping the " << found.size() << " process(es) of " << dir
              << " found running" << std::endl;
    ClusterFile recovered;
    recovered.state_dir = dir;
    recovered.endpoint = "ipc://" + dir + "/coordinator.sock";
    recovered.processes = std::move(found);
    file = std::move(recovered);
  }
  auto alive = [&] {
    int n = 0;
    for (auto& p : file->processes) n += IsStrataProcess(p.pid);
    return n;
  };
  const int running = alive();
  {
    auto client = client::MakeClient(g, file->endpoint, 2000);
    schema::EnvelopeBuilder req;
    req.root().setShutdown();
    if (client.ok()) (void)(*client)->Call(req);  // the coordinator tells its workers; stragglers get signals below
  }
  for (int sig : {0, SIGTERM, SIGKILL}) {
    if (sig != 0) {
      for (auto& p : file->processes) {
        if (IsStrataProcess(p.pid)) kill(p.pid, sig);
      }
    }
    const int64_t deadline = net::SteadyMs() + (sig == SIGKILL ? 2000 : grace_s * 1000LL);
    while (alive() > 0 && net::SteadyMs() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (alive() == 0) break;
  }
  std::string survivors;
  for (auto& p : file->processes) {
    if (IsStrataProcess(p.pid))
      survivors += (survivors.empty() ? "" : ", ") + p.name + " (pid " + std::to_string(p.pid) + ")";
  }
  if (!survivors.empty()) {
    std::cerr << "strata: not down: " << survivors << " did not exit within " << 2 * grace_s + 2
              << " s (shutdown request, SIGTERM, SIGKILL); it may be stuck in the kernel (a device or disk): check it "
                 "with `ps -o pid,stat,wchan -p PID`, and run `strata down` again once it is gone (cluster.json in "
              << file->state_dir << " is kept for that)" << std::endl;
    return kExitFailure;
  }
  std::error_code ec;
  fs::remove(ClusterFilePath(file->state_dir), ec);
  std::cout << "cluster down: " << running << " process(es) exited (state kept in " << file->state_dir << ")"
            << std::endl;
  return kExitOk;
}

void RegisterClusterCommands(CommandSet& set) {
  GlobalOptions& g = set.global();
  struct Keygen {
    std::string dir;
    bool force = false;
  };
  auto keygen = std::make_shared<Keygen>();
  auto* keygen_cmd = set.Add("keygen", "make CURVE keys for a cluster on tcp:// (see docs/security.md)",
                             [keygen] { return CmdKeygen(keygen->dir, keygen->force); });
  keygen_cmd->add_option("dir", keygen->dir, "directory to create (e.g. STATE_DIR/keys)")->required();
  keygen_cmd->add_flag("--force", keygen->force, "replace existing keys (every host then needs the new ones)");

  auto up_options = std::make_shared<UpOptions>();
  auto* up = set.Add("up", "start a local coordinator and workers (starts only what is not running)",
                     [&g, up_options] { return CmdUp(g, *up_options); });
  up->add_option("--workers", up_options->workers, "number of CPU workers")->check(CLI::Range(1, 64));
  up->add_option("--gpus", up_options->gpus, "one worker per GPU on cuda:0..N-1 instead of CPU workers")
      ->check(CLI::Range(0, 64));
  up->add_option(
        "--hosts", up_options->hosts,
        "spread the workers over N emulated hosts (worker i on host-(i mod N)), to try a multi-host cluster on one "
        "machine: checkpoint shards are then copied across hosts")
      ->check(CLI::Range(1, 64));
  up->add_flag("--salvage", up_options->salvage,
               "start daemons whose stores are damaged, keeping what is intact (strata-worker / strata-coordinator "
               "--salvage); without it a damaged store stops its daemon with a message naming it");
  up->add_option("--memory-limit", up_options->memory_limit,
                 "each worker uses at most this much memory, e.g. 8GiB (GPU: the allocator's cap; CPU: address space "
                 "the OS lets it add)");
  up->add_option("--net-interface", up_options->net_interface,
                 "network interface NCCL uses between hosts (each worker's --net-interface: sets NCCL_SOCKET_IFNAME); "
                 "see docs/multi-host.md");
  up->add_option("--heartbeat-timeout-ms", up_options->heartbeat_timeout_ms, "mark a silent worker lost after this")
      ->check(CLI::Range(200, 600000));
  up->add_option("--replace-grace-ms", up_options->replace_grace_ms,
                 "after a worker is lost, wait this long for a replacement before re-planning onto the workers present")
      ->check(CLI::Range(0, 3600000));
  up->add_option(
        "--grow-back-min-saving-s", up_options->grow_back_min_saving_s,
        "a run a lost worker made smaller takes idle workers back at its next checkpoint when that saves at least "
        "this many seconds over its remaining steps (-1: never)")
      ->check(CLI::Range(-1, 86400));
  up->add_option(
        "--peer-timeout-ms", up_options->peer_timeout_ms,
        "the hang watchdog: a rank waiting this long for a peer or a collective gives up and the rank that did "
        "not arrive is treated as lost")
      ->check(CLI::Range(500, 3600000));
  up->add_option(
        "--stuck-task-restart-ms", up_options->stuck_task_restart_ms,
        "a worker whose cancelled task has not stopped after this (stuck in a device call) restarts its process")
      ->check(CLI::Range(1000, 3600000));
  up->add_option("--inject-fault", up_options->inject_faults, "")->group("");  // tests only: worker/fault_injector.h

  auto down_grace_s = std::make_shared<int>(8);
  auto* down = set.Add("down", "stop the local cluster (state is kept); returns once its processes have exited",
                       [&g, down_grace_s] { return CmdDown(g, *down_grace_s); });
  down->add_option("--grace-s", *down_grace_s,
                   "seconds to wait after the shutdown request, and again after SIGTERM, before SIGKILL")
      ->check(CLI::Range(1, 3600));
}

}  // namespace strata::cli
