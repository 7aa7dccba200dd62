// The commands of `strata` and what they share (private to cli/): each file registers its own
// subcommands (command_set.h) and runs them through these; command_support.cc,
// cluster_commands.cc and run_commands.cc define them.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/activations_command.h"
#include "client/coordinator_client.h"
#include "client/export.h"
#include "common/status.h"
#include "schema/envelope.h"

namespace strata::cli {

using json = nlohmann::json;

struct GlobalOptions {
  std::string state_dir;
  std::string cluster;  // endpoint override
  int timeout_ms = 3000;
  std::string keys_dir;  // CURVE keys override (--keys, else $STRATA_KEYS, else STATE_DIR/keys)
};

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

struct SubmitOptions {
  bool follow = false;
  bool skip_estimate = false;
  bool queue = false;  // a fixed mesh larger than the live cluster waits for workers instead of being refused
  std::string resume;
  int progress_every_s = 10;
};

Result<std::string> ResolveEndpoint(const GlobalOptions& g);
std::string ResolveKeysDir(const GlobalOptions& g);
Result<std::unique_ptr<client::CoordinatorClient>> MakeClient(const GlobalOptions& g, const std::string& endpoint,
                                                              int timeout_ms);
Result<CoordinatorAddress> ResolveCoordinator(const GlobalOptions& g);
Result<std::unique_ptr<schema::DecodedEnvelope>> Call(const GlobalOptions& g, schema::EnvelopeBuilder& request);
std::string Printable(const std::string& text);
std::string Printable(capnp::Text::Reader text);
std::string FormatTime(int64_t unix_ms);
json RunToJson(RunRecord::Reader r, bool with_plan = true);
json CheckpointToJson(CheckpointManifest::Reader m);
int CmdKeygen(const std::string& dir, bool force);
Result<int> CountLiveWorkers(const GlobalOptions& g, const std::string& endpoint);
int CmdUp(GlobalOptions& g, const UpOptions& up);
int CmdDown(GlobalOptions& g, int grace_s);
int CmdWorkers(GlobalOptions& g, bool as_json);
// The coordinator's replies about one run ("" for every run's status); `last_loss_only`: each
// run's losses holds at most its last loss (what listings show).
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchStatus(const GlobalOptions& g, const std::string& run,
                                                             bool last_loss_only = false);
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchEvents(const GlobalOptions& g, const std::string& run);
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchCheckpoints(const GlobalOptions& g, const std::string& run);
Result<std::string> ResolveRun(const GlobalOptions& g, const std::string& text);
Result<json> StatusJson(const GlobalOptions& g, const std::string& run);
Result<json> EventsJson(const GlobalOptions& g, const std::string& run);
int CmdStatus(GlobalOptions& g, const std::string& run, bool as_json, bool with_losses);
int CmdEvents(GlobalOptions& g, const std::string& run, bool as_json);
int CmdCheckpoints(GlobalOptions& g, const std::string& run, bool as_json);
int CmdCancel(GlobalOptions& g, const std::string& run);
int Follow(GlobalOptions& g, const std::string& run, int every_s);
int WatchAll(GlobalOptions& g, bool all);
Result<std::string> SubmitSpecText(const GlobalOptions& g, const std::string& text, const std::string& base,
                                   const std::string& path, const SubmitOptions& o);
Result<std::string> SubmitSpecFile(const GlobalOptions& g, const std::string& path, const SubmitOptions& o);
int CmdSubmit(GlobalOptions& g, const std::string& path, const SubmitOptions& o);
int CmdExport(GlobalOptions& g, const std::string& typed_run, std::optional<int64_t> step, const std::string& out_dir,
              bool force, const client::ExportOptions& options);

}  // namespace strata::cli
