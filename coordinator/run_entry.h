// A run as the coordinator holds it in memory: its spec, where it stands (its Phase), its
// attempt's ranks and the checkpoint and capture bookkeeping. Owned by the loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "schema/envelope.h"
#include "spec/run_spec.h"

namespace strata::coordinator {

// Where a run stands. RunState (persisted, shown) is coarser: StateOf maps each phase onto it.
// Train runs use every phase; extract runs kQueued, kRunning and the terminal ones.
enum class Phase {
  kQueued,             // pending: waits for idle workers for its mesh (FIFO)
  kRecovering,         // pending after a lost rank: waits options.replace_grace_ms for its mesh
  kRecoveringAnyMesh,  // pending, the grace period over: re-planned onto the idle workers present
  kAwaitingSnapshot,   // pending after an out-of-memory stop: waits for the ranks' snapshot shards
  kRunning,
  kStallWindow,  // running; some ranks' collective timed out: waits for the others' reports
  kFinished,
  kFailed,
  kCancelled,
};

RunState StateOf(Phase phase);
const char* PhaseName(Phase phase);

// Extract runs: where each stored chunk is, and who is capturing what.
struct ExtractState {
  uint64_t total_chunks = 0;
  uint64_t total_rows = 0;
  std::map<uint64_t, std::string> stored;  // chunk -> serialized ChunkLocation (persisted under act/)
  uint64_t stored_bytes = 0;
  uint64_t stored_rows = 0;
  std::map<std::string, std::set<uint64_t>> tasks;  // worker -> its task's chunks not yet stored
  struct Reservation {
    uint64_t serial = 0;  // which reservation its expiry timer is for (a worker lost twice has two)
    std::set<uint64_t> chunks;
  };
  std::map<std::string, Reservation> reserved;  // lost worker -> chunks waiting for it
  int64_t started_ms = 0;                       // steady clock of the first assignment here
  uint64_t computed_rows = 0;                   // rows computed since started_ms
  uint64_t computed_bytes = 0;                  // their bytes
  double bytes_per_second = 0;                  // computed_bytes over the time since started_ms
  // Reports since this coordinator started: chunks computed (duplicates included, so a chunk
  // computed twice shows), and chunks a resumed task found already in its store.
  uint64_t computed_reports = 0, found_reports = 0;
};

struct RunEntry {
  std::string id;
  std::string name;
  std::string spec_toml;
  RunSpec spec;
  Phase phase = Phase::kQueued;
  uint64_t phase_serial = 0;  // bumped by every Transition: a phase's timer fires only for its own
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  int64_t step = 0;
  std::vector<double> losses;
  std::vector<std::string> workers;  // by rank
  std::string message;
  double tokens_per_second = 0;
  uint64_t next_event_seq = 0;
  // Events not yet written (seq, serialized Event): Journal::Persist writes them with the record.
  std::vector<std::pair<uint64_t, std::string>> unjournaled_events;
  uint64_t task_token = 0;
  std::set<uint32_t> finished_ranks;
  // step -> rank -> serialized CheckpointShard, until every rank has reported.
  std::map<int64_t, std::map<uint32_t, std::string>> pending_shards;
  // A cluster spanning hosts: step -> rank -> the copy of that rank's shard being made on another
  // host (CheckpointCommitter); the checkpoint is committed once every copy is.
  struct PendingCopy {
    std::string target;  // the worker making it
    std::string key_run;
    std::string store_path;  // once made
  };
  std::map<int64_t, std::map<uint32_t, PendingCopy>> pending_copies;
  // What the run's weights start from (model::BaseIdentity, computed at submit; LoRA runs only):
  // a LoRA checkpoint resumes only onto the base it was trained over.
  std::string base_identity;
  // Train runs started from a checkpoint (of another run, under any mesh): its run and step.
  std::string resume_run;
  int64_t resume_step = 0;
  bool resume_step_asked = false;  // `submit --resume RUN@STEP` named the step: never another one
  // The dp it ran with before a lost worker made it smaller (0: never shrunk, or grown back).
  int64_t grow_back_to_dp = 0;
  // After an out-of-memory stop (Phase::kAwaitingSnapshot): the step whose state the ranks of
  // attempt `token` are saving (its checkpoint is the replay's start) and how many shards make it
  // whole. Shards of it are accepted while token != 0.
  struct Snapshot {
    int64_t step = 0;
    uint64_t token = 0;
    size_t ranks = 0;
  } snapshot;
  // Phase::kStallWindow: the ranks whose collective timed out without naming who did not arrive;
  // when the window closes the ranks not among them are blamed (options.stall_window_ms).
  struct Stall {
    std::set<uint32_t> ranks;
    std::string detail;  // the first report's
  } stall;
  // Train runs, by rank: the planner's estimate and the highest peak the rank has reported.
  struct RankMemory {
    std::string worker;
    uint64_t estimate = 0, workspace = 0, measured = 0;
  };
  std::vector<RankMemory> memory;
  std::map<std::string, uint32_t> handled;  // failure event kind -> how many (RunRecord.handled)
  ExtractState extract;                     // kind == "extract" only

  RunState state() const { return StateOf(phase); }
  bool terminal() const { return phase == Phase::kFinished || phase == Phase::kFailed || phase == Phase::kCancelled; }
  bool pending() const { return state() == RunState::PENDING; }
  bool running() const { return state() == RunState::RUNNING; }
  int64_t TotalSteps() const {
    return spec.is_extract() ? static_cast<int64_t>(extract.total_chunks) : spec.train.steps;
  }
};

}  // namespace strata::coordinator
