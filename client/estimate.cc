#include "client/estimate.h"

#include <algorithm>
#include <functional>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "schema/envelope.h"
#include "shard/layout.h"

namespace strata::client {

Result<shard::ClusterView> ClusterFromCoordinator(CoordinatorClient& client,
                                                  std::map<std::string, WorkerStore>* stores) {
  schema::EnvelopeBuilder request;
  request.root().setWorkersRequest();
  STRATA_ASSIGN_OR_RETURN(auto reply, client.Call(request));
  shard::ClusterView view;
  for (auto w : reply->root().getWorkersReply().getWorkers()) {
    // Lost workers, and ones whose first memory report has not arrived, cannot be planned for.
    if (w.getState() == WorkerState::LOST || w.getMemory().getTotalBytes() == 0) continue;
    const MemorySnapshot memory = schema::ReadMemoryStats(w.getMemory());
    view.workers.push_back(shard::WorkerFromMemory(w.getName().cStr(), w.getHost().cStr(), memory));
    if (stores) {
      (*stores)[w.getName().cStr()] = {w.getHost().cStr(), w.getStorePath().cStr(), memory.store_total_bytes,
                                       memory.store_free_bytes, memory.store_fs_id};
    }
  }
  return view;  // possibly empty
}

std::string Gib(int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << bytes / double(1ull << 30);
  return s.str();
}

namespace {

// Checkpoints a train run's stores hold at once: keep_checkpoints complete ones and the one being
// written (the oldest is deleted once a newer one is complete), or every one with keep = 0.
int64_t CheckpointsHeldAtOnce(const TrainSpec& train) {
  const int64_t every = train.CheckpointInterval();
  const int64_t saves = every > 0 ? (train.steps + every - 1) / every : 1;  // the last step always saves
  return train.keep_checkpoints > 0 ? std::min(train.keep_checkpoints + 1, saves) : saves;
}

// Size before you start: each disk that the plan's stores share must take one checkpoint of the
// run (ResourceExhausted naming the store, what one checkpoint needs there and what is free), and
// should take the ones it keeps at once (a warning, returned).
Result<std::string> CheckCheckpointDisks(const RunSpec& spec, const shard::Plan& plan,
                                         const std::map<std::string, WorkerStore>& stores) {
  struct Disk {
    std::vector<std::string> workers;
    std::string path;
    uint64_t free = 0;
    int64_t need = 0;  // one checkpoint
  };
  std::map<std::pair<std::string, uint64_t>, Disk> disks;  // (host, filesystem)
  for (const shard::WorkerAssignment& w : plan.workers) {
    auto store = stores.find(w.worker);
    if (store == stores.end() || store->second.total == 0) continue;  // not reported: nothing to check
    const WorkerStore& s = store->second;
    // An unknown filesystem id counts as a disk of its own.
    Disk& d = disks[{s.host, s.fs_id != 0 ? s.fs_id : std::hash<std::string>()(s.path)}];
    d.workers.push_back(w.worker);
    if (d.path.empty()) d.path = s.path;
    d.free = s.free;
    d.need += shard::CheckpointShardBytes(spec.model, plan, w, spec.lora);
  }
  const int64_t held = CheckpointsHeldAtOnce(spec.train);
  std::string warning;
  for (const auto& [key, d] : disks) {
    std::string who = d.workers.front() + "'s store at " + d.path;
    if (d.workers.size() > 1) {
      who = "the stores of ";
      for (size_t i = 0; i < d.workers.size(); ++i) who += (i ? ", " : "") + d.workers[i];
      who += " (one disk, with " + d.path + ")";
    }
    if (static_cast<uint64_t>(d.need) > d.free) {
      return Status(StatusCode::kResourceExhausted,
                    "not submitted: one checkpoint of this run needs " + Gib(d.need) + " GiB in " + who +
                        " (the fp32 weights and both AdamW moments of its ranks' shards), but that disk has " +
                        Gib(static_cast<int64_t>(d.free)) +
                        " GiB free beyond what the store keeps in reserve; free space there, give the workers stores "
                        "on a larger disk (strata-worker --store), or spread the run over more workers "
                        "(parallel.dp) so each holds less; --skip-estimate submits anyway");
    }
    if (static_cast<uint64_t>(d.need * held) > d.free) {
      warning += "\nstrata: warning: " + who + " takes one checkpoint of this run (" + Gib(d.need) +
                 " GiB) but not the " + std::to_string(held) +
                 " it holds at once (train.keep_checkpoints = " + std::to_string(spec.train.keep_checkpoints) +
                 ", and the one being written: " + Gib(d.need * held) + " GiB of " + Gib(static_cast<int64_t>(d.free)) +
                 " GiB free); a later save fails when the disk fills: lower train.keep_checkpoints or free space";
    }
  }
  return warning;
}

}  // namespace

Result<std::string> EstimateForSubmit(const RunSpec& spec, CoordinatorClient& client) {
  if (spec.is_extract()) return std::string();  // the worker plans its capture (extract.mode)
  std::map<std::string, WorkerStore> stores;
  auto live = ClusterFromCoordinator(client, &stores);
  STRATA_RETURN_IF_ERROR(live.status());  // unreachable: say so now rather than after a second timeout
  std::sort(live->workers.begin(), live->workers.end(), [](auto& a, auto& b) { return a.name < b.name; });
  if (spec.parallel.mesh_fixed()) {  // a fixed mesh takes the first workers by name
    if (static_cast<int64_t>(live->workers.size()) < spec.parallel.workers()) return std::string();  // it will wait
    live->workers.resize(static_cast<size_t>(spec.parallel.workers()));
  }
  const shard::JobSpec job = shard::JobForRun(spec);
  auto plan = shard::ChoosePlan(spec.model, job, *live);
  if (!plan.ok()) {
    if (plan.status().code() != StatusCode::kResourceExhausted) return std::string();  // nothing to say
    return Status(
        StatusCode::kResourceExhausted,
        "not submitted: " + plan.status().message() +
            "\n  or: more workers (parallel.dp, with parallel.zero = 1 or 2 to shard optimizer state and gradients), "
            "parallel.pp / parallel.tp, parallel.recompute = true, a smaller parallel.micro_batch, or a smaller model; "
            "`strata plan SPEC` shows the estimate per worker");
  }
  STRATA_ASSIGN_OR_RETURN(const std::string disk_warning, CheckCheckpointDisks(spec, *plan, stores));
  const shard::WorkerAssignment* peak = &plan->workers.front();
  for (const auto& w : plan->workers) {
    if (w.memory.total() > peak->memory.total()) peak = &w;
  }
  const auto& m = peak->memory;
  return "estimate: " + Gib(m.total()) + " GiB on " + peak->worker + " (weights " + Gib(m.weights) + ", gradients " +
         Gib(m.gradients) + ", optimizer " + Gib(m.optimizer_state) + ", activations " + Gib(m.activations) +
         ", buffers " + Gib(m.communication_buffers) + ", workspace " + Gib(m.workspace) + ") of " +
         Gib(peak->budget_bytes) + " GiB usable" +
         (plan->offload == shard::Offload::kNone || !spec.parallel.automatic.count("offload") ? std::string()
          : plan->offload == shard::Offload::kOptimizer
              ? std::string(", with the optimizer's state offloaded to host memory (no plan fits without it)")
              : std::string(", with the optimizer's state and the parameters offloaded to host memory (no plan fits "
                            "without them)")) +
         "; `strata plan` for details" + disk_warning;
}

}  // namespace strata::client
