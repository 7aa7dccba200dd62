// The commands of `strata` and what they share (private to cli/): each file registers its own
// subcommands (command_set.h) and runs them through these; command_support.cc,
// cluster_commands.cc and run_commands.cc define them. Finding and calling the cluster, the JSON
// of its records and submitting are client/'s (cluster_api.h, cluster_calls.h), which the Python
// package calls too.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/activations_command.h"
#include "client/cluster_api.h"
#include "client/cluster_calls.h"
#include "client/export.h"
#include "common/status.h"
#include "schema/envelope.h"

namespace strata::cli {

using json = nlohmann::json;

// The global options: --state-dir (always set: DefaultStateDir() unless given), --cluster (the
// endpoint, over $STRATA_CLUSTER, over STATE_DIR/cluster.json: environment_first), --timeout-ms,
// --keys (else $STRATA_KEYS, else STATE_DIR/keys).
using GlobalOptions = client::Target;

// gpus > 0: one worker per GPU (cuda:0..gpus-1) instead of CPU workers.
struct UpOptions {
  int workers = 2, gpus = 0, hosts = 1;
  int heartbeat_timeout_ms = 2000, replace_grace_ms = 10000, peer_timeout_ms = 120000, stuck_task_restart_ms = 30000;
  int grow_back_min_saving_s = 30;
  std::string memory_limit;
  std::string net_interface;               // passed to every worker (strata-worker --net-interface)
  bool salvage = false;                    // start daemons whose stores are damaged, keeping what is intact
  std::vector<std::string> inject_faults;  // tests only: passed to every worker (worker/fault_injector.h)
};

// `strata submit`'s options: client's, and --follow (progress_every_s is its progress lines too).
struct SubmitOptions : client::SubmitOptions {
  bool follow = false;
};

std::string Printable(const std::string& text);
std::string Printable(capnp::Text::Reader text);
std::string FormatTime(int64_t unix_ms);
int CmdKeygen(const std::string& dir, bool force);
int CmdUp(GlobalOptions& g, const UpOptions& up);
int CmdDown(GlobalOptions& g, int grace_s);
int CmdWorkers(GlobalOptions& g, bool as_json);
int CmdStatus(GlobalOptions& g, const std::string& run, bool as_json, bool with_losses);
int CmdEvents(GlobalOptions& g, const std::string& run, bool as_json);
int CmdCheckpoints(GlobalOptions& g, const std::string& run, bool as_json);
int CmdCancel(GlobalOptions& g, const std::string& run);
int Follow(GlobalOptions& g, const std::string& run, int every_s);
int WatchAll(GlobalOptions& g, bool all);
int CmdSubmit(GlobalOptions& g, const std::string& path, const SubmitOptions& o);
int CmdExport(GlobalOptions& g, const std::string& typed_run, std::optional<int64_t> step, const std::string& out_dir,
              bool force, bool adapter, const client::ExportOptions& options);

}  // namespace strata::cli
