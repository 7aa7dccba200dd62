// The coordinator's metadata store: one place that names every key (in the style of
// storage/keys.h) and the writes a run's transitions make. Keys are order-preserving:
//   "run/"  + run id                     -> RunRecord
//   "evt/"  + str(run id) + u64(seq)     -> Event
//   "ckpt/" + str(run id) + u64(step)    -> CheckpointManifest
//   "loss/" + str(run id) + u64(step)    -> StepReport (one small record per step, so a long run
//                                           never rewrites its whole history)
//   "act/"  + str(run id) + u64(chunk)   -> ChunkLocation: the index of an extract run's stored
//                                           chunks (which worker's store holds which rows)
//   "task/" + str(run id) + str(worker)  -> u64 chunks: the chunks an extract task was given
//   "ckptdel/" + str(store path) + str(key run) + u64(step) -> (empty) a shard retention deleted
//                                           from the coordinator's view, until its store no longer holds it
//   "ckptbad/" + str(run id) + u64(step) -> why that checkpoint cannot be resumed from (a rank
//                                           could not read it, or a store no longer holds a shard)
//   "salvaged/" + key                    -> a damaged run record kept by --salvage
//
// Events are buffered in the run until its record is written: Persist writes the record and every
// event since in one synced batch, so a crash never leaves one without the other. Flush writes
// the events of runs whose record did not change (the loop calls it after every message and timer).
// Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/clock.h"
#include "coordinator/event_kind.h"
#include "coordinator/run_entry.h"
#include "storage/shard_store.h"

namespace strata::coordinator {

namespace keys {
std::string Run(const std::string& run);
std::string AllRuns();
std::string EventPrefix(const std::string& run);
std::string Event(const std::string& run, uint64_t seq);
std::string CheckpointPrefix(const std::string& run);
std::string AllCheckpoints();
std::string Checkpoint(const std::string& run, int64_t step);
std::string LossPrefix(const std::string& run);
std::string Loss(const std::string& run, int64_t step);
std::string ChunkPrefix(const std::string& run);
std::string Chunk(const std::string& run, uint64_t chunk);
std::string TaskPrefix(const std::string& run);
std::string Task(const std::string& run, const std::string& worker);
std::string DeletedShardPrefix(const std::string& store_path);
std::string DeletedShard(const std::string& store_path, const std::string& key_run, int64_t step);
std::string UnreadableCheckpoint(const std::string& run, int64_t step);
std::string Salvaged(const std::string& key);
}  // namespace keys

std::span<const uint8_t> AsBytes(const std::string& s);

class Journal {
 public:
  Journal(std::unique_ptr<storage::ShardStore> store, const Clock& clock) : store_(std::move(store)), clock_(clock) {}

  storage::ShardStore& store() { return *store_; }

  // Appends an event to the run's journal (written by the next Persist or Flush).
  void AddEvent(RunEntry& run, EventKind kind, const std::string& message);
  // A worker's notice, under the kind the worker gave it.
  void AddNotice(RunEntry& run, const std::string& kind, const std::string& message);

  // Writes the run record (losses left out: they live under loss/) with the run's buffered events
  // in one synced batch. A failure (a full disk) is logged and returned; the events stay buffered
  // and the next Persist writes the record whole again.
  Status Persist(RunEntry& run);
  // Writes buffered events of every run in `runs` whose record was not persisted since.
  void Flush(std::map<std::string, RunEntry>& runs);

  // ---- checkpoints
  // The newest committed checkpoint of `run` before step `before` that no rank found unreadable;
  // 0 if none.
  int64_t LastCheckpointStep(const std::string& run, int64_t before = std::numeric_limits<int64_t>::max());
  // Why checkpoint (run, step) cannot be resumed from; empty when it can.
  std::string UnreadableWhy(const std::string& run, int64_t step);
  bool Unreadable(const std::string& run, int64_t step) { return !UnreadableWhy(run, step).empty(); }
  Status MarkUnreadable(const std::string& run, int64_t step, const std::string& why);
  bool CheckpointCommitted(const std::string& run, int64_t step);

  // Fills `b` from the run (the persisted record leaves the losses out; replies carry them).
  static void FillRunRecord(const RunEntry& run, RunRecord::Builder b, bool with_losses);

 private:
  std::unique_ptr<storage::ShardStore> store_;
  const Clock& clock_;
};

}  // namespace strata::coordinator
