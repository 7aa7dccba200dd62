// Checkpoints of train runs: collects each rank's shard report, has every shard copied to another
// host when the cluster spans hosts, commits the manifest once the checkpoint is whole (only then
// does `strata checkpoints` list it or a resume choose it), applies train.keep_checkpoints, and
// reconciles what a registering worker's store still holds. Not thread-safe: the loop thread
// owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "coordinator/cluster.h"

namespace strata::coordinator {

class CheckpointCommitter {
 public:
  explicit CheckpointCommitter(Cluster& c) : c_(c) {}

  // Runs after every commit (the train run grows back at a complete checkpoint).
  void OnCommitted(std::function<void(RunEntry&, int64_t step)> listener) { on_committed_ = std::move(listener); }

  // Rank `rank` saved its shard of `shard.step`. `expected` shards make the checkpoint whole; a
  // snapshot (an out-of-memory replay's start, on the same workers) is committed without copies.
  // True when this report made it whole (committed now, or copies asked for).
  bool ShardSaved(RunEntry& run, uint32_t rank, CheckpointShard::Reader shard, size_t expected, bool snapshot);
  // A copy of a shard on another host is made (or failed).
  void ShardReplicated(const std::string& identity, ShardReplicated::Reader done);
  // Copies a lost worker was making will not come: their checkpoints are not committed.
  void AbandonCopiesTo(const std::string& worker);
  // Commits run's checkpoint at `step` from its pending shards (and copies).
  void Commit(RunEntry& run, int64_t step);
  // How ranks on other hosts reach each copy of each shard (its holder's store server).
  void AddServeAddresses(CheckpointManifest::Builder manifest);
  // A worker registered with the list of committed checkpoints its store holds.
  void ReconcileStoredCheckpoints(const WorkerEntry& w, RegisterWorker::Reader req);

 private:
  bool ReplicateAcrossHosts(RunEntry& run, int64_t step);
  void AbandonCopies(RunEntry& run, int64_t step, const std::string& why);
  void ApplyRetention(RunEntry& run);
  void SendDeleteCheckpoint(const WorkerEntry& w, const std::string& key_run, int64_t step);
  void RetryDeletedShards(const WorkerEntry& w, const std::set<std::pair<std::string, int64_t>>& held);

  Cluster& c_;
  std::function<void(RunEntry&, int64_t)> on_committed_;
};

}  // namespace strata::coordinator
