// Strata's cluster operations as a library: what `strata` (cli/) and the Python package (python/)
// both call. The same lookup of the cluster (--cluster, $STRATA_CLUSTER, STATE_DIR/cluster.json),
// the same CURVE keys (--keys, $STRATA_KEYS, STATE_DIR/keys), the same checks of a spec before it
// is submitted, and the JSON of `strata status --json` / `strata events --json`. Nothing here
// prints to stdout; the few notes it has for a person (a submit's estimate, tokenizing progress,
// which of several runs of one name was taken) go to stderr or to SubmitOptions::log.
// cluster_calls.h has the requests and JSON forms underneath, for the CLI's own commands.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

#include "common/curve.h"
#include "common/status.h"

namespace strata::client {

// Which cluster to talk to, and how.
struct Target {
  // The cluster's state directory (cluster.json, keys/, token-cache/); empty: DefaultStateDir()
  // (client/cluster_file.h).
  std::string state_dir;
  std::string cluster;   // a coordinator address; empty: $STRATA_CLUSTER or cluster.json, as below
  std::string keys_dir;  // CURVE keys; empty: $STRATA_KEYS, else STATE_DIR/keys when present
  int timeout_ms = 3000;
  // With `cluster` empty: false (a program), a state_dir it names is the cluster it means, so that
  // directory's cluster.json wins over $STRATA_CLUSTER, which only overrides the default state
  // directory; true (the CLI, whose state_dir is always set): $STRATA_CLUSTER wins over
  // --state-dir too, and STATE_DIR/cluster.json is the last resort.
  bool environment_first = false;
};

// Where the coordinator is and the keys to reach it with.
struct CoordinatorAddress {
  std::string endpoint;
  std::optional<curve::ClientKeys> keys;
  int timeout_ms = 10000;
};

struct SubmitOptions {
  bool skip_estimate = false;   // submit even when the memory estimate says the plan does not fit
  bool queue = false;           // a fixed mesh larger than the live cluster waits for workers instead of being refused
  std::string resume;           // RUN[@STEP]: start from that run's checkpoint (RUN as ResolveRun takes it)
  int progress_every_s = 10;    // tokenizing data.format = "text": a progress line at most this often
  std::ostream* log = nullptr;  // the estimate and tokenizing progress; nullptr: stderr
  std::vector<std::string> overrides;  // "key=value" set on the spec before anything (spec_overrides.h)
};

// The coordinator's address and keys as `strata` would use them (at least 10 s of timeout: reads
// of big chunks take longer than a status call).
Result<CoordinatorAddress> Coordinator(const Target& target);
// Checks, prepares and submits the run spec at `spec_path` (a regular file of at most 1 MiB); the
// run id. Relative paths in the spec are taken from its directory.
Result<std::string> Submit(const Target& target, const std::string& spec_path, const SubmitOptions& options = {});
// The same for spec text: relative paths in it are taken from `base_dir`; `label` names the spec
// in messages.
Result<std::string> SubmitText(const Target& target, const std::string& toml, const std::string& base_dir,
                               const std::string& label, const SubmitOptions& options = {});
// A run id, unique id prefix, run name or `latest`, resolved to a run id as the CLI resolves RUN;
// text that matches nothing comes back unchanged (the coordinator's "no such run" then answers).
Result<std::string> ResolveRun(const Target& target, const std::string& run);
// JSON text: one run's object (run non-empty), else the array of all runs; `indent` < 0: on one
// line (nlohmann::json's dump).
Result<std::string> StatusJson(const Target& target, const std::string& run, int indent = -1);
// JSON text: the array of a run's events.
Result<std::string> EventsJson(const Target& target, const std::string& run, int indent = -1);
Status Cancel(const Target& target, const std::string& run);

}  // namespace strata::client
