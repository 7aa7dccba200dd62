#include "cli/cli.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <zmq.hpp>

#include "cli/activations_command.h"
#include "cli/api.h"
#include "cli/cluster_file.h"
#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/logs_command.h"
#include "cli/plan_command.h"
#include "cli/tokenize_command.h"
#include "cli/version.h"
#include "client/export.h"
#include "common/byte_size.h"
#include "schema/envelope.h"

extern char** environ;

namespace strata::cli {

std::string VersionText() {
  return std::string("strata ") + STRATA_VERSION + " (git " + STRATA_GIT_REVISION + ")\nLibTorch " +
         STRATA_TORCH_VERSION + " (the workers'; the CLI does not link it), CUDA " + STRATA_CUDA_VERSION;
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
    << words.str() << "  esac\n"
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
  app.set_version_flag("--version", VersionText(),
                       "print the version, git revision and LibTorch / CUDA versions, then exit");
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
  up->add_option("--gpus", up_options.gpus, "one worker per GPU on cuda:0..N-1 instead of CPU workers")
      ->check(CLI::Range(0, 64));
  up->add_option(
        "--hosts", up_options.hosts,
        "spread the workers over N emulated hosts (worker i on host-(i mod N)), to try a multi-host cluster on one "
        "machine: checkpoint shards are then copied across hosts")
      ->check(CLI::Range(1, 64));
  up->add_flag("--salvage", up_options.salvage,
               "start daemons whose stores are damaged, keeping what is intact (strata-worker / strata-coordinator "
               "--salvage); without it a damaged store stops its daemon with a message naming it");
  up->add_option("--memory-limit", up_options.memory_limit,
                 "each worker uses at most this much memory, e.g. 8GiB (GPU: the allocator's cap; CPU: address space "
                 "the OS lets it add)");
  up->add_option("--net-interface", up_options.net_interface,
                 "network interface NCCL uses between hosts (each worker's --net-interface: sets NCCL_SOCKET_IFNAME); "
                 "see docs/multi-host.md");
  up->add_option("--heartbeat-timeout-ms", up_options.heartbeat_timeout_ms, "mark a silent worker lost after this")
      ->check(CLI::Range(200, 600000));
  up->add_option("--replace-grace-ms", up_options.replace_grace_ms,
                 "after a worker is lost, wait this long for a replacement before re-planning onto the workers present")
      ->check(CLI::Range(0, 3600000));
  up->add_option(
        "--grow-back-min-saving-s", up_options.grow_back_min_saving_s,
        "a run a lost worker made smaller takes idle workers back at its next checkpoint when that saves at least "
        "this many seconds over its remaining steps (-1: never)")
      ->check(CLI::Range(-1, 86400));
  up->add_option(
        "--peer-timeout-ms", up_options.peer_timeout_ms,
        "the hang watchdog: a rank waiting this long for a peer or a collective gives up and the rank that did "
        "not arrive is treated as lost")
      ->check(CLI::Range(500, 3600000));
  up->add_option(
        "--stuck-task-restart-ms", up_options.stuck_task_restart_ms,
        "a worker whose cancelled task has not stopped after this (stuck in a device call) restarts its process")
      ->check(CLI::Range(1000, 3600000));
  up->add_option("--inject-fault", up_options.inject_faults, "")->group("");  // tests only: worker/fault_injector.h
  auto* down =
      app.add_subcommand("down", "stop the local cluster (state is kept); returns once its processes have exited");
  int down_grace_s = 8;
  down->add_option("--grace-s", down_grace_s,
                   "seconds to wait after the shutdown request, and again after SIGTERM, before SIGKILL")
      ->check(CLI::Range(1, 3600));

  std::string completion_shell;
  auto* completion =
      app.add_subcommand("completion", "print a shell completion script: `source <(strata completion bash)`");
  completion->add_option("shell", completion_shell, "the shell (bash)")->required()->check(CLI::IsMember({"bash"}));

  bool as_json = false;
  auto* workers_cmd = app.add_subcommand("workers", "list workers, their memory and runs");
  workers_cmd->add_flag("--json", as_json, "machine-readable output");

  std::string spec_path;
  SubmitOptions submit_options;
  auto* submit = app.add_subcommand("submit", "submit a run spec (TOML)");
  submit->add_option("spec", spec_path, "run spec file")->required();
  submit->add_flag("--follow,-f", submit_options.follow, "print progress until the run ends");
  submit->add_flag(
      "--skip-estimate", submit_options.skip_estimate,
      "submit even if the memory estimate says the plan does not fit (on out of memory the run re-plans and replays)");
  submit->add_flag(
      "--queue", submit_options.queue,
      "accept a fixed mesh (dp x pp x tp) larger than the live cluster: the run waits until enough workers are idle");
  submit
      ->add_option("--progress-every-s", submit_options.progress_every_s,
                   "with --follow into a pipe or file: a progress line at most every this many seconds, or every 5% of "
                   "the steps if sooner (on a terminal the line is live)")
      ->check(CLI::Range(1, 86400));
  submit->add_option(
      "--resume", submit_options.resume,
      "start from RUN's latest checkpoint (or RUN@STEP), under this spec's mesh, whatever mesh wrote it; RUN as "
      "everywhere: an id, a unique id prefix, a run name (its newest run) or `latest`");

  std::string run;
  auto* status = app.add_subcommand("status", "show runs");
  status->add_option("run", run, std::string(kRunHelp) + " (default: all runs)");
  status->add_flag("--json", as_json, "machine-readable output");
  bool with_losses = false;
  status->add_flag(
      "--losses", with_losses,
      "with RUN: its whole loss history in --json (as without the flag: one run's JSON always has it); the "
      "listing of all runs has each run's last loss only");
  bool watch = false;
  status->add_flag("--watch,-w", watch,
                   "live progress (step, loss, tokens/s, ETA, plan) and events until the run(s) end; without RUN the "
                   "active (pending / running) runs");
  bool watch_all = false;
  status->add_flag("--all", watch_all, "with --watch and no RUN: every run, ended ones too");
  int watch_every_s = 10;
  status
      ->add_option("--progress-every-s", watch_every_s,
                   "--watch RUN into a pipe or file: a progress line at most every this many seconds, or every 5% of "
                   "the steps if sooner")
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
  auto* export_cmd = app.add_subcommand(
      "export", "write a checkpoint as a Hugging Face directory (config.json + safetensors, as save_pretrained)");
  export_cmd->add_option("run", run, kRunHelp)->required();
  auto* export_step_option =
      export_cmd->add_option("--step", export_step, "checkpoint step (default: the latest complete one)");
  export_cmd->add_option("--out", export_dir, "output directory (new or empty)")->required();
  export_cmd->add_flag("--force", export_force,
                       "write into a non-empty --out, replacing its config.json and model.safetensors");
  export_cmd->add_option("--dtype", export_dtype, "dtype of the written weights: fp32 or bf16")->capture_default_str();
  export_cmd
      ->add_option("--max-shard-size", export_shard_size,
                   "largest safetensors file; a larger model is split into several with model.safetensors.index.json")
      ->capture_default_str();

  auto* activations_cmd =
      app.add_subcommand("activations", "list what an extract run stored (layers, sites, rows, bytes)");
  activations_cmd->add_option("run", run, std::string("the extract run: ") + kRunHelp);
  activations_cmd->add_flag("--json", as_json, "machine-readable output");
  ActivationsGet get;
  auto* get_cmd =
      activations_cmd->add_subcommand("get", "write rows of one layer to .npy / .safetensors (or .npy on stdout)");
  get_cmd->add_option("run", get.run, std::string("the extract run: ") + kRunHelp)->required();
  get_cmd->add_option("--layer", get.layer, "layer index")->required();
  get_cmd->add_option("--site", get.site,
                      "a captured site: resid_pre, resid_mid, resid_post, attn_out, mlp_out, q, k, v, attn_pattern, "
                      "mlp_hidden, final_norm, logits, logits_ids (default: the run's only site, else resid_post)");
  get_cmd->add_option("--head", get.head,
                      "only this attention head of a site with heads (q, k, v, attn_pattern): rows [n, head_dim] or "
                      "[n, sequence] instead of [n, heads, ...]");
  get_cmd->add_option("--rows", get.rows, "token rows A:B (default: every stored row)");
  get_cmd
      ->add_option("--out", get.out,
                   "FILE.npy, FILE.safetensors, or - for .npy on stdout (an existing FILE is refused)")
      ->required();
  get_cmd->add_flag("--force", get.force, "replace an existing --out file");
  get_cmd->add_flag(
      "--with-tokens", get.with_tokens,
      "also write the rows' tokens beside --out: NAME.tokens.npy, int64 [rows, 3] (token id, document, position)");
  get_cmd->add_option(
      "--store", get.stores,
      "read this worker store directory instead of asking the cluster (works with it down); once per worker");
  activations_cmd->add_option("--store", get.stores, "list from these worker store directories instead of the cluster");

  LogsRequest logs_request;
  auto* logs_cmd =
      app.add_subcommand("logs", "show one rank's log of a run (its task's log lines and one line per step)");
  logs_cmd->add_option("run", logs_request.run)->required();
  logs_cmd->add_option("--rank", logs_request.rank, "the rank (default 0)");
  logs_cmd->add_flag("--follow,-f", logs_request.follow, "keep printing new lines until the run ends");
  logs_cmd->add_option("--since", logs_request.since, "only lines from the last DURATION (500ms, 30s, 10m, 2h, 1d)");
  bool metrics_csv = false;
  auto* metrics_cmd =
      app.add_subcommand("metrics", "a run's per-step metrics (loss, lr, tokens/s, memory), one JSON object a line");
  metrics_cmd->add_option("run", run)->required();
  metrics_cmd->add_flag("--csv", metrics_csv, "CSV with a header instead of JSON lines");

  PlanRequest plan_request;
  auto* plan_cmd = app.add_subcommand(
      "plan", "the planner's mesh, ZeRO stage and micro-batch for a run spec, with each worker's memory estimate");
  plan_cmd->add_option("spec", plan_request.spec_path, "run spec file")->required();
  plan_cmd->add_option("--cluster-spec", plan_request.cluster_spec,
                       "plan for a described cluster (TOML [[nodes]]) instead of the live one");
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
      if (*shard_bytes < (uint64_t{1} << 10))
        return Fail(InvalidArgument("--max-shard-size " + export_shard_size + " is below 1KiB; use e.g. 5GB"));
      client::ExportOptions options{export_dtype, *shard_bytes};
      return CmdExport(g, run, export_step_option->count() > 0 ? std::optional<int64_t>(export_step) : std::nullopt,
                       export_dir, export_force, options);
    }
    if (*plan_cmd)
      return PlanRun(plan_request, plan_request.cluster_spec.empty()
                                       ? ResolveCoordinator(g)
                                       : Result<CoordinatorAddress>(CoordinatorAddress{}));
    if (*logs_cmd || *metrics_cmd) {
      if (*logs_cmd && !logs_request.since.empty()) {
        if (auto d = ParseDurationMs(logs_request.since); !d.ok())
          return Fail(d.status());  // before resolving the cluster
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
    return Fail(
        Unavailable(std::string("ZeroMQ refused the connection: ") + e.what() + "; check --cluster / STRATA_CLUSTER"));
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
