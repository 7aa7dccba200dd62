#include "cli/cli.h"

#include "shard/plan_summary.h"

#include <signal.h>
#include <fcntl.h>
#include <net/if.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "cli/activations_command.h"
#include "cli/api.h"
#include "cli/cluster_file.h"
#include "cli/version.h"
#include "cli/exit.h"
#include "cli/logs_command.h"
#include "cli/plan_command.h"
#include "cli/tokenize_command.h"
#include "cli/export.h"
#include "cli/text_data.h"
#include "model/hf_checkpoint.h"
#include "common/byte_size.h"
#include "common/curve.h"
#include "common/net.h"
#include "common/run_spec.h"
#include "client/coordinator_client.h"
#include "schema/envelope.h"
#include "shard/layout.h"

extern char** environ;

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;


struct GlobalOptions {
  std::string state_dir;
  std::string cluster;  // endpoint override
  int timeout_ms = 3000;
  std::string keys_dir;  // CURVE keys override (--keys, else $STRATA_KEYS, else STATE_DIR/keys)
};

// A ZeroMQ endpoint the client can connect to: tcp://HOST:PORT, ipc://PATH or inproc://NAME.
// Checked here because zmq's connect throws on anything else (an uncaught throw: exit 134).
Status ValidateEndpoint(const std::string& endpoint, const std::string& source) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(source + " " + EscapeForTerminal(endpoint) + " is not a coordinator address (" + why +
                           "); use tcp://HOST:PORT, ipc://PATH or inproc://NAME");
  };
  const size_t scheme_end = endpoint.find("://");
  if (scheme_end == std::string::npos) return bad("no scheme");
  const std::string scheme = endpoint.substr(0, scheme_end), rest = endpoint.substr(scheme_end + 3);
  if (scheme != "tcp" && scheme != "ipc" && scheme != "inproc") return bad("unknown scheme " + EscapeForTerminal(scheme) + "://");
  if (rest.empty()) return bad("nothing after " + scheme + "://");
  if (endpoint.find('\0') != std::string::npos) return bad("a NUL byte");
  if (scheme == "tcp") {
    const size_t colon = rest.rfind(':');
    const std::string port = colon == std::string::npos ? "" : rest.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) > 65535) {
      return bad("tcp:// needs HOST:PORT");
    }
  }
  return Status::Ok();
}

Result<std::string> ResolveEndpoint(const GlobalOptions& g) {
  if (!g.cluster.empty()) {
    STRATA_RETURN_IF_ERROR(ValidateEndpoint(g.cluster, "--cluster"));
    return g.cluster;
  }
  if (const char* env = std::getenv("STRATA_CLUSTER"); env && *env) {
    STRATA_RETURN_IF_ERROR(ValidateEndpoint(env, "STRATA_CLUSTER"));
    return std::string(env);
  }
  STRATA_ASSIGN_OR_RETURN(auto file, ReadClusterFile(g.state_dir));
  STRATA_RETURN_IF_ERROR(ValidateEndpoint(file.endpoint, "the endpoint in " + ClusterFilePath(g.state_dir)));
  return file.endpoint;
}

// The CURVE key directory: --keys, else $STRATA_KEYS, else STATE_DIR/keys (next to cluster.json)
// if it exists, else none (a local ipc:// cluster needs none).
std::string ResolveKeysDir(const GlobalOptions& g) {
  if (!g.keys_dir.empty()) return g.keys_dir;
  if (const char* env = std::getenv("STRATA_KEYS"); env && *env) return env;
  if (fs::exists(g.state_dir + "/keys/client.key")) return g.state_dir + "/keys";
  return "";
}

Result<std::unique_ptr<client::CoordinatorClient>> MakeClient(const GlobalOptions& g, const std::string& endpoint,
                                                                   int timeout_ms) {
  std::optional<curve::ClientKeys> keys;
  if (const std::string dir = ResolveKeysDir(g); !dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(keys, curve::LoadClientKeys(dir));
  }
  return std::make_unique<client::CoordinatorClient>(endpoint, timeout_ms, std::move(keys));
}

Result<CoordinatorAddress> ResolveCoordinator(const GlobalOptions& g) {
  CoordinatorAddress address;
  STRATA_ASSIGN_OR_RETURN(address.endpoint, ResolveEndpoint(g));
  if (const std::string dir = ResolveKeysDir(g); !dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(address.keys, curve::LoadClientKeys(dir));
  }
  address.timeout_ms = std::max(g.timeout_ms, 10000);  // reads of big chunks take longer than a status call
  return address;
}

Result<std::unique_ptr<schema::DecodedEnvelope>> Call(const GlobalOptions& g, schema::EnvelopeBuilder& request) {
  STRATA_ASSIGN_OR_RETURN(std::string endpoint, ResolveEndpoint(g));
  STRATA_ASSIGN_OR_RETURN(auto client, MakeClient(g, endpoint, g.timeout_ms));
  return client->Call(request);
}





// Names, ids and messages come from the coordinator's store (and from there from users and
// workers): printed escaped, so a stored name with escapes or newlines cannot drive the terminal.
std::string Printable(const std::string& text) { return EscapeForTerminal(text); }
std::string Printable(capnp::Text::Reader text) { return EscapeForTerminal(std::string(text.cStr(), text.size())); }

std::string FormatTime(int64_t unix_ms) {
  std::time_t t = unix_ms / 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  std::ostringstream s;
  s << std::put_time(&tm, "%Y-%m-%d %H:%M:%S");
  return s.str();
}

// with_plan: the [parallel] plan parsed from the run's stored spec (a TOML parse per run: a
// listing of 1,000 runs spent ~55 ms on it, so listings leave it to `strata status RUN`).
json RunToJson(RunRecord::Reader r, bool with_plan = true) {
  json losses = json::array();
  for (double l : r.getLosses()) losses.push_back(l);
  json workers = json::array();
  for (auto w : r.getWorkers()) workers.push_back(w.cStr());
  json memory = json::array();
  for (auto m : r.getMemory()) {
    memory.push_back({{"worker", m.getWorker().cStr()}, {"estimate_bytes", m.getEstimateBytes()},
                      {"workspace_bytes", m.getWorkspaceBytes()}, {"measured_peak_bytes", m.getMeasuredPeakBytes()}});
  }
  json handled = json::object();
  for (auto h : r.getHandled()) handled[h.getKind().cStr()] = h.getCount();
  // The plan the run has now (after any re-planning): the [parallel] fields of its stored spec.
  json plan = json::object();
  if (auto spec = with_plan ? ParseStoredRunSpec(r.getSpecToml().cStr()) : Result<RunSpec>(InvalidArgument("not asked for"));
      spec.ok() && !spec->is_extract()) {
    const shard::PlanSummary p = shard::SummarizePlan(*spec);  // stages: layers per pipeline stage, as the ranks run them
    plan = {{"dp", p.dp}, {"pp", p.pp}, {"tp", p.tp}, {"zero", p.zero}, {"micro_batch", p.micro_batch},
            {"gradient_accumulation", p.gradient_accumulation}, {"recompute", p.recompute},
            {"stages", p.stages}, {"planned", p.planned}};
  }
  return {{"memory", memory}, {"handled", handled}, {"plan", plan}, {"run_id", r.getRunId().cStr()},     {"name", r.getName().cStr()}, {"kind", r.getKind().cStr()},
          {"state", schema::RunStateName(r.getState())}, {"step", r.getStep()},
          {"total_steps", r.getTotalSteps()},  {"world_size", r.getWorldSize()},
          {"losses", losses},                  {"workers", workers},
          {"message", r.getMessage().cStr()},  {"tokens_per_second", r.getTokensPerSecond()},
          {"created_unix_ms", r.getCreatedUnixMs()}, {"updated_unix_ms", r.getUpdatedUnixMs()}};
}

// 64-bit checksums as hex strings: JSON numbers lose precision above 2^53 in most readers.
std::string ToHex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

