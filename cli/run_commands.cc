// The commands about runs: workers, status, events, checkpoints, cancel, submit (with --follow)
// and export. What they ask the coordinator, and submitting itself, are client/'s
// (cluster_api.h, cluster_calls.h); here is what they print.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/command_set.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "client/cluster_api.h"
#include "client/cluster_calls.h"
#include "client/export.h"
#include "common/byte_size.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"
#include "spec/run_spec_capnp.h"

namespace strata::cli {

namespace fs = std::filesystem;

// ------------------------------------------------------------------ queries

int CmdWorkers(GlobalOptions& g, bool as_json) {
  schema::EnvelopeBuilder req;
  req.root().setWorkersRequest();
  auto reply = client::Call(g, req);
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

int CmdStatus(GlobalOptions& g, const std::string& run, bool as_json, bool with_losses) {
  if (with_losses && run.empty()) {
    return Fail(
        InvalidArgument("--losses needs a run: the listing of all runs carries each run's last loss only; "
                        "use `strata status RUN --json --losses`"));
  }
  if (as_json) {
    auto out = client::StatusJson(g, run, /*indent=*/2);
    if (!out.ok()) return Fail(out.status());
    std::cout << *out << std::endl;
    return kExitOk;
  }
  auto reply = client::FetchStatus(g, run, /*last_loss_only=*/run.empty());
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
    const json j = client::RunToJson(r);
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
    if (!j["capture"].empty()) {
      const double gib = double(1ull << 30);
      std::printf("  stored: about %.2f of %.2f GiB (every layer and site of %llu of %llu chunks)\n",
                  j["capture"]["bytes_stored"].get<double>() / gib, j["capture"]["bytes_expected"].get<double>() / gib,
                  static_cast<unsigned long long>(r.getStep()), static_cast<unsigned long long>(r.getTotalSteps()));
    }
    if (r.getState() == RunState::RUNNING) {
      // A save that met a full disk: the run trains on, holding the checkpoint in host memory.
      for (const json& w : client::SavesWaitingForDisk(g, r.getRunId().cStr())) {
        std::printf("  saving paused: %s\n", Printable(w["message"].get<std::string>()).c_str());
      }
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
    auto out = client::EventsJson(g, run, /*indent=*/2);
    if (!out.ok()) return Fail(out.status());
    std::cout << *out << std::endl;
    return kExitOk;
  }
  auto reply = client::FetchEvents(g, run);
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
  auto reply = client::FetchCheckpoints(g, run);
  if (!reply.ok()) return Fail(reply.status());
  auto checkpoints = (*reply)->root().getCheckpointsReply();
  auto list = checkpoints.getCheckpoints();
  if (as_json) {
    json out = json::array();
    for (unsigned i = 0; i < list.size(); ++i) {
      json entry = client::CheckpointToJson(list[i]);
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
    json j = client::CheckpointToJson(m);
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
  if (Status cancelled = client::Cancel(g, run); !cancelled.ok()) return Fail(cancelled);
  std::cout << "cancelled " << run << std::endl;
  return kExitOk;
}

int CmdSubmit(GlobalOptions& g, const std::string& path, const SubmitOptions& o) {
  auto submitted = client::Submit(g, path, o);  // the estimate and tokenizing progress on stderr
  if (!submitted.ok()) return Fail(submitted.status());
  const std::string run = *submitted;
  std::cout << Printable(run) << std::endl;
  if (!o.follow) return kExitOk;
  return Follow(g, run, o.progress_every_s);
}

// `step` empty: the latest complete checkpoint. Writes into `out_dir` only if it is new or empty,
// or with `force` (which replaces its config.json and model.safetensors, nothing else).
int CmdExport(GlobalOptions& g, const std::string& typed_run, std::optional<int64_t> step, const std::string& out_dir,
              bool force, bool adapter, const client::ExportOptions& options) {
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
  // A name, an id prefix or `latest`: after the checks that need no cluster.
  auto id = client::ResolveRun(g, typed_run);
  if (!id.ok()) return Fail(id.status());
  const std::string& run = *id;
  auto status = client::FetchStatus(g, run);
  if (!status.ok()) return Fail(status.status());
  // As stored: records of runs from before specs travelled as structs, and older names, included.
  auto spec = ReadRunRecordSpec((*status)->root().getStatusReply().getRuns()[0]);
  if (!spec.ok()) return Fail(spec.status());
  auto reply = client::FetchCheckpoints(g, run);
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
      auto summary = adapter ? client::ExportAdapter(*spec, m, out_dir, options)
                             : client::ExportCheckpoint(*spec, m, out_dir, options);
      if (!summary.ok()) return Fail(summary.status());
      std::printf("exported run %s step %ld: %zu %stensors (%s, %s) in %zu file%s to %s", Printable(run).c_str(),
                  static_cast<long>(m.getStep()), summary->tensors,
                  adapter         ? "LoRA adapter "
                  : options.merge ? "merged "
                                  : "",
                  HumanBytes(summary->bytes).c_str(), options.quantized ? "nf4 + bf16" : options.dtype.c_str(),
                  summary->files, summary->files == 1 ? "" : "s", out_dir.c_str());
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
  submit_cmd->add_option("--set", submit->options.overrides,
                         "KEY=VALUE: set a spec key, typed like it (e.g. --set train.steps=10); repeatable");
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
    bool force = false, adapter = false, merge = false, quantized = false;
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
        if (ex->adapter && ex->merge)
          return Fail(InvalidArgument("--adapter and --merge exclude each other: the adapters alone, or merged in"));
        if (ex->adapter && ex->quantized)
          return Fail(InvalidArgument("--quantized writes the model's linears in NF4; --adapter writes adapters only"));
        client::ExportOptions options{ex->dtype, *shard_bytes, ex->merge, ex->quantized};
        return CmdExport(g, ex->run, ex->step_option->count() > 0 ? std::optional<int64_t>(ex->step) : std::nullopt,
                         ex->dir, ex->force, ex->adapter, options);
      });
  export_cmd->add_option("run", ex->run, kRunHelp)->required();
  ex->step_option = export_cmd->add_option("--step", ex->step, "checkpoint step (default: the latest complete one)");
  export_cmd->add_option("--out", ex->dir, "output directory (new or empty)")->required();
  export_cmd->add_flag("--force", ex->force,
                       "write into a non-empty --out, replacing its config.json and model.safetensors");
  export_cmd->add_option("--dtype", ex->dtype, "dtype of the written weights: fp32 or bf16")->capture_default_str();
  export_cmd->add_flag("--adapter", ex->adapter,
                       "a LoRA run: its adapters in PEFT's layout (adapter_model.safetensors + adapter_config.json)");
  export_cmd->add_flag("--merge", ex->merge,
                       "a LoRA run: the model with its adapters merged in (W + scale * B A over model.init_from)");
  export_cmd->add_flag("--quantized", ex->quantized,
                       "the blocks' linears in bitsandbytes NF4 (a *-bnb-4bit layout transformers and init_from "
                       "load), the rest bf16");
  export_cmd
      ->add_option("--max-shard-size", ex->shard_size,
                   "largest safetensors file; a larger model is split into several with model.safetensors.index.json")
      ->capture_default_str();
}

}  // namespace strata::cli
