// The CLI's cluster operations as a library, for programs (the Python package, python/): the same
// lookup of the cluster (--cluster, $STRATA_CLUSTER, STATE_DIR/cluster.json), the same CURVE keys
// (--keys, $STRATA_KEYS, STATE_DIR/keys), the same checks of a spec before it is submitted, and
// the JSON of `strata status --json` / `strata events --json`. Nothing here prints to stdout.
#pragma once

#include <optional>
#include <string>

#include "cli/activations_command.h"
#include "common/status.h"

namespace strata::cli::api {

struct Target {
  // Its cluster.json names the cluster (over $STRATA_CLUSTER); empty: the CLI's lookup from
  // --cluster, $STRATA_CLUSTER, then the default state directory.
  std::string state_dir;
  std::string cluster;   // a coordinator address; empty: from the environment or STATE_DIR
  std::string keys_dir;  // empty: $STRATA_KEYS, else STATE_DIR/keys when present
  int timeout_ms = 3000;
};

// The coordinator's address and keys as `strata` would use them.
Result<CoordinatorAddress> Coordinator(const Target& target);
// What `strata submit PATH` does, without following: the run id (the estimate goes to stderr).
Result<std::string> Submit(const Target& target, const std::string& spec_path);
// The same for spec text: relative paths in it are taken from `base_dir`; `label` names the spec
// in messages.
Result<std::string> SubmitText(const Target& target, const std::string& toml, const std::string& base_dir,
                               const std::string& label);
// A run id, unique id prefix, run name or `latest`, as the CLI resolves RUN.
Result<std::string> ResolveRun(const Target& target, const std::string& run);
// JSON text: one run's object (run non-empty), else the array of all runs.
Result<std::string> StatusJson(const Target& target, const std::string& run);
Result<std::string> EventsJson(const Target& target, const std::string& run);
Status Cancel(const Target& target, const std::string& run);

}  // namespace strata::cli::api