json CheckpointToJson(CheckpointManifest::Reader m) {
  json shards = json::array();
  uint64_t bytes = 0;
  size_t tensors = 0;
  for (auto shard : m.getShards()) {
    json list = json::array();
    for (auto t : shard.getTensors()) {
      json shape = json::array();
      for (auto d : t.getShape()) shape.push_back(d);
      list.push_back({{"name", t.getName().cStr()},
                      {"dtype", schema::DTypeName(t.getDtype())},
                      {"shape", shape},
                      {"checksum", ToHex(t.getChecksum())},
                      {"size_bytes", t.getSizeBytes()}});
      bytes += t.getSizeBytes();
      ++tensors;
    }
    shards.push_back({{"store_path", shard.getStorePath().cStr()}, {"tensors", list}});
  }
  return {{"run_id", m.getRunId().cStr()},
          {"step", m.getStep()},
          {"committed_unix_ms", m.getCommittedUnixMs()},
          {"tensor_count", tensors},
          {"size_bytes", bytes},
          {"shards", shards}};
}

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

Result<int> CountLiveWorkers(const GlobalOptions& g, const std::string& endpoint) {
  STRATA_ASSIGN_OR_RETURN(auto client, MakeClient(g, endpoint, 1000));
  schema::EnvelopeBuilder req;
  req.root().setWorkersRequest();
  STRATA_ASSIGN_OR_RETURN(auto reply, client->Call(req));
  int live = 0;
  for (auto w : reply->root().getWorkersReply().getWorkers()) live += w.getState() != WorkerState::LOST;
  return live;
}

// gpus > 0: one worker per GPU (cuda:0..gpus-1) instead of CPU workers.
struct UpOptions {
  int workers = 2, gpus = 0, hosts = 1;
  int heartbeat_timeout_ms = 2000, replace_grace_ms = 10000, peer_timeout_ms = 120000, stuck_task_restart_ms = 30000;
  int grow_back_min_saving_s = 30;
  std::string memory_limit;
  std::string net_interface;  // passed to every worker (strata-worker --net-interface)
  bool salvage = false;  // start daemons whose stores are damaged, keeping what is intact
  std::vector<std::string> inject_faults;  // tests only: passed to every worker (worker/fault_injector.h)
};

