#include "coordinator/checkpoint_committer.h"

#include <algorithm>
#include <map>
#include <vector>

#include "common/log.h"

namespace strata::coordinator {

bool CheckpointCommitter::ShardSaved(RunEntry& run, uint32_t rank, CheckpointShard::Reader shard, size_t expected,
                                     bool snapshot) {
  // A resent report of a checkpoint already committed changes nothing.
  if (c_.journal.CheckpointCommitted(run.id, shard.getStep())) return false;
  auto& by_rank = run.pending_shards[shard.getStep()];
  by_rank[rank] = schema::StructToBytes(shard);
  if (by_rank.size() != expected) return false;
  if (snapshot || !ReplicateAcrossHosts(run, shard.getStep())) Commit(run, shard.getStep());
  return true;
}

// How ranks on other hosts reach each copy of each shard: the store server of the worker that
// holds it, while that worker is alive (a lost one's would only time out).
void CheckpointCommitter::AddServeAddresses(CheckpointManifest::Builder manifest) {
  auto address_of = [&](const std::string& store_path) -> std::string {
    const WorkerEntry* w = c_.workers.WithStore(store_path);
    return w && w->state != WorkerState::LOST ? w->serve_address : "";
  };
  for (auto shard : manifest.getShards()) {
    shard.setServeAddress(address_of(shard.getStorePath().cStr()));
    for (auto copy : shard.getCopies()) copy.setServeAddress(address_of(copy.getStorePath().cStr()));
  }
}

// A checkpoint must outlive any one host with its disks: when the live workers span hosts,
// each rank's shard is copied to a store on another host (the worker there pulls it from the
// shard's store server: ReplicateShard), and the checkpoint is committed once every copy is
// durable (ShardReplicated). True when copies were asked for; false when the cluster is
// one host (commit now), or a shard cannot be copied (its worker serves no store: committed
// without copies, and the journal says so).
bool CheckpointCommitter::ReplicateAcrossHosts(RunEntry& run, int64_t step) {
  std::set<std::string> hosts;
  for (const auto& [id, w] : c_.workers.all()) {
    if (w.state != WorkerState::LOST) hosts.insert(w.host);
  }
  if (hosts.size() < 2) return false;
  struct Planned {
    uint32_t rank;
    const WorkerEntry* origin;
    const WorkerEntry* target;
    schema::DecodedRecord<CheckpointShard> shard;
  };
  std::vector<Planned> plan;
  std::map<std::string, int> load;  // copies per target, to spread them
  for (const auto& [rank, bytes] : run.pending_shards[step]) {
    auto decoded = schema::DecodedRecord<CheckpointShard>::Decode(AsBytes(bytes));
    if (!decoded.ok()) return false;
    const WorkerEntry* origin = c_.workers.WithStore(decoded->root().getStorePath().cStr());
    const WorkerEntry* target = nullptr;
    for (const auto& [id, w] : c_.workers.all()) {
      if (!origin || w.state == WorkerState::LOST || w.host == origin->host || w.identity.empty()) continue;
      if (!target || load[w.id] < load[target->id]) target = &w;
    }
    if (!origin || origin->serve_address.empty() || !target) {
      c_.AddEvent(run, EventKind::kCheckpointNotCopied,
                  "checkpoint at step " + std::to_string(step) + ": rank " + std::to_string(rank) +
                      "'s shard has no copy on another host (" +
                      (!origin ? "its store's worker is unknown"
                       : origin->serve_address.empty()
                           ? "worker " + origin->id + " serves no store: start it with --serve-address"
                           : "no live worker on another host") +
                      "); losing its host loses this checkpoint");
      return false;
    }
    ++load[target->id];
    plan.push_back({rank, origin, target, std::move(decoded).value()});
  }
  auto& copies = run.pending_copies[step];
  copies.clear();
  for (const Planned& p : plan) {
    const std::string key_run = run.id + "/copy-of-rank-" + std::to_string(p.rank);
    schema::EnvelopeBuilder msg;
    auto r = msg.root().initReplicateShard();
    r.setRunId(run.id);
    r.setStep(step);
    r.setRank(p.rank);
    r.setSource(p.origin->serve_address);
    r.setSourceKeyRun(p.shard.root().getKeyRun().size() > 0 ? p.shard.root().getKeyRun() : capnp::Text::Reader(run.id));
    r.setKeyRun(key_run);
    r.setTensors(p.shard.root().getTensors());
    c_.outbox.Send(p.target->identity, msg.Serialize());
    copies[p.rank] = {p.target->id, key_run, ""};
  }
  return true;
}

void CheckpointCommitter::ShardReplicated(const std::string& identity, ShardReplicated::Reader done) {
  auto run_it = c_.runs.find(done.getRunId().cStr());
  if (run_it == c_.runs.end()) return;
  RunEntry& run = run_it->second;
  const int64_t step = done.getStep();
  auto step_it = run.pending_copies.find(step);
  if (step_it == run.pending_copies.end()) return;  // committed, or abandoned
  auto copy = step_it->second.find(done.getRank());
  if (copy == step_it->second.end() || copy->second.target != identity ||
      copy->second.key_run != done.getKeyRun().cStr())
    return;
  if (done.getError().size() > 0) {
    AbandonCopies(run, step,
                  "copying rank " + std::to_string(done.getRank()) + "'s shard to " + identity +
                      " failed: " + done.getError().cStr());
    return;
  }
  copy->second.store_path = done.getStorePath().cStr();
  for (const auto& [rank, c] : step_it->second) {
    if (c.store_path.empty()) return;
  }
  Commit(run, step);
}

// A copy that will not come (its worker failed it or was lost): the checkpoint is not committed;
// the run's latest complete checkpoint stays the one before, and its next one is copied afresh.
void CheckpointCommitter::AbandonCopies(RunEntry& run, int64_t step, const std::string& why) {
  run.pending_copies.erase(step);
  run.pending_shards.erase(step);
  c_.AddEvent(run, EventKind::kCheckpointIncomplete,
              "checkpoint at step " + std::to_string(step) + " not committed: " + why +
                  "; the latest complete checkpoint is still the one before it");
}

void CheckpointCommitter::AbandonCopiesTo(const std::string& worker) {
  for (auto& [id, run] : c_.runs) {
    for (auto step_it = run.pending_copies.begin(); step_it != run.pending_copies.end();) {
      const int64_t step = step_it->first;
      const bool waiting_on_it = std::any_of(step_it->second.begin(), step_it->second.end(), [&](const auto& c) {
        return c.second.target == worker && c.second.store_path.empty();
      });
      ++step_it;
      if (waiting_on_it)
        AbandonCopies(run, step, "worker " + worker + ", which was making a copy of a shard on another host, was lost");
    }
  }
}

void CheckpointCommitter::Commit(RunEntry& run, int64_t step) {
  auto& by_rank = run.pending_shards[step];
  const auto copies_it = run.pending_copies.find(step);
  capnp::MallocMessageBuilder message;
  auto manifest = message.initRoot<CheckpointManifest>();
  manifest.setRunId(run.id);
  manifest.setStep(step);
  manifest.setCommittedUnixMs(c_.clock.UnixMs());
  auto shards = manifest.initShards(by_rank.size());
  size_t i = 0, copied = 0;
  for (auto& [rank, bytes] : by_rank) {
    auto decoded = schema::DecodedRecord<CheckpointShard>::Decode(AsBytes(bytes));
    if (decoded.ok()) {
      shards.setWithCaveats(i, decoded->root());
      auto shard = shards[i];
      if (const WorkerEntry* origin = c_.workers.WithStore(decoded->root().getStorePath().cStr()))
        shard.setHost(origin->host);
      if (copies_it != run.pending_copies.end() && copies_it->second.count(rank)) {
        const RunEntry::PendingCopy& c = copies_it->second.at(rank);
        auto list = shard.initCopies(1);
        list[0].setStorePath(c.store_path);
        list[0].setKeyRun(c.key_run);
        auto target = c_.workers.all().find(c.target);
        if (target != c_.workers.all().end()) list[0].setHost(target->second.host);
        ++copied;
      }
    }
    ++i;
  }
  const std::string bytes = schema::StructToBytes(manifest.asReader());
  Status st = c_.journal.store().PutMetadata(keys::Checkpoint(run.id, step), AsBytes(bytes), true);
  if (!st.ok()) {
    STRATA_LOG(kError) << "could not commit checkpoint manifest: " << st.ToString();
    return;
  }
  run.pending_copies.erase(step);
  const size_t shard_count = by_rank.size();
  run.pending_shards.erase(step);
  c_.AddEvent(run, EventKind::kCheckpoint,
              "checkpoint at step " + std::to_string(step) + " committed (" + std::to_string(shard_count) + " shards" +
                  (copied == shard_count && copied > 0 ? ", each with a copy on another host" : "") + ")");
  ApplyRetention(run);
  if (on_committed_) on_committed_(run, step);
}

// train.keep_checkpoints = N: once a checkpoint is complete, readable ones older than the newest
// N go. Safe order: a tombstone per shard location first, then the manifest (from then on no
// resume or export can choose it), then each holder is told to delete its shard; a holder that
// is away is told again when it registers (ReconcileStoredCheckpoints) until its store no
// longer holds it. Unreadable checkpoints are kept for inspection, and a checkpoint a live run
// resumes from is never deleted.
void CheckpointCommitter::ApplyRetention(RunEntry& run) {
  const int64_t keep = run.spec.train.keep_checkpoints;
  if (keep <= 0) return;
  auto list = c_.journal.store().ScanMetadata(keys::CheckpointPrefix(run.id));
  if (!list.ok()) return;
  int64_t readable = 0;
  for (auto it = list->rbegin(); it != list->rend(); ++it) {
    auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(it->second);
    if (!manifest.ok()) continue;
    const int64_t step = manifest->root().getStep();
    if (c_.journal.Unreadable(run.id, step) || ++readable <= keep) continue;
    bool in_use = false;
    for (const auto& [id, other] : c_.runs)
      in_use = in_use || (!other.terminal() && other.resume_run == run.id && other.resume_step == step);
    if (in_use) continue;
    std::vector<std::pair<std::string, std::string>> locations;  // store path, key run
    for (auto shard : manifest->root().getShards()) {
      locations.emplace_back(shard.getStorePath().cStr(),
                             shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : run.id);
      for (auto copy : shard.getCopies()) {
        locations.emplace_back(copy.getStorePath().cStr(),
                               copy.getKeyRun().size() > 0 ? copy.getKeyRun().cStr() : run.id);
      }
    }
    Status st = Status::Ok();
    for (const auto& [store_path, key_run] : locations) {
      if (st.ok()) st = c_.journal.store().PutMetadata(keys::DeletedShard(store_path, key_run, step), {}, true);
    }
    if (st.ok()) st = c_.journal.store().DeleteMetadata(it->first);
    if (!st.ok()) {
      STRATA_LOG(kError) << "run " << run.id << ": could not retire the checkpoint at step " << step << ": "
                         << st.ToString();
      return;
    }
    for (const auto& [store_path, key_run] : locations) {
      if (const WorkerEntry* holder = c_.workers.WithStore(store_path); holder && holder->state != WorkerState::LOST) {
        SendDeleteCheckpoint(*holder, key_run, step);
      }
    }
    c_.AddEvent(run, EventKind::kCheckpointDeleted,
                "checkpoint at step " + std::to_string(step) + " deleted from " + std::to_string(locations.size()) +
                    " store(s) (train.keep_checkpoints = " + std::to_string(keep) + ")");
  }
}

void CheckpointCommitter::SendDeleteCheckpoint(const WorkerEntry& w, const std::string& key_run, int64_t step) {
  schema::EnvelopeBuilder msg;
  auto d = msg.root().initDeleteCheckpoint();
  d.setKeyRun(key_run);
  d.setStep(step);
  c_.outbox.Send(w.identity, msg.Serialize());
}

// Shards retention deleted that this worker's store still holds are deleted again; tombstones
// of shards it no longer holds are done.
void CheckpointCommitter::RetryDeletedShards(const WorkerEntry& w,
                                             const std::set<std::pair<std::string, int64_t>>& held) {
  const std::string prefix = keys::DeletedShardPrefix(w.store_path);
  auto tombstones = c_.journal.store().ScanMetadata(prefix);
  if (!tombstones.ok()) return;
  for (auto& [key, value] : *tombstones) {
    std::string_view rest(key);
    rest.remove_prefix(prefix.size());
    std::string key_run;
    uint64_t step = 0;
    if (!storage::ConsumeKeyString(&rest, &key_run) || !storage::ConsumeKeyU64(&rest, &step)) continue;
    if (held.count({key_run, static_cast<int64_t>(step)})) {
      SendDeleteCheckpoint(w, key_run, static_cast<int64_t>(step));
    } else {
      (void)c_.journal.store().DeleteMetadata(key);
    }
  }
}

// A worker registered with the list of committed checkpoints its store holds. A shard of a
// committed checkpoint that this store should hold and does not (the store was salvaged after
// damage, or replaced) leaves that checkpoint without it: when the shard has no copy elsewhere,
// the checkpoint is marked unreadable (so resumes and `strata checkpoints` stop counting on it)
// with an event naming the worker, run, step and why; a lost copy is an event only.
void CheckpointCommitter::ReconcileStoredCheckpoints(const WorkerEntry& w, RegisterWorker::Reader req) {
  if (!req.getStoredCheckpointsKnown() || w.store_path.empty()) return;
  std::set<std::pair<std::string, int64_t>> held;
  for (auto c : req.getStoredCheckpoints()) held.insert({c.getKeyRun().cStr(), c.getStep()});
  RetryDeletedShards(w, held);
  auto manifests = c_.journal.store().ScanMetadata(keys::AllCheckpoints());
  if (!manifests.ok()) {
    STRATA_LOG(kError) << "cannot reconcile the checkpoints of " << w.id
                       << "'s store: " << manifests.status().message();
    return;
  }
  for (auto& [key, value] : *manifests) {
    auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(value);
    if (!manifest.ok()) continue;
    const std::string run_id = manifest->root().getRunId().cStr();
    const int64_t step = manifest->root().getStep();
    if (c_.journal.Unreadable(run_id, step)) continue;
    uint32_t rank = 0;
    for (auto shard : manifest->root().getShards()) {
      const uint32_t this_rank = rank++;
      const std::string key_run = shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : run_id;
      size_t locations = 1, missing_here = 0;
      if (shard.getStorePath() == w.store_path && !held.count({key_run, step})) ++missing_here;
      for (auto copy : shard.getCopies()) {
        ++locations;
        const std::string copy_key = copy.getKeyRun().size() > 0 ? copy.getKeyRun().cStr() : run_id;
        if (copy.getStorePath() == w.store_path && !held.count({copy_key, step})) ++missing_here;
      }
      if (missing_here == 0) continue;
      auto run = c_.runs.find(run_id);
      const std::string what = "missing shard: worker " + w.id + "'s store at " + w.store_path +
                               " no longer holds rank " + std::to_string(this_rank) +
                               "'s shard of the checkpoint at step " + std::to_string(step) +
                               " (the store was salvaged after damage, or replaced)";
      if (missing_here < locations) {
        if (run != c_.runs.end())
          c_.AddEvent(run->second, EventKind::kCheckpointCopyLost, what + "; another copy remains");
        continue;
      }
      static_cast<void>(c_.journal.MarkUnreadable(run_id, step, what));
      if (run != c_.runs.end()) {
        c_.AddEvent(run->second, EventKind::kCheckpointUnreadable,
                    what + "; it is marked unreadable and resumes use an older one");
      } else {
        STRATA_LOG(kWarn) << "run " << run_id << ": " << what;
      }
      break;
    }
  }
}

}  // namespace strata::coordinator
