// The JSON forms of the coordinator's records (cluster_calls.h) and of `strata status --json` /
// `strata events --json` (cluster_api.h).
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "client/cluster_api.h"
#include "client/cluster_calls.h"
#include "schema/envelope.h"
#include "shard/layout.h"
#include "shard/plan_summary.h"
#include "spec/run_spec_capnp.h"

namespace strata::client {

using json = nlohmann::json;

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
  json capture = json::object();
  auto spec = with_plan ? ReadRunRecordSpec(r) : Result<RunSpec>(InvalidArgument("not asked for"));
  if (spec.ok() && spec->is_extract()) {
    // A capture's size: its chunks ("step" of "total_steps") times a chunk's records (every layer
    // and site at extract.batch sequences); the last chunk may be shorter, so both are upper bounds.
    const uint64_t chunk = ExtractChunkBytes(*spec);
    capture = {{"bytes_stored", chunk * r.getStep()}, {"bytes_expected", chunk * r.getTotalSteps()}};
  }
  if (spec.ok() && !spec->is_extract()) {
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
          {"capture", capture},
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
          {"base_identity", r.getBaseIdentity().cStr()},
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

json SavesWaitingForDisk(const Target& target, const std::string& run) {
  json waiting = json::array();
  auto reply = FetchEvents(target, run);
  if (!reply.ok()) return waiting;
  std::map<std::string, json> by_worker;  // the worker's last save-paused, erased by a later save-resumed
  for (auto e : (*reply)->root().getEventsReply().getEvents()) {
    const std::string kind = e.getKind().cStr(), message = e.getMessage().cStr();
    if (kind != "save-paused" && kind != "save-resumed") continue;
    const std::string worker = message.substr(0, message.find(": "));  // notices are "worker-0: ..."
    if (kind == "save-resumed") {
      by_worker.erase(worker);
    } else {
      by_worker[worker] = {{"worker", worker}, {"since_unix_ms", e.getUnixMs()}, {"message", message}};
    }
  }
  for (auto& [worker, entry] : by_worker) waiting.push_back(std::move(entry));
  return waiting;
}

// One run: everything, its whole loss history and checkpoint steps included. All runs: a listing
// without loss histories or checkpoint steps, one request to the coordinator however many runs
// there are (with 450 runs, whole histories and a checkpoints request per run took 611 ms).
Result<std::string> StatusJson(const Target& target, const std::string& run, int indent) {
  STRATA_ASSIGN_OR_RETURN(auto reply, FetchStatus(target, run, /*last_loss_only=*/run.empty()));
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
    if (auto c = FetchCheckpoints(target, r.getRunId().cStr()); c.ok()) {
      for (auto m : (*c)->root().getCheckpointsReply().getCheckpoints()) steps.push_back(m.getStep());
    }
    entry["checkpoint_steps"] = steps;
    entry["saves_waiting_for_disk"] =
        r.getState() == RunState::RUNNING ? SavesWaitingForDisk(target, r.getRunId().cStr()) : json::array();
    out.push_back(entry);
  }
  if (!run.empty() && out.empty()) return NotFound("no run " + run);
  return (run.empty() ? out : out[0]).dump(indent, ' ', false, json::error_handler_t::replace);
}

Result<std::string> EventsJson(const Target& target, const std::string& run, int indent) {
  STRATA_ASSIGN_OR_RETURN(auto reply, FetchEvents(target, run));
  json out = json::array();
  for (auto e : reply->root().getEventsReply().getEvents()) {
    out.push_back({{"unix_ms", e.getUnixMs()}, {"kind", e.getKind().cStr()}, {"message", e.getMessage().cStr()}});
  }
  return out.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace strata::client
