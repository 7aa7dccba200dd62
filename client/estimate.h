// The live cluster as the planner sees it, and the memory and disk check a submit makes before it
// sends a training run (submit.cc; `strata plan`, cli/plan_command.cc, shows the whole estimate).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "client/coordinator_client.h"
#include "common/status.h"
#include "shard/planner.h"
#include "spec/run_spec.h"

namespace strata::client {

// A worker's shard store and its disk, as its last heartbeat reported them (total 0: not reported).
struct WorkerStore {
  std::string host, path;
  uint64_t total = 0, free = 0, fs_id = 0;
};

// The coordinator's live workers that have reported their memory (possibly none); with `stores`,
// each one's store by worker name.
Result<shard::ClusterView> ClusterFromCoordinator(CoordinatorClient& client,
                                                  std::map<std::string, WorkerStore>* stores = nullptr);

// Bytes as GiB with two decimals ("1.50").
std::string Gib(int64_t bytes);

// The estimate for the mesh the spec fixes (what the trainer runs today: dp ranks, ZeRO stage,
// micro-batch; no pp/tp/recompute/offload yet) on the live workers it would get. A one-line
// summary (with a warning line after it when a disk takes one checkpoint but not the ones kept);
// ResourceExhausted "not submitted: ..." (what was needed, what is free, what to change) when it
// cannot fit; an empty line when there is nothing to check against (an extract run, fewer live
// workers than the mesh: the run will wait). Asks over `client`, the connection the submit then
// uses.
Result<std::string> EstimateForSubmit(const RunSpec& spec, CoordinatorClient& client);

}  // namespace strata::client
