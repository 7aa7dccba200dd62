// The commands about runs: workers, status, events, checkpoints, cancel, submit (with --follow)
// and export.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/command_set.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/plan_command.h"
#include "cli/text_data.h"
#include "client/export.h"
#include "common/byte_size.h"
#include "common/net.h"
#include "model/hf_checkpoint.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"

namespace strata::cli {

namespace fs = std::filesystem;

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
                     {"memory",
                      {{"total_bytes", m.getTotalBytes()},
                       {"free_bytes", m.getFreeBytes()},
                       {"allocated_bytes", m.getAllocatedBytes()},
                       {"reserved_bytes", m.getReservedBytes()},
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
    std::printf("%-12s %-6s %-8u %-7s %-11s %-11s %-10s %s\n", Printable(w.getWorkerId()).c_str(),
                schema::WorkerStateName(w.getState()), w.getPid(), Printable(m.getDevice()).c_str(),
                HumanBytes(m.getAllocatedBytes()).c_str(), HumanBytes(m.getFreeBytes()).c_str(),
                (std::to_string(w.getLastHeartbeatMsAgo()) + " ms").c_str(), Printable(w.getCurrentRun()).c_str());
  }
  return kExitOk;
}

Result<std::unique_ptr<schema::DecodedEnvelope>> FetchStatus(const GlobalOptions& g, const std::string& run,
                                                             bool last_loss_only) {
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
    if (!newest)
      return NotFound("`latest` names the newest run, and there are no runs yet; `strata submit SPEC` starts one");
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
    return Fail(
        InvalidArgument("--losses needs a run: the listing of all runs carries each run's last loss only; "
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
    std::printf("%-28s %-10s %-13s %-10s %-12.0f %s\n", Printable(r.getRunId()).c_str(),
                schema::RunStateName(r.getState()),
                (std::to_string(r.getStep()) + "/" + std::to_string(r.getTotalSteps())).c_str(), loss,
                r.getTokensPerSecond(), workers.c_str());
    if (r.getMessage().size() > 0) std::printf("  %s\n", Printable(r.getMessage()).c_str());
    if (run.empty()) continue;  // one run asked for: its plan and what it got through too
    const json j = RunToJson(r);
    if (!j["plan"].empty()) {
      const json& p = j["plan"];
      const long long kept = p.value("keep_gathered", 0LL);
      const std::string offload = p.value("offload", std::string("none"));
      std::printf(
          "  plan: dp=%lld pp=%lld tp=%lld, ZeRO-%lld, micro-batch %lld x %lld accumulation, recompute %s%s%s\n",
          p["dp"].get<long long>(), p["pp"].get<long long>(), p["tp"].get<long long>(), p["zero"].get<long long>(),
          p["micro_batch"].get<long long>(), p["gradient_accumulation"].get<long long>(),
          p["recompute"].get<bool>() ? "on" : "off",
          kept > 0 ? (", keep_gathered " + std::to_string(kept)).c_str() : "",
          offload != "none" ? (", offload " + Printable(offload)).c_str() : "");
    }
    if (!j["checkpoints"].empty()) {
      const json& c = j["checkpoints"];
      const long long every = c["every_steps"].get<long long>(), keep = c["keep"].get<long long>();
      std::printf("  checkpoints: %s%s, %s\n",
                  every > 0 ? ("every " + std::to_string(every) + " steps and the last").c_str() : "the last step only",
                  c["auto"].get<bool>() ? " (train.checkpoint_every = \"auto\": a tenth of the run)" : "",
                  keep > 0
                      ? ("the newest " + std::to_string(keep) + " complete ones kept (train.keep_checkpoints)").c_str()
                      : "all kept (train.keep_checkpoints = 0)");
    }
    std::string handled;
    for (auto& [kind, count] : j["handled"].items())
      handled += (handled.empty() ? "" : ", ") + kind + " " + std::to_string(count.get<int>());
    if (!handled.empty())
      std::printf("  handled: %s (`strata events %s` for each)\n", Printable(handled).c_str(),
                  Printable(r.getRunId()).c_str());
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
    std::printf("%s  %-22s %s\n", FormatTime(e.getUnixMs()).c_str(), Printable(e.getKind()).c_str(),
                Printable(e.getMessage()).c_str());
  }
  return kExitOk;
}

namespace {

// A checkpoint's state: "complete", or why it cannot be resumed from ("missing-shard": a
// worker's store no longer holds a shard of it; "unreadable": a rank could not read it).
std::pair<std::string, std::string> CheckpointState(CheckpointsReply::Reader reply, unsigned i) {
  const std::string why = i < reply.getUnreadable().size() ? reply.getUnreadable()[i].cStr() : "";
  if (why.empty()) return {"complete", ""};
  return {why.rfind("missing shard", 0) == 0 ? "missing-shard" : "unreadable", why};
}
}  // namespace

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
    std::printf("%-8ld %-14s %-8u %-8zu %-12s %s\n", static_cast<long>(m.getStep()), state.c_str(),
                m.getShards().size(), j["tensor_count"].get<size_t>(),
                HumanBytes(j["size_bytes"].get<uint64_t>()).c_str(), FormatTime(m.getCommittedUnixMs()).c_str());
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

namespace {

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
}  // namespace

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
    return text_data.code() == StatusCode::kInvalidArgument ? InvalidArgument(path + ": " + text_data.message())
                                                            : text_data;
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
  if (const ParallelSpec& p = spec->parallel; !spec->is_extract() && !p.automatic.count("dp") &&
                                              !p.automatic.count("pp") && !p.automatic.count("tp") && !o.queue) {
    STRATA_ASSIGN_OR_RETURN(auto live, CountLiveWorkers(g, *endpoint));
    if (p.workers() > live) {
      return InvalidArgument(
          path + ": parallel.dp x parallel.pp x parallel.tp = " + std::to_string(p.dp) + " x " + std::to_string(p.pp) +
          " x " + std::to_string(p.tp) + " = " + std::to_string(p.workers()) + " workers, but the cluster has " +
          std::to_string(live) +
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
    std::cerr
        << "strata: submitting anyway (--skip-estimate): " << why
        << "; a rank that runs out of memory makes the run re-plan (smaller micro-batch first) and replay the step"
        << std::endl;
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
              bool force, const client::ExportOptions& options) {
  if (step && *step < 0) {
    return Fail(InvalidArgument("--step " + std::to_string(*step) +
                                " is not a checkpoint step; give a step that `strata checkpoints " + typed_run +
                                "` lists, or leave --step out for the latest"));
  }
  std::error_code ec;
  const fs::file_status out_status = fs::status(out_dir, ec);
  if (fs::exists(out_status) && !fs::is_directory(out_status)) {
    return Fail(InvalidArgument("--out " + out_dir +
                                " exists and is not a directory; export writes a directory "
                                "(config.json + model.safetensors), choose a new path"));
  }
  if (fs::is_directory(out_status) && !force && !fs::is_empty(out_dir, ec)) {
    return Fail(InvalidArgument("--out " + out_dir +
                                " is not empty; export into a new or empty directory, or pass --force "
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
        return Fail(Corruption("the checkpoint of run " + Printable(run) + " at step " + std::to_string(m.getStep()) +
                               " is " + state + ": " + why + "; `strata checkpoints` lists the complete ones"));
      }
      auto summary = client::ExportCheckpoint(spec_toml, m, out_dir, options);
      if (!summary.ok()) return Fail(summary.status());
      std::printf("exported run %s step %ld: %zu tensors (%s, %s) in %zu file%s to %s", Printable(run).c_str(),
                  static_cast<long>(m.getStep()), summary->tensors, HumanBytes(summary->bytes).c_str(),
                  options.dtype.c_str(), summary->files, summary->files == 1 ? "" : "s", out_dir.c_str());
      if (summary->companion_files > 0)
        std::printf(" (+%zu tokenizer/config files from init_from)", summary->companion_files);
      std::printf("\n");
      return kExitOk;
    }
    steps += (steps.empty() ? "" : ", ") + std::to_string(m.getStep());
  }
  return Fail(InvalidArgument("--step " + std::to_string(*step) + ": run " + run +
                              " has no complete checkpoint there; complete ones are at steps " + steps));
}

void RegisterRunCommands(CommandSet& set) {
  GlobalOptions& g = set.global();
  auto workers_json = std::make_shared<bool>(false);
  auto* workers = set.Add("workers", "list workers, their memory and runs",
                          [&g, workers_json] { return CmdWorkers(g, *workers_json); });
  workers->add_flag("--json", *workers_json, "machine-readable output");

  struct Submit {
    std::string spec_path;
    SubmitOptions options;
  };
  auto submit = std::make_shared<Submit>();
  auto* submit_cmd = set.Add("submit", "submit a run spec (TOML)",
                             [&g, submit] { return CmdSubmit(g, submit->spec_path, submit->options); });
  submit_cmd->add_option("spec", submit->spec_path, "run spec file")->required();
  submit_cmd->add_flag("--follow,-f", submit->options.follow, "print progress until the run ends");
  submit_cmd->add_flag(
      "--skip-estimate", submit->options.skip_estimate,
      "submit even if the memory estimate says the plan does not fit (on out of memory the run re-plans and replays)");
  submit_cmd->add_flag(
      "--queue", submit->options.queue,
      "accept a fixed mesh (dp x pp x tp) larger than the live cluster: the run waits until enough workers are idle");
  submit_cmd
      ->add_option("--progress-every-s", submit->options.progress_every_s,
                   "with --follow into a pipe or file: a progress line at most every this many seconds, or every 5% of "
                   "the steps if sooner (on a terminal the line is live)")
      ->check(CLI::Range(1, 86400));
  submit_cmd->add_option(
      "--resume", submit->options.resume,
      "start from RUN's latest checkpoint (or RUN@STEP), under this spec's mesh, whatever mesh wrote it; RUN as "
      "everywhere: an id, a unique id prefix, a run name (its newest run) or `latest`");

  struct StatusArgs {
    std::string run;
    bool as_json = false, with_losses = false, watch = false, watch_all = false;
    int watch_every_s = 10;
  };
  auto status = std::make_shared<StatusArgs>();
  auto* status_cmd = set.Add("status", "show runs", [&g, status] {
    int rc = kExitOk;
    if (!ResolveRunArgument(g, status->run, &rc)) return rc;
    if (status->watch) {
      return status->run.empty() ? WatchAll(g, status->watch_all) : Follow(g, status->run, status->watch_every_s);
    }
    return CmdStatus(g, status->run, status->as_json, status->with_losses);
  });
  status_cmd->add_option("run", status->run, std::string(kRunHelp) + " (default: all runs)");
  status_cmd->add_flag("--json", status->as_json, "machine-readable output");
  status_cmd->add_flag(
      "--losses", status->with_losses,
      "with RUN: its whole loss history in --json (as without the flag: one run's JSON always has it); the "
      "listing of all runs has each run's last loss only");
  status_cmd->add_flag("--watch,-w", status->watch,
                       "live progress (step, loss, tokens/s, ETA, plan) and events until the run(s) end; without RUN "
                       "the active (pending / running) runs");
  status_cmd->add_flag("--all", status->watch_all, "with --watch and no RUN: every run, ended ones too");
  status_cmd
      ->add_option("--progress-every-s", status->watch_every_s,
                   "--watch RUN into a pipe or file: a progress line at most every this many seconds, or every 5% of "
                   "the steps if sooner")
      ->check(CLI::Range(1, 86400));

  // events, cancel, checkpoints: one RUN, resolved first.
  struct RunArgs {
    std::string run;
    bool as_json = false;
  };
  auto add_run_command = [&](const char* name, const char* help, bool json_flag,
                             std::function<int(const std::string& run, bool as_json)> run) {
    auto args = std::make_shared<RunArgs>();
    auto* command = set.Add(name, help, [&g, args, run] {
      int rc = kExitOk;
      if (!ResolveRunArgument(g, args->run, &rc)) return rc;
      return run(args->run, args->as_json);
    });
    command->add_option("run", args->run, kRunHelp)->required();
    if (json_flag) command->add_flag("--json", args->as_json, "machine-readable output");
  };
  add_run_command("events", "show a run's event log", true,
                  [&g](const std::string& run, bool as_json) { return CmdEvents(g, run, as_json); });
  add_run_command("cancel", "cancel a run", false, [&g](const std::string& run, bool) { return CmdCancel(g, run); });
  add_run_command("checkpoints", "list a run's complete checkpoints", true,
                  [&g](const std::string& run, bool as_json) { return CmdCheckpoints(g, run, as_json); });

  struct Export {
    std::string run, dir, dtype = "fp32", shard_size = "5GB";
    int64_t step = 0;
    bool force = false;
    CLI::Option* step_option = nullptr;
  };
  auto ex = std::make_shared<Export>();
  auto* export_cmd = set.Add(
      "export", "write a checkpoint as a Hugging Face directory (config.json + safetensors, as save_pretrained)",
      [&g, ex] {  // RUN is resolved after the --out checks (CmdExport)
        if (ex->dtype != "fp32" && ex->dtype != "bf16") {
          return Fail(InvalidArgument("--dtype " + ex->dtype + " is not supported; use fp32 or bf16"));
        }
        auto shard_bytes = ParseByteSize(ex->shard_size, "--max-shard-size");
        if (!shard_bytes.ok()) return Fail(shard_bytes.status());
        if (*shard_bytes < (uint64_t{1} << 10))
          return Fail(InvalidArgument("--max-shard-size " + ex->shard_size + " is below 1KiB; use e.g. 5GB"));
        client::ExportOptions options{ex->dtype, *shard_bytes};
        return CmdExport(g, ex->run, ex->step_option->count() > 0 ? std::optional<int64_t>(ex->step) : std::nullopt,
                         ex->dir, ex->force, options);
      });
  export_cmd->add_option("run", ex->run, kRunHelp)->required();
  ex->step_option = export_cmd->add_option("--step", ex->step, "checkpoint step (default: the latest complete one)");
  export_cmd->add_option("--out", ex->dir, "output directory (new or empty)")->required();
  export_cmd->add_flag("--force", ex->force,
                       "write into a non-empty --out, replacing its config.json and model.safetensors");
  export_cmd->add_option("--dtype", ex->dtype, "dtype of the written weights: fp32 or bf16")->capture_default_str();
  export_cmd
      ->add_option("--max-shard-size", ex->shard_size,
                   "largest safetensors file; a larger model is split into several with model.safetensors.index.json")
      ->capture_default_str();
}

}  // namespace strata::cli
