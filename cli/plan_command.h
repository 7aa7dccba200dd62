// `strata plan SPEC [--cluster-spec FILE] [--json]`: the planner's choice for a run spec, why, and
// each worker's estimated memory (weights, gradients, optimizer state, activations,
// communication buffers, workspace) against its free memory - before anything runs. Against the
// live cluster's workers by default, or a described cluster (TOML):
//
//   [[nodes]]            # repeatable
//   count = 512          # nodes like this
//   gpus = 8             # workers per node
//   memory = "80GiB"     # per GPU
//   free = "76GiB"       # per GPU, default = memory
//   link = "nvlink"      # within the node: nvlink | pcie | tcp
//   tflops = 989         # peak per GPU
//   host_memory = "1TiB" # free host memory per node (an offloaded optimizer's state); default: not checked
// Then the largest model of the spec's width that each optimizer option (AdamW, 8-bit AdamW,
// AdamW offloaded to host memory, and with the parameters streamed from there too) trains on
// those workers (shard/capacity.h).
#pragma once

#include <string>

#include "cli/activations_command.h"  // CoordinatorAddress
#include "spec/run_spec.h"

namespace strata::cli {

struct PlanRequest {
  std::string spec_path;
  std::string cluster_spec;  // empty: ask the coordinator for its workers
  bool as_json = false;
  std::vector<std::string> overrides;  // --set key=value (client/spec_overrides.h)
};

// Returns the process exit code (cli/exit.h); `coordinator` is used only without a cluster spec.
int PlanRun(const PlanRequest& request, const Result<CoordinatorAddress>& coordinator);

}  // namespace strata::cli
