// Extract runs, scheduled by chunk rather than by rank: each worker of the run gets a contiguous
// block of chunks; a worker that finishes is free for other runs; a lost worker's unstored chunks
// wait replace_grace_ms for it to return (its store may hold some of them already, and it skips
// those), then go to whichever workers are idle. The run finishes when every chunk is in the index
// (journal keys act/ and task/). Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/cluster.h"

namespace strata::coordinator {

class ExtractScheduler {
 public:
  explicit ExtractScheduler(Cluster& c) : c_(c) {}

  // Counts the run's rows and chunks from its data file (the coordinator's host sees the same
  // data path as the workers, as for training runs).
  static Status SizeExtract(RunEntry& run);
  // Restores a loaded run's index and tasks from the journal.
  Status Load(RunEntry& run);

  void Start(RunEntry& run, const std::vector<WorkerEntry*>& workers);
  // Gives returning workers their reserved chunks, and unassigned chunks to idle workers (at most
  // parallel.dp capturing at once).
  void ScheduleChunks(RunEntry& run);
  void HandleTaskEvent(const std::string& worker, RunEntry& run, TaskEvent::Reader ev);
  void WorkerLost(RunEntry& run, const WorkerEntry& w, std::string what);

 private:
  static std::vector<uint64_t> UnassignedChunks(const RunEntry& run);
  void AssignBlocks(RunEntry& run, const std::vector<uint64_t>& chunks, const std::vector<WorkerEntry*>& workers);
  void AssignExtractTask(RunEntry& run, WorkerEntry& w, const std::vector<uint64_t>& chunks);
  void RecordChunk(RunEntry& run, const std::string& worker, ChunkStored::Reader c);
  void EndExtractTask(RunEntry& run, const std::string& worker);
  void FinishExtract(RunEntry& run);
  void ReservationExpired(const std::string& run_id, const std::string& worker, uint64_t serial);

  Cluster& c_;
  uint64_t reservations_ = 0;
};

}  // namespace strata::coordinator
