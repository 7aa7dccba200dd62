// Shared by the commands (commands.h): finding and calling the coordinator, and the JSON forms
// of its records.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/activations_command.h"
#include "cli/cluster_file.h"
#include "cli/command_set.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "client/coordinator_client.h"
#include "common/curve.h"
#include "schema/envelope.h"
#include "shard/layout.h"
#include "shard/plan_summary.h"
#include "spec/run_spec.h"

namespace strata::cli {

namespace fs = std::filesystem;

namespace {

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
  if (scheme != "tcp" && scheme != "ipc" && scheme != "inproc")
    return bad("unknown scheme " + EscapeForTerminal(scheme) + "://");
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
}  // namespace

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
json RunToJson(RunRecord::Reader r, bool with_plan) {
  json losses = json::array();
  for (double l : r.getLosses()) losses.push_back(l);
  json workers = json::array();
  for (auto w : r.getWorkers()) workers.push_back(w.cStr());
  json memory = json::array();
  for (auto m : r.getMemory()) {
    memory.push_back({{"worker", m.getWorker().cStr()},
                      {"estimate_bytes", m.getEstimateBytes()},
                      {"workspace_bytes", m.getWorkspaceBytes()},
                      {"measured_peak_bytes", m.getMeasuredPeakBytes()}});
  }
  json handled = json::object();
  for (auto h : r.getHandled()) handled[h.getKind().cStr()] = h.getCount();
  // The plan the run has now (after any re-planning): the [parallel] fields of its stored spec.
  json plan = json::object();
  json checkpoints = json::object();
  if (auto spec =
          with_plan ? ParseStoredRunSpec(r.getSpecToml().cStr()) : Result<RunSpec>(InvalidArgument("not asked for"));
      spec.ok() && !spec->is_extract()) {
    // How often the run checkpoints and how many it keeps (train.checkpoint_every "auto" is a
    // tenth of the run until the plan's predicted step time makes it half an hour's steps).
    const TrainSpec& t = spec->train;
    checkpoints = {{"every_steps", t.CheckpointInterval()},
                   {"auto", t.checkpoint_every == TrainSpec::kAutoCheckpoints},
                   {"keep", t.keep_checkpoints}};
    const shard::PlanSummary p =
        shard::SummarizePlan(*spec);  // stages: layers per pipeline stage, as the ranks run them
    plan = {{"dp", p.dp},
            {"pp", p.pp},
            {"tp", p.tp},
            {"zero", p.zero},
            {"micro_batch", p.micro_batch},
            {"gradient_accumulation", p.gradient_accumulation},
            {"recompute", p.recompute},
            {"keep_gathered", p.keep_gathered},
            {"offload", std::string(Name(p.offload))},
            {"stages", p.stages},
            {"planned", p.planned}};
  }
  return {{"memory", memory},
          {"handled", handled},
          {"plan", plan},
          {"checkpoints", checkpoints},
          {"run_id", r.getRunId().cStr()},
          {"name", r.getName().cStr()},
          {"kind", r.getKind().cStr()},
          {"state", schema::RunStateName(r.getState())},
          {"step", r.getStep()},
          {"total_steps", r.getTotalSteps()},
          {"world_size", r.getWorldSize()},
          {"losses", losses},
          {"workers", workers},
          {"message", r.getMessage().cStr()},
          {"tokens_per_second", r.getTokensPerSecond()},
          {"created_unix_ms", r.getCreatedUnixMs()},
          {"updated_unix_ms", r.getUpdatedUnixMs()}};
}

namespace {

// 64-bit checksums as hex strings: JSON numbers lose precision above 2^53 in most readers.
std::string ToHex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

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
  return {{"run_id", m.getRunId().cStr()}, {"step", m.getStep()}, {"committed_unix_ms", m.getCommittedUnixMs()},
          {"tensor_count", tensors},       {"size_bytes", bytes}, {"shards", shards}};
}

CLI::App* CommandSet::Add(const std::string& name, const std::string& help, std::function<int()> run) {
  CLI::App* command = app_.add_subcommand(name, help);
  commands_.emplace_back(command, std::move(run));
  return command;
}

int CommandSet::RunParsed() const {
  for (const auto& [command, run] : commands_) {
    if (command->parsed()) return run();
  }
  return kExitBadInput;
}

bool ResolveRunArgument(const GlobalOptions& g, std::string& run, int* exit_code) {
  if (run.empty()) return true;
  auto id = ResolveRun(g, run);
  if (!id.ok()) {
    *exit_code = Fail(id.status());
    return false;
  }
  run = *id;
  return true;
}

}  // namespace strata::cli