int CmdUp(GlobalOptions& g, const UpOptions& up) {
  // Every flag is checked before anything starts: a worker refusing its flag after the
  // coordinator is up would leave a coordinator running for nothing.
  if (!up.memory_limit.empty()) {
    auto limit = ParseByteSize(up.memory_limit, "--memory-limit");
    if (!limit.ok()) return Fail(limit.status());
    if (*limit == 0) return Fail(InvalidArgument("--memory-limit " + up.memory_limit + " is 0; give a size such as 8GiB, or leave it out"));
  }
  if (!up.net_interface.empty() && if_nametoindex(up.net_interface.c_str()) == 0) {
    return Fail(InvalidArgument("--net-interface " + up.net_interface + ": this host has no such network interface; name "
                                "one it has (list them with `ip -br addr`), or leave the flag out"));
  }
  if (up.hosts > (up.gpus > 0 ? up.gpus : up.workers)) {
    return Fail(InvalidArgument("--hosts " + std::to_string(up.hosts) + " is more than the " +
                                std::to_string(up.gpus > 0 ? up.gpus : up.workers) + " workers; a host needs a worker"));
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
  if (const std::string keys = ResolveKeysDir(g); !keys.empty()) {
    if (!fs::exists(keys + "/coordinator.key")) {
      return Fail(InvalidArgument("the key directory " + keys + " has no coordinator.key, so a local coordinator "
                                  "cannot use it; unset STRATA_KEYS / drop --keys, or make one with `strata keygen`"));
    }
    keys_args = {"--keys", fs::absolute(keys).string()};
  }
  const std::string bin = BinaryDir();
  int started = 0;
  std::vector<int> started_pids;
  ClusterProcess* coord = find("coordinator");
  if (!IsStrataProcess(coord->pid)) {
    std::vector<std::string> argv = {bin + "/strata-coordinator", "--listen", file.endpoint, "--state-dir",
                                     dir + "/coordinator", "--heartbeat-timeout-ms", std::to_string(up.heartbeat_timeout_ms),
                                     "--replace-grace-ms", std::to_string(up.replace_grace_ms), "--grow-back-min-saving-s",
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
    if (IsStrataProcess(p->pid)) continue;
    std::vector<std::string> argv = {bin + "/strata-worker", "--name", name, "--coordinator", file.endpoint,
                                     "--store", dir + "/workers/" + name, "--data-address",
                                     "ipc://" + dir + "/" + name + ".data.sock", "--serve-address",
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
    return Fail(Status(st.code(), st.message() + (started_pids.empty() ? "" : "; the processes this call started were stopped")));
  }
  // Wait until the coordinator answers and every worker has registered.
  const int64_t deadline = net::SteadyMs() + 60000;
  int live = 0;
  while (net::SteadyMs() < deadline) {
    auto count = CountLiveWorkers(g, file.endpoint);
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
  if (!file.http.empty()) std::cout << "dashboard: " << file.http << " (token for actions: " << dir << "/http.token)" << std::endl;
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
    std::cerr << "strata: " << file.status().message() << "; stopping the " << found.size()
              << " process(es) of " << dir << " found running" << std::endl;
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
    auto client = MakeClient(g, file->endpoint, 2000);
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
    if (IsStrataProcess(p.pid)) survivors += (survivors.empty() ? "" : ", ") + p.name + " (pid " + std::to_string(p.pid) + ")";
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

// ------------------------------------------------------------------ queries

int CmdWorkers(GlobalOptions& g, bool as_json) {
  schema::EnvelopeBuilder req;
  req.root().setWorkersRequest();
  auto reply = Call(g, req);
  if (!reply.ok()) return Fail(reply.status());
  auto list = (*reply)->root().getWorkersReply().getWorkers();
  if (as_json) {
    json out = json::array();
    for (auto w : list) {
      auto m = w.getMemory();
      out.push_back({{"worker_id", w.getWorkerId().cStr()},
                     {"state", schema::WorkerStateName(w.getState())},
                     {"host", w.getHost().cStr()},
                     {"pid", w.getPid()},
                     {"device", m.getDevice().cStr()},
                     {"memory", {{"total_bytes", m.getTotalBytes()}, {"free_bytes", m.getFreeBytes()},
                                 {"allocated_bytes", m.getAllocatedBytes()}, {"reserved_bytes", m.getReservedBytes()},
                                 {"peak_bytes", m.getPeakBytes()}}},
                     {"store_path", w.getStorePath().cStr()},
                     {"current_run", w.getCurrentRun().cStr()},
                     {"last_heartbeat_ms_ago", w.getLastHeartbeatMsAgo()}});
    }
    std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return kExitOk;
  }
  std::printf("%-12s %-6s %-8s %-7s %-11s %-11s %-10s %s\n", "WORKER", "STATE", "PID", "DEVICE", "ALLOCATED", "FREE",
              "HEARTBEAT", "RUN");
  for (auto w : list) {
    auto m = w.getMemory();
    std::printf("%-12s %-6s %-8u %-7s %-11s %-11s %-10s %s\n", Printable(w.getWorkerId()).c_str(), schema::WorkerStateName(w.getState()),
                w.getPid(), Printable(m.getDevice()).c_str(), HumanBytes(m.getAllocatedBytes()).c_str(),
                HumanBytes(m.getFreeBytes()).c_str(), (std::to_string(w.getLastHeartbeatMsAgo()) + " ms").c_str(),
                Printable(w.getCurrentRun()).c_str());
  }
  return kExitOk;
}

// last_loss_only: each run's losses holds at most its last loss (what listings show).
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchStatus(const GlobalOptions& g, const std::string& run,
                                                            bool last_loss_only = false) {
  schema::EnvelopeBuilder req;
  auto status = req.root().initStatusRequest();
  status.setRunId(run);
  status.setLastLossOnly(last_loss_only);
  return Call(g, req);
}

Result<std::unique_ptr<schema::DecodedEnvelope>> FetchEvents(const GlobalOptions& g, const std::string& run) {
  schema::EnvelopeBuilder req;
  req.root().initEventsRequest().setRunId(run);
  return Call(g, req);
}

Result<std::unique_ptr<schema::DecodedEnvelope>> FetchCheckpoints(const GlobalOptions& g, const std::string& run) {
  schema::EnvelopeBuilder req;
  req.root().initCheckpointsRequest().setRunId(run);
  return Call(g, req);
}

// What a user may type for RUN: a run id, a unique prefix of one, a run name (names repeat
// across submits: the newest run of that name), or `latest` (the newest run of all). Resolved
// from one status listing, in that order; text that matches nothing is passed on unchanged so the
// coordinator's own "no such run" answers. An id prefix that matches several runs is refused
// (exit 2) listing them: guessing there could cancel or export the wrong run.
Result<std::string> ResolveRun(const GlobalOptions& g, const std::string& text) {
  if (text.empty()) return text;
  STRATA_ASSIGN_OR_RETURN(auto reply, FetchStatus(g, "", /*last_loss_only=*/true));
  auto runs = reply->root().getStatusReply().getRuns();
  struct Candidate {
    std::string id;
    int64_t created;
  };
  std::vector<Candidate> named, prefixed;
  std::optional<Candidate> newest;
  for (auto r : runs) {
    Candidate c{r.getRunId().cStr(), r.getCreatedUnixMs()};
    if (c.id == text) return c.id;
    if (!newest || c.created > newest->created) newest = c;
    if (std::string(r.getName().cStr()) == text) named.push_back(c);
    if (c.id.rfind(text, 0) == 0) prefixed.push_back(c);
  }
  auto by_newest = [](const Candidate& a, const Candidate& b) { return a.created > b.created; };
  if (text == "latest") {
    if (!newest) return NotFound("`latest` names the newest run, and there are no runs yet; `strata submit SPEC` starts one");
    return newest->id;
  }
  if (!named.empty()) {
    std::sort(named.begin(), named.end(), by_newest);
    if (named.size() > 1) {
      std::cerr << "strata: " << Printable(text) << " names " << named.size() << " runs; using the newest, "
                << Printable(named[0].id) << " (give a run id for another; `strata status` lists them)" << std::endl;
    }
    return named[0].id;
  }
  if (prefixed.size() == 1) return prefixed[0].id;
  if (prefixed.size() > 1) {
    std::sort(prefixed.begin(), prefixed.end(), by_newest);
    std::string list;
    for (const auto& c : prefixed) list += "\n  " + Printable(c.id);
    return InvalidArgument("run " + Printable(text) + " is ambiguous: it begins " + std::to_string(prefixed.size()) +
                           " run ids; give more of the id (newest first):" + list);
  }
  return text;
}

// One run: everything, its whole loss history and checkpoint steps included. All runs: a listing
// without loss histories or checkpoint steps, one request to the coordinator however many runs
// there are (with 450 runs, whole histories and a checkpoints request per run took 611 ms).
// `strata status [RUN] --json`: one run's object, or the array of all runs.
Result<json> StatusJson(const GlobalOptions& g, const std::string& run) {
  STRATA_ASSIGN_OR_RETURN(auto reply, FetchStatus(g, run, /*last_loss_only=*/run.empty()));
  auto runs = reply->root().getStatusReply().getRuns();
  json out = json::array();
  for (auto r : runs) {
    json entry = RunToJson(r, /*with_plan=*/!run.empty());
    auto losses = r.getLosses();
    entry["loss"] = losses.size() > 0 ? json(losses[losses.size() - 1]) : json(nullptr);
    if (run.empty()) {
      entry.erase("losses");
      entry.erase("plan");
      out.push_back(std::move(entry));
      continue;
    }
    // Checkpoints ride along so one call shows everything a user checks after a restart.
    json steps = json::array();
    if (auto c = FetchCheckpoints(g, r.getRunId().cStr()); c.ok()) {
      for (auto m : (*c)->root().getCheckpointsReply().getCheckpoints()) steps.push_back(m.getStep());
    }
    entry["checkpoint_steps"] = steps;
    out.push_back(entry);
  }
  if (!run.empty() && out.empty()) return NotFound("no run " + run);
  return run.empty() ? out : out[0];
}

// `strata events RUN --json`.
Result<json> EventsJson(const GlobalOptions& g, const std::string& run) {
  STRATA_ASSIGN_OR_RETURN(auto reply, FetchEvents(g, run));
  json out = json::array();
  for (auto e : reply->root().getEventsReply().getEvents()) {
    out.push_back({{"unix_ms", e.getUnixMs()}, {"kind", e.getKind().cStr()}, {"message", e.getMessage().cStr()}});
  }
  return out;
}

int CmdStatus(GlobalOptions& g, const std::string& run, bool as_json, bool with_losses) {
  if (with_losses && run.empty()) {
    return Fail(InvalidArgument("--losses needs a run: the listing of all runs carries each run's last loss only; "
                                "use `strata status RUN --json --losses`"));
  }
  if (as_json) {
    auto out = StatusJson(g, run);
    if (!out.ok()) return Fail(out.status());
    std::cout << out->dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return kExitOk;
  }
  auto reply = FetchStatus(g, run, /*last_loss_only=*/run.empty());
  if (!reply.ok()) return Fail(reply.status());
  auto runs = (*reply)->root().getStatusReply().getRuns();
  std::printf("%-28s %-10s %-13s %-10s %-12s %s\n", "RUN", "STATE", "STEP", "LOSS", "TOKENS/S", "WORKERS");
  for (auto r : runs) {
    auto losses = r.getLosses();
    std::string workers;
    for (auto w : r.getWorkers()) workers += (workers.empty() ? "" : ",") + Printable(w);
    char loss[32] = "-";
    if (losses.size() > 0) std::snprintf(loss, sizeof(loss), "%.4f", losses[losses.size() - 1]);
    std::printf("%-28s %-10s %-13s %-10s %-12.0f %s\n", Printable(r.getRunId()).c_str(), schema::RunStateName(r.getState()),
                (std::to_string(r.getStep()) + "/" + std::to_string(r.getTotalSteps())).c_str(), loss,
                r.getTokensPerSecond(), workers.c_str());
    if (r.getMessage().size() > 0) std::printf("  %s\n", Printable(r.getMessage()).c_str());
    if (run.empty()) continue;  // one run asked for: its plan and what it got through too
    const json j = RunToJson(r);
    if (!j["plan"].empty()) {
      const json& p = j["plan"];
      std::printf("  plan: dp=%lld pp=%lld tp=%lld, ZeRO-%lld, micro-batch %lld x %lld accumulation, recompute %s\n",
                  p["dp"].get<long long>(), p["pp"].get<long long>(), p["tp"].get<long long>(), p["zero"].get<long long>(),
                  p["micro_batch"].get<long long>(), p["gradient_accumulation"].get<long long>(), p["recompute"].get<bool>() ? "on" : "off");
    }
    std::string handled;
    for (auto& [kind, count] : j["handled"].items()) handled += (handled.empty() ? "" : ", ") + kind + " " + std::to_string(count.get<int>());
    if (!handled.empty()) std::printf("  handled: %s (`strata events %s` for each)\n", Printable(handled).c_str(), Printable(r.getRunId()).c_str());
  }
  return kExitOk;
}

int CmdEvents(GlobalOptions& g, const std::string& run, bool as_json) {
  if (as_json) {
    auto out = EventsJson(g, run);
    if (!out.ok()) return Fail(out.status());
    std::cout << out->dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return kExitOk;
  }
  auto reply = FetchEvents(g, run);
  if (!reply.ok()) return Fail(reply.status());
  auto events = (*reply)->root().getEventsReply().getEvents();
  for (auto e : events) {
    std::printf("%s  %-22s %s\n", FormatTime(e.getUnixMs()).c_str(), Printable(e.getKind()).c_str(), Printable(e.getMessage()).c_str());
  }
  return kExitOk;
}

// A checkpoint's state: "complete", or why it cannot be resumed from ("missing-shard": a
// worker's store no longer holds a shard of it; "unreadable": a rank could not read it).
std::pair<std::string, std::string> CheckpointState(CheckpointsReply::Reader reply, unsigned i) {
  const std::string why = i < reply.getUnreadable().size() ? reply.getUnreadable()[i].cStr() : "";
  if (why.empty()) return {"complete", ""};
  return {why.rfind("missing shard", 0) == 0 ? "missing-shard" : "unreadable", why};
}

int CmdCheckpoints(GlobalOptions& g, const std::string& run, bool as_json) {
  auto reply = FetchCheckpoints(g, run);
  if (!reply.ok()) return Fail(reply.status());
  auto checkpoints = (*reply)->root().getCheckpointsReply();
  auto list = checkpoints.getCheckpoints();
  if (as_json) {
    json out = json::array();
    for (unsigned i = 0; i < list.size(); ++i) {
      json entry = CheckpointToJson(list[i]);
      const auto [state, why] = CheckpointState(checkpoints, i);
      entry["state"] = state;
      if (!why.empty()) entry["why"] = why;
      out.push_back(entry);
    }
    std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return kExitOk;
  }
  std::printf("%-8s %-14s %-8s %-8s %-12s %s\n", "STEP", "STATE", "SHARDS", "TENSORS", "SIZE", "COMMITTED");
  for (unsigned i = 0; i < list.size(); ++i) {
    auto m = list[i];
    json j = CheckpointToJson(m);
    const auto [state, why] = CheckpointState(checkpoints, i);
    std::printf("%-8ld %-14s %-8u %-8zu %-12s %s\n", static_cast<long>(m.getStep()), state.c_str(), m.getShards().size(),
                j["tensor_count"].get<size_t>(), HumanBytes(j["size_bytes"].get<uint64_t>()).c_str(),
                FormatTime(m.getCommittedUnixMs()).c_str());
    if (!why.empty()) std::printf("  %s\n", why.c_str());
  }
  if (list.size() == 0) std::printf("(no complete checkpoint yet)\n");
  return kExitOk;
}

int CmdCancel(GlobalOptions& g, const std::string& run) {
  schema::EnvelopeBuilder req;
  req.root().initCancelRun().setRunId(run);
  auto reply = Call(g, req);
  if (!reply.ok()) return Fail(reply.status());
  std::cout << "cancelled " << run << std::endl;
  return kExitOk;
}

// Client-side progress of one run: rate from the steps seen while watching, ETA from it.
class ProgressTracker {
 public:
  // "step  120/200  loss 2.4312  3210 tok/s  ETA 0:25  dp=2 pp=2 on worker-0,...,worker-3"
  std::string Line(RunRecord::Reader r) {
    const int64_t now = net::SteadyMs();
    const int64_t step = r.getStep();
    if (first_step_ < 0 || step < first_step_) {
      first_step_ = step;
      first_ms_ = now;
    }
    auto losses = r.getLosses();
    std::string workers;
    for (auto w : r.getWorkers()) workers += (workers.empty() ? "" : ",") + Printable(w);
    char buf[512];
    const std::string kind = r.getKind().cStr();
    const bool extract = kind == "extract" || kind == "patch";  // steps count stored chunks
    int n = std::snprintf(buf, sizeof(buf), "%s %5ld/%ld", extract ? "chunk" : "step", static_cast<long>(step),
                          static_cast<long>(r.getTotalSteps()));
    if (losses.size() > 0) n += std::snprintf(buf + n, sizeof(buf) - n, "  loss %.4f", losses[losses.size() - 1]);
    if (r.getTokensPerSecond() > 0) n += std::snprintf(buf + n, sizeof(buf) - n, "  %.0f tok/s", r.getTokensPerSecond());
    if (step > first_step_ && step < r.getTotalSteps()) {
      const double ms_per_step = double(now - first_ms_) / double(step - first_step_);
      const int64_t eta_s = static_cast<int64_t>(ms_per_step * (r.getTotalSteps() - step) / 1000.0);
      n += std::snprintf(buf + n, sizeof(buf) - n, "  ETA %ld:%02ld", static_cast<long>(eta_s / 60),
                         static_cast<long>(eta_s % 60));
    }
    // Train runs show their mesh (it changes when a lost worker makes the run re-plan).
    std::string mesh = (extract ? "workers=" : "dp=") + std::to_string(r.getWorldSize());
    if (!extract) {
      auto spec = ParseStoredRunSpec(r.getSpecToml().cStr());
      if (spec.ok() && !spec->parallel.planned()) {
        mesh = "mesh planned when it starts";
      } else if (spec.ok()) {
        const ParallelSpec& p = spec->parallel;
        mesh = "dp=" + std::to_string(p.dp) + (p.pp > 1 ? " pp=" + std::to_string(p.pp) : "") +
               (p.tp > 1 ? " tp=" + std::to_string(p.tp) : "") + (p.zero > 0 ? " zero=" + std::to_string(p.zero) : "");
      }
    }
    std::snprintf(buf + n, sizeof(buf) - n, "  %s%s%s", mesh.c_str(), workers.empty() ? "" : " on ", workers.c_str());
    return buf;
  }

 private:
  int64_t first_step_ = -1;
  int64_t first_ms_ = 0;
};

// Polls the run until it ends, printing events as they happen and its progress: on a terminal
// one live line, rewritten in place; into a pipe or file (a log) a line every `every_s` seconds
// or every 5% of the steps, whichever comes first, and the last step. 0 iff it finished.
int Follow(GlobalOptions& g, const std::string& run, int every_s) {
  const bool tty = isatty(STDOUT_FILENO);
  ProgressTracker progress;
  int64_t printed_step = 0, printed_ms = net::SteadyMs();
  size_t printed_events = 0;
  int failures = 0, pending_polls = 0;
  bool waiting_noted = false, live_line = false;
  auto clear_live = [&] {
    if (live_line) std::printf("\r\033[K");
    live_line = false;
  };
  while (true) {
    auto reply = FetchStatus(g, run);
    if (!reply.ok()) {
      if (++failures > 10) return Fail(reply.status());  // tolerate a coordinator restart
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    failures = 0;
    auto r = (*reply)->root().getStatusReply().getRuns()[0];
    if (auto ev = FetchEvents(g, run); ev.ok()) {
      auto events = (*ev)->root().getEventsReply().getEvents();
      for (; printed_events < events.size(); ++printed_events) {
        clear_live();
        std::printf("[%s] %s\n", Printable(events[printed_events].getKind()).c_str(), Printable(events[printed_events].getMessage()).c_str());
      }
    }
    const std::string line = progress.Line(r);
    if (tty) {
      clear_live();
      std::printf("%s", line.c_str());
      live_line = true;
    } else {
      const int64_t every = std::max<int64_t>(1, r.getTotalSteps() / 20);  // 5%
      const int64_t now = net::SteadyMs();
      if (r.getStep() > printed_step && (r.getStep() - printed_step >= every || now - printed_ms >= every_s * 1000LL ||
                                         r.getStep() == r.getTotalSteps())) {
        std::printf("%s\n", line.c_str());
        printed_step = r.getStep();
        printed_ms = now;
      }
    }
    std::fflush(stdout);
    const RunState state = r.getState();
    if (state == RunState::PENDING && !waiting_noted && ++pending_polls > 10) {
      waiting_noted = true;
      clear_live();
      std::printf("waiting: the run needs %u idle worker(s); `strata workers` shows who is busy or lost\n",
                  r.getWorldSize());
    }
    if (state == RunState::FINISHED || state == RunState::FAILED || state == RunState::CANCELLED) {
      if (tty) std::printf("\n");
      if (state == RunState::FINISHED) {
        if (const std::string kind = r.getKind().cStr(); kind == "extract" || kind == "patch") {
          std::printf("run %s finished: %ld chunks stored, %.0f tokens/s; `strata activations %s` lists them\n", run.c_str(),
                      static_cast<long>(r.getStep()), r.getTokensPerSecond(), run.c_str());
        } else {
          std::printf("run %s finished: %ld steps, %.0f tokens/s on the last step\n", run.c_str(),
                      static_cast<long>(r.getStep()), r.getTokensPerSecond());
        }
        return kExitOk;
      }
      std::printf("run %s %s: %s\n", Printable(run).c_str(), schema::RunStateName(state), Printable(r.getMessage()).c_str());
      return kExitFailure;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

// `status --watch` without a run: a header, then one line per active (pending or running) run, or
// per run with `all`, until interrupted or no run is active. On a terminal the screen is
// redrawn each second; into a pipe or file a block every 5 s.
int WatchAll(GlobalOptions& g, bool all) {
  std::map<std::string, ProgressTracker> trackers;
  const bool tty = isatty(STDOUT_FILENO);
  while (true) {
    auto reply = FetchStatus(g, "", /*last_loss_only=*/true);
    if (!reply.ok()) return Fail(reply.status());
    auto runs = (*reply)->root().getStatusReply().getRuns();
    if (tty) std::printf("\033[H\033[2J");
    std::printf("%-28s %-10s %s\n", "RUN", "STATE", "PROGRESS");
    int active = 0;
    for (auto r : runs) {
      const bool is_active = r.getState() == RunState::PENDING || r.getState() == RunState::RUNNING;
      active += is_active;
      if (!is_active && !all) continue;
      const std::string line = trackers[r.getRunId().cStr()].Line(r);
      std::printf("%-28s %-10s %s\n", Printable(r.getRunId()).c_str(), schema::RunStateName(r.getState()), line.c_str());
    }
    if (active == 0) std::printf("(no active run%s)\n", all ? "" : "; `strata status` or `--watch --all` shows the ended ones");
    std::fflush(stdout);
    if (active == 0) return kExitOk;
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 1000 : 5000));
  }
}

// `--resume RUN[@STEP]`: the run id and step (0 = its latest complete checkpoint).
Result<std::pair<std::string, int64_t>> ParseResume(const std::string& text) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos) return std::make_pair(text, int64_t{0});
  const std::string step = text.substr(at + 1);
  if (step.empty() || step.find_first_not_of("0123456789") != std::string::npos || std::stoll(step) <= 0) {
    return InvalidArgument("--resume " + text + ": the step after @ must be a positive number, e.g. --resume " +
                           text.substr(0, at) + "@6 (or leave it out for the latest checkpoint)");
  }
  return std::make_pair(text.substr(0, at), static_cast<int64_t>(std::stoll(step)));
}

struct SubmitOptions {
  bool follow = false;
  bool skip_estimate = false;
  bool queue = false;  // a fixed mesh larger than the live cluster waits for workers instead of being refused
  std::string resume;
  int progress_every_s = 10;
};

// Checks, prepares and submits the spec at `path`; the run id. The estimate goes to stderr.
// `path` names the spec in messages; relative paths in it are taken from `base`.
Result<std::string> SubmitSpecText(const GlobalOptions& g, const std::string& text, const std::string& base,
                                   const std::string& path, const SubmitOptions& o) {
  const std::string& resume = o.resume;
  auto spec = ParseRunSpec(text, base, /*check_files=*/true);
  if (!spec.ok()) return InvalidArgument(path + ": " + spec.status().message());
  if (!spec->model.init_from.empty()) {  // the weights' headers, before anything starts
    if (Status weights = model::CheckHfCheckpoint(spec->model.init_from, spec->model); !weights.ok()) {
      return InvalidArgument(path + ": " + weights.message());
    }
  }
  // data.format = "text": tokenized once into a cached u32 file, which the run then reads.
  if (Status text_data = PrepareTextData(&*spec, g.state_dir, o.progress_every_s); !text_data.ok()) {
    return text_data.code() == StatusCode::kInvalidArgument ? InvalidArgument(path + ": " + text_data.message()) : text_data;
  }
  std::pair<std::string, int64_t> resume_from;
  if (!resume.empty()) {
    STRATA_ASSIGN_OR_RETURN(resume_from, ParseResume(resume));
  }
  STRATA_ASSIGN_OR_RETURN(std::string endpoint_text, ResolveEndpoint(g));
  const std::string* endpoint = &endpoint_text;
  if (!resume_from.first.empty()) {
    STRATA_ASSIGN_OR_RETURN(resume_from.first, ResolveRun(g, resume_from.first));
  }
  // A fixed mesh needs dp x pp x tp workers at once: more than the cluster has would wait
  // forever unless workers come, so that takes --queue.
  if (const ParallelSpec& p = spec->parallel;
      !spec->is_extract() && !p.automatic.count("dp") && !p.automatic.count("pp") && !p.automatic.count("tp") && !o.queue) {
    STRATA_ASSIGN_OR_RETURN(auto live, CountLiveWorkers(g, *endpoint));
    if (p.workers() > live) {
      return InvalidArgument(
          path + ": parallel.dp x parallel.pp x parallel.tp = " + std::to_string(p.dp) + " x " + std::to_string(p.pp) + " x " +
          std::to_string(p.tp) + " = " + std::to_string(p.workers()) + " workers, but the cluster has " + std::to_string(live) +
          " live; lower them or set them to \"auto\", start more workers (`strata up --workers N`), or pass --queue to "
          "submit it to wait for workers");
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto client, MakeClient(g, *endpoint, g.timeout_ms));
  // The estimate goes to stderr: stdout's first line stays the run id, for scripts.
  auto estimate = EstimateForSubmit(*spec, *client);
  if (!estimate.ok() && !o.skip_estimate) return estimate.status();
  if (!estimate.ok()) {
    std::string why = estimate.status().message();
    if (why.rfind("not submitted: ", 0) == 0) why = why.substr(15);
    std::cerr << "strata: submitting anyway (--skip-estimate): " << why
              << "; a rank that runs out of memory makes the run re-plan (smaller micro-batch first) and replay the step" << std::endl;
  } else if (!estimate->empty()) {
    std::cerr << "strata: " << *estimate << std::endl;
  }
  schema::EnvelopeBuilder req;
  auto submit = req.root().initSubmitRun();
  submit.setSpecToml(RunSpecToToml(*spec));
  submit.setResumeRun(resume_from.first);
  submit.setResumeStep(resume_from.second);
  STRATA_ASSIGN_OR_RETURN(auto reply, client->Call(req));
  return std::string(reply->root().getSubmitted().getRunId().cStr());
}

Result<std::string> SubmitSpecFile(const GlobalOptions& g, const std::string& path, const SubmitOptions& o) {
  // A regular file of at most 1 MiB: not /dev/zero, not a FIFO.
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadSpecFile(path, "run spec"));
  return SubmitSpecText(g, text, fs::absolute(path).parent_path().string(), path, o);
}

int CmdSubmit(GlobalOptions& g, const std::string& path, const SubmitOptions& o) {
  auto submitted = SubmitSpecFile(g, path, o);
  if (!submitted.ok()) return Fail(submitted.status());
  const std::string run = *submitted;
  std::cout << Printable(run) << std::endl;
  if (!o.follow) return kExitOk;
  return Follow(g, run, o.progress_every_s);
}

// `step` empty: the latest complete checkpoint. Writes into `out_dir` only if it is new or empty,
// or with `force` (which replaces its config.json and model.safetensors, nothing else).
int CmdExport(GlobalOptions& g, const std::string& typed_run, std::optional<int64_t> step, const std::string& out_dir,
              bool force, const ExportOptions& options) {
  if (step && *step < 0) {
    return Fail(InvalidArgument("--step " + std::to_string(*step) + " is not a checkpoint step; give a step that `strata checkpoints " +
                                typed_run + "` lists, or leave --step out for the latest"));
  }
  std::error_code ec;
  const fs::file_status out_status = fs::status(out_dir, ec);
  if (fs::exists(out_status) && !fs::is_directory(out_status)) {
    return Fail(InvalidArgument("--out " + out_dir + " exists and is not a directory; export writes a directory "
                                "(config.json + model.safetensors), choose a new path"));
  }
  if (fs::is_directory(out_status) && !force && !fs::is_empty(out_dir, ec)) {
    return Fail(InvalidArgument("--out " + out_dir + " is not empty; export into a new or empty directory, or pass --force "
                                "to replace its config.json and model.safetensors"));
  }
  auto id = ResolveRun(g, typed_run);  // a name, an id prefix or `latest`: after the checks that need no cluster
  if (!id.ok()) return Fail(id.status());
  const std::string& run = *id;
  auto status = FetchStatus(g, run);
  if (!status.ok()) return Fail(status.status());
  const std::string spec_toml = (*status)->root().getStatusReply().getRuns()[0].getSpecToml().cStr();
  auto reply = FetchCheckpoints(g, run);
  if (!reply.ok()) return Fail(reply.status());
  auto list = (*reply)->root().getCheckpointsReply().getCheckpoints();
  if (list.size() == 0) return Fail(NotFound("run " + run + " has no complete checkpoint yet"));
  std::string steps;
  for (unsigned i = 0; i < list.size(); ++i) {
    auto m = list[i];
    if (!step ? m.getStep() == list[list.size() - 1].getStep() : m.getStep() == *step) {
      if (const auto [state, why] = CheckpointState((*reply)->root().getCheckpointsReply(), i); !why.empty()) {
        return Fail(Corruption("the checkpoint of run " + Printable(run) + " at step " + std::to_string(m.getStep()) + " is " +
                               state + ": " + why + "; `strata checkpoints` lists the complete ones"));
      }
      auto summary = ExportCheckpoint(spec_toml, m, out_dir, options);
      if (!summary.ok()) return Fail(summary.status());
      std::printf("exported run %s step %ld: %zu tensors (%s, %s) in %zu file%s to %s", Printable(run).c_str(), static_cast<long>(m.getStep()),
                  summary->tensors, HumanBytes(summary->bytes).c_str(), options.dtype.c_str(), summary->files,
                  summary->files == 1 ? "" : "s", out_dir.c_str());
      if (summary->companion_files > 0) std::printf(" (+%zu tokenizer/config files from init_from)", summary->companion_files);
      std::printf("\n");
      return kExitOk;
    }
    steps += (steps.empty() ? "" : ", ") + std::to_string(m.getStep());
  }
  return Fail(InvalidArgument("--step " + std::to_string(*step) + ": run " + run +
                              " has no complete checkpoint there; complete ones are at steps " + steps));
}

}  // namespace

std::string VersionText() {
  return std::string("strata ") + STRATA_VERSION + " (git " + STRATA_GIT_REVISION + ")\nLibTorch " + STRATA_TORCH_VERSION +
         " (the workers'; the CLI does not link it), CUDA " + STRATA_CUDA_VERSION;
}

// A bash completion script made from the parser itself, so it never drifts from the commands:
// subcommand names, and each (sub)command's long options. Global options complete everywhere.
std::string BashCompletion(const CLI::App& app) {
  auto option_names = [](const CLI::App& a) {
    std::string names;
    for (const CLI::Option* o : a.get_options()) {
      for (const std::string& n : o->get_lnames()) names += " --" + n;
      for (const std::string& n : o->get_snames()) names += " -" + n;
    }
    return names;
  };
  auto sub_names = [](const CLI::App& a) {
    std::string names;
    for (const CLI::App* sub : a.get_subcommands({})) names += " " + sub->get_name();
    return names;
  };
  std::ostringstream s;
  s << "# bash completion for strata, made by `strata completion bash`; load it with\n"
    << "#   source <(strata completion bash)\n"
    << "_strata() {\n"
    << "  local cur=${COMP_WORDS[COMP_CWORD]} path= w i\n"
    << "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
    << "    w=${COMP_WORDS[i]}\n"
    << "    case \"$path $w\" in\n";
  std::string cases;
  std::ostringstream words;
  // Each command path ("", " submit", " activations get") and the words that complete after it.
  std::function<void(const CLI::App&, const std::string&)> walk = [&](const CLI::App& a, const std::string& path) {
    for (const CLI::App* sub : a.get_subcommands({})) {
      s << "      \"" << path << " " << sub->get_name() << "\") path=\"" << path << " " << sub->get_name() << "\" ;;\n";
    }
    words << "    \"" << path << "\") words=\"" << sub_names(a) << option_names(a) << option_names(app) << "\" ;;\n";
    for (const CLI::App* sub : a.get_subcommands({})) walk(*sub, path + " " + sub->get_name());
  };
  walk(app, "");
  s << "    esac\n"
    << "  done\n"
    << "  local words\n"
    << "  case \"$path\" in\n"
    << words.str()
    << "  esac\n"
    << "  if [[ $cur == -* || -n $words ]]; then COMPREPLY=($(compgen -W \"$words\" -- \"$cur\")); fi\n"
    << "  [[ $cur != -* ]] && COMPREPLY+=($(compgen -f -- \"$cur\"))\n"
    << "}\n"
    << "complete -F _strata strata\n";
  return s.str();
}

constexpr const char* kRunHelp =
    "RUN: a run id, a unique prefix of one, a run name (its newest run) or `latest` (the newest run)";

int RunCli(int argc, char** argv) {
  CLI::App app{"strata: train and inspect transformer models on a cluster of workers"};
  app.require_subcommand(1);
  // Global options go anywhere on the line (`strata status --state-dir X` as `strata --state-dir X
  // status`): subcommands made after this inherit fallthrough. Every help shows the defaults.
  app.fallthrough();
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", VersionText(), "print the version, git revision and LibTorch / CUDA versions, then exit");
  GlobalOptions g;
  g.state_dir = DefaultStateDir();
  app.add_option("--state-dir", g.state_dir, "local cluster state ($STRATA_STATE_DIR, default ~/.local/share/strata)");
  app.add_option("--cluster", g.cluster, "coordinator endpoint (overrides the state dir; or $STRATA_CLUSTER)");
  app.add_option("--timeout-ms", g.timeout_ms, "how long to wait for the coordinator")->check(CLI::Range(100, 600000));
  app.add_option("--keys", g.keys_dir, "CURVE key directory (or $STRATA_KEYS; default STATE_DIR/keys if present)");

  std::string keygen_dir;
  bool keygen_force = false;
  auto* keygen = app.add_subcommand("keygen", "make CURVE keys for a cluster on tcp:// (see docs/security.md)");
  keygen->add_option("dir", keygen_dir, "directory to create (e.g. STATE_DIR/keys)")->required();
  keygen->add_flag("--force", keygen_force, "replace existing keys (every host then needs the new ones)");

  UpOptions up_options;
  auto* up = app.add_subcommand("up", "start a local coordinator and workers (starts only what is not running)");
  up->add_option("--workers", up_options.workers, "number of CPU workers")->check(CLI::Range(1, 64));
  up->add_option("--gpus", up_options.gpus, "one worker per GPU on cuda:0..N-1 instead of CPU workers")->check(CLI::Range(0, 64));
  up->add_option("--hosts", up_options.hosts,
                 "spread the workers over N emulated hosts (worker i on host-(i mod N)), to try a multi-host cluster on one "
                 "machine: checkpoint shards are then copied across hosts")
      ->check(CLI::Range(1, 64));
  up->add_flag("--salvage", up_options.salvage,
               "start daemons whose stores are damaged, keeping what is intact (strata-worker / strata-coordinator "
               "--salvage); without it a damaged store stops its daemon with a message naming it");
  up->add_option("--memory-limit", up_options.memory_limit,
                 "each worker uses at most this much memory, e.g. 8GiB (GPU: the allocator's cap; CPU: address space the OS lets it add)");
  up->add_option("--net-interface", up_options.net_interface,
                 "network interface NCCL uses between hosts (each worker's --net-interface: sets NCCL_SOCKET_IFNAME); "
                 "see docs/multi-host.md");
  up->add_option("--heartbeat-timeout-ms", up_options.heartbeat_timeout_ms, "mark a silent worker lost after this")
      ->check(CLI::Range(200, 600000));
  up->add_option("--replace-grace-ms", up_options.replace_grace_ms,
                 "after a worker is lost, wait this long for a replacement before re-planning onto the workers present")
      ->check(CLI::Range(0, 3600000));
  up->add_option("--grow-back-min-saving-s", up_options.grow_back_min_saving_s,
                 "a run a lost worker made smaller takes idle workers back at its next checkpoint when that saves at least "
                 "this many seconds over its remaining steps (-1: never)")
      ->check(CLI::Range(-1, 86400));
  up->add_option("--peer-timeout-ms", up_options.peer_timeout_ms,
                 "the hang watchdog: a rank waiting this long for a peer or a collective gives up and the rank that did "
                 "not arrive is treated as lost")
      ->check(CLI::Range(500, 3600000));
  up->add_option("--stuck-task-restart-ms", up_options.stuck_task_restart_ms,
                 "a worker whose cancelled task has not stopped after this (stuck in a device call) restarts its process")
      ->check(CLI::Range(1000, 3600000));
  up->add_option("--inject-fault", up_options.inject_faults, "")->group("");  // tests only: worker/fault_injector.h
  auto* down = app.add_subcommand("down", "stop the local cluster (state is kept); returns once its processes have exited");
  int down_grace_s = 8;
  down->add_option("--grace-s", down_grace_s,
                   "seconds to wait after the shutdown request, and again after SIGTERM, before SIGKILL")
      ->check(CLI::Range(1, 3600));

  std::string completion_shell;
  auto* completion = app.add_subcommand("completion", "print a shell completion script: `source <(strata completion bash)`");
  completion->add_option("shell", completion_shell, "the shell (bash)")->required()->check(CLI::IsMember({"bash"}));

  bool as_json = false;
  auto* workers_cmd = app.add_subcommand("workers", "list workers, their memory and runs");
  workers_cmd->add_flag("--json", as_json, "machine-readable output");

  std::string spec_path;
  SubmitOptions submit_options;
  auto* submit = app.add_subcommand("submit", "submit a run spec (TOML)");
  submit->add_option("spec", spec_path, "run spec file")->required();
  submit->add_flag("--follow,-f", submit_options.follow, "print progress until the run ends");
  submit->add_flag("--skip-estimate", submit_options.skip_estimate,
                   "submit even if the memory estimate says the plan does not fit (on out of memory the run re-plans and replays)");
  submit->add_flag("--queue", submit_options.queue,
                   "accept a fixed mesh (dp x pp x tp) larger than the live cluster: the run waits until enough workers are idle");
  submit->add_option("--progress-every-s", submit_options.progress_every_s,
                     "with --follow into a pipe or file: a progress line at most every this many seconds, or every 5% of "
                     "the steps if sooner (on a terminal the line is live)")
      ->check(CLI::Range(1, 86400));
  submit->add_option("--resume", submit_options.resume,
                     "start from RUN's latest checkpoint (or RUN@STEP), under this spec's mesh, whatever mesh wrote it; RUN as "
                     "everywhere: an id, a unique id prefix, a run name (its newest run) or `latest`");

  std::string run;
  auto* status = app.add_subcommand("status", "show runs");
  status->add_option("run", run, std::string(kRunHelp) + " (default: all runs)");
  status->add_flag("--json", as_json, "machine-readable output");
  bool with_losses = false;
  status->add_flag("--losses", with_losses,
                   "with RUN: its whole loss history in --json (as without the flag: one run's JSON always has it); the "
                   "listing of all runs has each run's last loss only");
  bool watch = false;
  status->add_flag("--watch,-w", watch,
                   "live progress (step, loss, tokens/s, ETA, plan) and events until the run(s) end; without RUN the "
                   "active (pending / running) runs");
  bool watch_all = false;
  status->add_flag("--all", watch_all, "with --watch and no RUN: every run, ended ones too");
  int watch_every_s = 10;
  status->add_option("--progress-every-s", watch_every_s,
                     "--watch RUN into a pipe or file: a progress line at most every this many seconds, or every 5% of the steps if sooner")
      ->check(CLI::Range(1, 86400));
  auto* events = app.add_subcommand("events", "show a run's event log");
  events->add_option("run", run, kRunHelp)->required();
  events->add_flag("--json", as_json, "machine-readable output");
  auto* cancel = app.add_subcommand("cancel", "cancel a run");
  cancel->add_option("run", run, kRunHelp)->required();
  auto* checkpoints = app.add_subcommand("checkpoints", "list a run's complete checkpoints");
  checkpoints->add_option("run", run, kRunHelp)->required();
  checkpoints->add_flag("--json", as_json, "machine-readable output");
  int64_t export_step = 0;
  std::string export_dir;
  bool export_force = false;
  std::string export_dtype = "fp32", export_shard_size = "5GB";
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint as a Hugging Face directory (config.json + safetensors, as save_pretrained)");
  export_cmd->add_option("run", run, kRunHelp)->required();
  auto* export_step_option = export_cmd->add_option("--step", export_step, "checkpoint step (default: the latest complete one)");
  export_cmd->add_option("--out", export_dir, "output directory (new or empty)")->required();
  export_cmd->add_flag("--force", export_force, "write into a non-empty --out, replacing its config.json and model.safetensors");
  export_cmd->add_option("--dtype", export_dtype, "dtype of the written weights: fp32 or bf16")->capture_default_str();
  export_cmd->add_option("--max-shard-size", export_shard_size,
                         "largest safetensors file; a larger model is split into several with model.safetensors.index.json")
      ->capture_default_str();

  auto* activations_cmd = app.add_subcommand("activations", "list what an extract run stored (layers, sites, rows, bytes)");
  activations_cmd->add_option("run", run, std::string("the extract run: ") + kRunHelp);
  activations_cmd->add_flag("--json", as_json, "machine-readable output");
  ActivationsGet get;
  auto* get_cmd = activations_cmd->add_subcommand("get", "write rows of one layer to .npy / .safetensors (or .npy on stdout)");
  get_cmd->add_option("run", get.run, std::string("the extract run: ") + kRunHelp)->required();
  get_cmd->add_option("--layer", get.layer, "layer index")->required();
  get_cmd->add_option("--site", get.site,
                      "a captured site: resid_pre, resid_mid, resid_post, attn_out, mlp_out, q, k, v, attn_pattern, "
                      "mlp_hidden, final_norm, logits, logits_ids (default: the run's only site, else resid_post)");
  get_cmd->add_option("--head", get.head,
                      "only this attention head of a site with heads (q, k, v, attn_pattern): rows [n, head_dim] or "
                      "[n, sequence] instead of [n, heads, ...]");
  get_cmd->add_option("--rows", get.rows, "token rows A:B (default: every stored row)");
  get_cmd->add_option("--out", get.out, "FILE.npy, FILE.safetensors, or - for .npy on stdout (an existing FILE is refused)")->required();
  get_cmd->add_flag("--force", get.force, "replace an existing --out file");
  get_cmd->add_flag("--with-tokens", get.with_tokens,
                    "also write the rows' tokens beside --out: NAME.tokens.npy, int64 [rows, 3] (token id, document, position)");
  get_cmd->add_option("--store", get.stores,
                      "read this worker store directory instead of asking the cluster (works with it down); once per worker");
  activations_cmd->add_option("--store", get.stores, "list from these worker store directories instead of the cluster");

  LogsRequest logs_request;
  auto* logs_cmd = app.add_subcommand("logs", "show one rank's log of a run (its task's log lines and one line per step)");
  logs_cmd->add_option("run", logs_request.run)->required();
  logs_cmd->add_option("--rank", logs_request.rank, "the rank (default 0)");
  logs_cmd->add_flag("--follow,-f", logs_request.follow, "keep printing new lines until the run ends");
  logs_cmd->add_option("--since", logs_request.since, "only lines from the last DURATION (500ms, 30s, 10m, 2h, 1d)");
  bool metrics_csv = false;
  auto* metrics_cmd = app.add_subcommand("metrics", "a run's per-step metrics (loss, lr, tokens/s, memory), one JSON object a line");
  metrics_cmd->add_option("run", run)->required();
  metrics_cmd->add_flag("--csv", metrics_csv, "CSV with a header instead of JSON lines");

  PlanRequest plan_request;
  auto* plan_cmd = app.add_subcommand("plan", "the planner's mesh, ZeRO stage and micro-batch for a run spec, with each worker's memory estimate");
  plan_cmd->add_option("spec", plan_request.spec_path, "run spec file")->required();
  plan_cmd->add_option("--cluster-spec", plan_request.cluster_spec, "plan for a described cluster (TOML [[nodes]]) instead of the live one");
  plan_cmd->add_flag("--json", plan_request.as_json, "machine-readable output");
  TokenizeCommand tokenize(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }

  auto dispatch = [&]() -> int {
    if (*keygen) return CmdKeygen(keygen_dir, keygen_force);
    if (*completion) {
      std::cout << BashCompletion(app);
      return kExitOk;
    }
    if (tokenize.selected()) return tokenize.Run();
    if (*up) return CmdUp(g, up_options);
    if (*down) return CmdDown(g, down_grace_s);
    if (*workers_cmd) return CmdWorkers(g, as_json);
    if (*submit) return CmdSubmit(g, spec_path, submit_options);
    // RUN as typed (a name, an id prefix, `latest`) becomes a run id first.
    for (auto* cmd : {status, events, cancel, checkpoints}) {  // export: after its --out checks
      if (!*cmd || run.empty()) continue;
      auto id = ResolveRun(g, run);
      if (!id.ok()) return Fail(id.status());
      run = *id;
    }
    if (*status && watch) return run.empty() ? WatchAll(g, watch_all) : Follow(g, run, watch_every_s);
    if (*status) return CmdStatus(g, run, as_json, with_losses);
    if (*events) return CmdEvents(g, run, as_json);
    if (*cancel) return CmdCancel(g, run);
    if (*checkpoints) return CmdCheckpoints(g, run, as_json);
    if (*export_cmd) {
      if (export_dtype != "fp32" && export_dtype != "bf16") {
        return Fail(InvalidArgument("--dtype " + export_dtype + " is not supported; use fp32 or bf16"));
      }
      auto shard_bytes = ParseByteSize(export_shard_size, "--max-shard-size");
      if (!shard_bytes.ok()) return Fail(shard_bytes.status());
      if (*shard_bytes < (uint64_t{1} << 10)) return Fail(InvalidArgument("--max-shard-size " + export_shard_size + " is below 1KiB; use e.g. 5GB"));
      ExportOptions options{export_dtype, *shard_bytes};
      return CmdExport(g, run, export_step_option->count() > 0 ? std::optional<int64_t>(export_step) : std::nullopt, export_dir, export_force,
                       options);
    }
    if (*plan_cmd) return PlanRun(plan_request, plan_request.cluster_spec.empty() ? ResolveCoordinator(g) : Result<CoordinatorAddress>(CoordinatorAddress{}));
    if (*logs_cmd || *metrics_cmd) {
      if (*logs_cmd && !logs_request.since.empty()) {
        if (auto d = ParseDurationMs(logs_request.since); !d.ok()) return Fail(d.status());  // before resolving the cluster
      }
      auto coordinator = ResolveCoordinator(g);
      if (!coordinator.ok()) return Fail(coordinator.status());
      return *logs_cmd ? ShowLogs(*coordinator, logs_request) : ShowMetrics(*coordinator, run, metrics_csv);
    }
    if (*activations_cmd) {
      if (*get_cmd) {
        if (Status st = CheckActivationsOut(get); !st.ok()) return Fail(st);  // before resolving the cluster
      }
      // --store: the stores alone, no cluster asked (RUN must be the run id: names and prefixes
      // are the coordinator's to resolve).
      if (!get.stores.empty()) {
        if (*get_cmd) return GetActivations(CoordinatorAddress{}, get);
        if (run.empty()) return Fail(InvalidArgument("name the run: `strata activations RUN --store DIR`"));
        return ListActivations(CoordinatorAddress{}, get.stores, run, as_json);
      }
      auto coordinator = ResolveCoordinator(g);
      if (!coordinator.ok()) return Fail(coordinator.status());
      for (std::string* r : {&run, &get.run}) {
        if (r->empty()) continue;
        auto id = ResolveRun(g, *r);
        if (!id.ok()) return Fail(id.status());
        *r = *id;
      }
      if (*get_cmd) return GetActivations(*coordinator, get);
      if (run.empty()) return Fail(InvalidArgument("name the run: `strata activations RUN` (runs: `strata status`)"));
      return ListActivations(*coordinator, {}, run, as_json);
    }
    return kExitBadInput;
  };
  try {
    return dispatch();
  } catch (const zmq::error_t& e) {  // a safety net: addresses are validated before connecting
    return Fail(Unavailable(std::string("ZeroMQ refused the connection: ") + e.what() + "; check --cluster / STRATA_CLUSTER"));
  }
}

namespace api {
namespace {

// A state directory named by the program is the cluster it means: its cluster.json wins over
// $STRATA_CLUSTER (which, for the CLI, overrides the default state directory).
Result<GlobalOptions> Options(const Target& target) {
  GlobalOptions g;
  g.state_dir = target.state_dir.empty() ? DefaultStateDir() : target.state_dir;
  g.cluster = target.cluster;
  g.keys_dir = target.keys_dir;
  g.timeout_ms = target.timeout_ms;
  if (!target.state_dir.empty() && target.cluster.empty()) {
    STRATA_ASSIGN_OR_RETURN(ClusterFile file, ReadClusterFile(g.state_dir));
    g.cluster = file.endpoint;
  }
  return g;
}

}  // namespace

Result<CoordinatorAddress> Coordinator(const Target& target) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  return ResolveCoordinator(g);
}

Result<std::string> Submit(const Target& target, const std::string& spec_path) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  return SubmitSpecFile(g, spec_path, SubmitOptions{});
}

Result<std::string> SubmitText(const Target& target, const std::string& toml, const std::string& base_dir,
                               const std::string& label) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  return SubmitSpecText(g, toml, base_dir, label, SubmitOptions{});
}

Result<std::string> ResolveRun(const Target& target, const std::string& run) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  return cli::ResolveRun(g, run);
}

Result<std::string> StatusJson(const Target& target, const std::string& run) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  STRATA_ASSIGN_OR_RETURN(json out, cli::StatusJson(g, run));
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<std::string> EventsJson(const Target& target, const std::string& run) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  STRATA_ASSIGN_OR_RETURN(json out, cli::EventsJson(g, run));
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status Cancel(const Target& target, const std::string& run) {
  STRATA_ASSIGN_OR_RETURN(GlobalOptions g, Options(target));
  schema::EnvelopeBuilder req;
  req.root().initCancelRun().setRunId(run);
  STRATA_ASSIGN_OR_RETURN(auto reply, Call(g, req));
  (void)reply;
  return Status::Ok();
}

}  // namespace api

}  // namespace strata::cli
