// What cluster_api.h is made of, shared with the CLI's commands (cli/): finding the coordinator
// for a Target, calling it, the replies about runs, and the JSON forms of its records that
// `strata status --json` / `strata checkpoints --json` print.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "client/cluster_api.h"
#include "client/coordinator_client.h"
#include "common/status.h"
#include "schema/envelope.h"

namespace strata::client {

// target.state_dir, else DefaultStateDir().
std::string StateDir(const Target& target);
// The coordinator's address: target.cluster, else as Target::environment_first says; checked to be
// an address ZeroMQ can connect to (InvalidArgument naming where it came from).
Result<std::string> ResolveEndpoint(const Target& target);
// The CURVE key directory: target.keys_dir, else $STRATA_KEYS, else STATE_DIR/keys (next to
// cluster.json) if it exists, else "" (a local ipc:// cluster needs none).
std::string ResolveKeysDir(const Target& target);
Result<std::unique_ptr<CoordinatorClient>> MakeClient(const Target& target, const std::string& endpoint,
                                                      int timeout_ms);
// One request to the coordinator, over a new connection (target.timeout_ms).
Result<std::unique_ptr<schema::DecodedEnvelope>> Call(const Target& target, schema::EnvelopeBuilder& request);
// Workers not lost, asked at `endpoint` with a 1 s timeout.
Result<int> CountLiveWorkers(const Target& target, const std::string& endpoint);

// The coordinator's replies about one run ("" for every run's status); `last_loss_only`: each
// run's losses holds at most its last loss (what listings show).
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchStatus(const Target& target, const std::string& run,
                                                             bool last_loss_only = false);
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchEvents(const Target& target, const std::string& run);
Result<std::unique_ptr<schema::DecodedEnvelope>> FetchCheckpoints(const Target& target, const std::string& run);

// A run's record as JSON; with_plan: with its [parallel] plan, parsed from the stored spec.
nlohmann::json RunToJson(RunRecord::Reader r, bool with_plan = true);
// The checkpoint writes of `run` waiting for disk space now: per worker whose last save-paused /
// save-resumed event is save-paused, [{"worker", "since_unix_ms", "message"}] (the run trains on
// meanwhile; torch_executor.cc). Empty when none waits or the events cannot be read.
nlohmann::json SavesWaitingForDisk(const Target& target, const std::string& run);
nlohmann::json CheckpointToJson(CheckpointManifest::Reader m);

}  // namespace strata::client
