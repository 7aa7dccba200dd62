#include "client/estimate.h"

#include <algorithm>
#include <functional>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "common/token_file.h"
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

// The disks a set of workers' stores write to, each with the bytes asked of it: stores of one host
// with one filesystem id share a disk (an unknown id counts as a disk of its own); workers whose
// store reported no disk are left out (nothing to check).
struct Disk {
  std::vector<std::string> workers;
  std::string path;
  uint64_t free = 0;
  int64_t need = 0;
  // "worker-0's store at PATH", or "the stores of A, B (one disk, with PATH)".
  std::string Who() const {
    if (workers.size() == 1) return workers.front() + "'s store at " + path;
    std::string who = "the stores of ";
    for (size_t i = 0; i < workers.size(); ++i) who += (i ? ", " : "") + workers[i];
    return who + " (one disk, with " + path + ")";
  }
};

std::vector<Disk> DisksOf(const std::vector<std::pair<std::string, int64_t>>& needs,
                          const std::map<std::string, WorkerStore>& stores) {
  std::map<std::pair<std::string, uint64_t>, Disk> disks;  // (host, filesystem)
  for (const auto& [worker, need] : needs) {
    auto store = stores.find(worker);
    if (store == stores.end() || store->second.total == 0) continue;
    const WorkerStore& s = store->second;
    Disk& d = disks[{s.host, s.fs_id != 0 ? s.fs_id : std::hash<std::string>()(s.path)}];
    d.workers.push_back(worker);
    if (d.path.empty()) d.path = s.path;
    d.free = s.free;
    d.need += need;
  }
  std::vector<Disk> out;
  for (auto& [key, d] : disks) out.push_back(std::move(d));
  return out;
}

// Size before you start: each disk that the plan's stores share must take one checkpoint of the
// run (ResourceExhausted naming the store, what one checkpoint needs there and what is free), and
// should take the ones it keeps at once (a warning, returned).
Result<std::string> CheckCheckpointDisks(const RunSpec& spec, const shard::Plan& plan,
                                         const std::map<std::string, WorkerStore>& stores) {
  std::vector<std::pair<std::string, int64_t>> needs;  // one checkpoint's shard per worker
  for (const shard::WorkerAssignment& w : plan.workers)
    needs.emplace_back(w.worker, shard::CheckpointShardBytes(spec.model, plan, w, spec.lora));
  const int64_t held = CheckpointsHeldAtOnce(spec.train);
  std::string warning;
  for (const Disk& d : DisksOf(needs, stores)) {
    const std::string who = d.Who();
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

// Size before you start, for a capture (extract and patch runs): its records (every layer and
// site of every row, ExtractChunkBytes a chunk) are spread over the live workers in equal
// contiguous blocks (coordinator/extract_scheduler.cc), so each disk must take its workers'
// shares. ResourceExhausted naming the disk, its share and the shortfall; nothing to say when the
// data file cannot be read here (the coordinator sizes the run and refuses it itself).
Status CheckCaptureDisks(const RunSpec& spec, const std::map<std::string, WorkerStore>& stores) {
  auto layout = ReadTokenFileLayout(spec.data.path, spec.data.format);
  if (!layout.ok() || stores.empty() || spec.extract.batch <= 0) return Status::Ok();
  const int64_t sequences = ExtractSequences(spec, static_cast<int64_t>(layout->tokens));
  if (sequences <= 0) return Status::Ok();
  const double total = static_cast<double>(ExtractChunkBytes(spec)) * static_cast<double>(sequences) /
                       static_cast<double>(spec.extract.batch);
  const auto share = static_cast<int64_t>(total / static_cast<double>(stores.size()));
  std::vector<std::pair<std::string, int64_t>> needs;
  for (const auto& [worker, store] : stores) needs.emplace_back(worker, share);
  for (const Disk& d : DisksOf(needs, stores)) {
    if (static_cast<uint64_t>(d.need) <= d.free) continue;
    return Status(StatusCode::kResourceExhausted,
                  "not submitted: this capture writes about " + Gib(static_cast<int64_t>(total)) + " GiB (" +
                      std::to_string(sequences * spec.model.sequence) + " rows), of which about " + Gib(d.need) +
                      " GiB go to " + d.Who() + ", but that disk has " + Gib(static_cast<int64_t>(d.free)) +
                      " GiB free beyond what the store keeps in reserve (" +
                      Gib(d.need - static_cast<int64_t>(d.free)) +
                      " GiB short); capture fewer rows (extract.tokens), layers or sites, store them smaller "
                      "(extract.dtype = \"bf16\"), free space there, or add workers; --skip-estimate submits anyway");
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> EstimateForSubmit(const RunSpec& spec, CoordinatorClient& client) {
  std::map<std::string, WorkerStore> stores;
  auto live = ClusterFromCoordinator(client, &stores);
  STRATA_RETURN_IF_ERROR(live.status());  // unreachable: say so now rather than after a second timeout
  if (spec.is_extract()) {  // the worker plans its capture's memory (extract.mode); the disks are checked here
    STRATA_RETURN_IF_ERROR(CheckCaptureDisks(spec, stores));
    return std::string();
  }
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
