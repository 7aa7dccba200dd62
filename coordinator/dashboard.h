// What the coordinator's HTTP dashboard shows: an immutable snapshot of workers and runs that the
// event loop publishes (it owns the state; the HTTP thread only ever reads a finished snapshot),
// and the renderers of that snapshot as JSON (/api/state), Prometheus text (/metrics) and the
// HTML page (/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spec/spec_choices.h"

namespace strata::coordinator {

// One heartbeat's memory, kept by the coordinator at most once a second per worker.
struct DashboardMemorySample {
  int64_t unix_ms = 0;
  uint64_t used = 0;       // total - free (any process)
  uint64_t allocated = 0;  // held by the worker's tensors
};

struct DashboardWorker {
  std::string id;
  std::string host;
  uint32_t pid = 0;
  std::string state;  // "idle" | "busy" | "lost"
  std::string device;
  uint64_t memory_total = 0, memory_free = 0, memory_allocated = 0, memory_peak = 0;
  int64_t heartbeat_age_ms = 0;
  std::string current_run;
  std::vector<DashboardMemorySample> memory_history;  // oldest first, the last ~10 minutes
};

struct DashboardEvent {
  int64_t unix_ms = 0;
  std::string kind;
  std::string message;
};

// A train run's current parallel plan: the [parallel] fields of its spec after any re-planning
// (what `strata status RUN` prints as "plan:").
struct DashboardPlan {
  bool known = false;  // false for extract runs and specs that do not parse
  int64_t dp = 1, pp = 1, tp = 1, zero = 0;
  int64_t micro_batch = 0, gradient_accumulation = 1;
  bool recompute = false;
  std::vector<int64_t> stages;       // layers per pipeline stage
  int64_t keep_gathered = 0;         // ZeRO-3: layers a stage keeps gathered for the backward
  Offload offload = Offload::kNone;  // [parallel] offload
};

// One rank's memory: the planner's estimate against the highest peak the rank reported.
struct DashboardRankMemory {
  std::string worker;
  uint64_t estimate = 0, workspace = 0, measured_peak = 0;
};

struct DashboardRun {
  std::string id;
  RunKind kind = RunKind::kTrain;
  std::string name;
  std::string state;  // "pending" | "running" | "finished" | "failed" | "cancelled"
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t tokens_per_step = 0;  // global batch x sequence: with tokens/s gives the ETA
  std::vector<double> losses;   // index i = step i + 1
  double tokens_per_second = 0;
  std::vector<std::string> workers;  // by rank
  std::string message;
  std::vector<DashboardEvent> events;  // oldest first
  // Counted from the run's persisted events, so they survive a coordinator restart.
  uint64_t checkpoints = 0;
  uint64_t workers_lost = 0;
  uint64_t ooms = 0;
  uint64_t restarts = 0;  // runs are not restarted yet
  // Failures the run got through, by event kind (worker-lost, oom, stalled, ...): RunRecord.handled.
  std::vector<std::pair<std::string, uint64_t>> handled;
  DashboardPlan plan;
  std::vector<DashboardRankMemory> memory;  // by rank (train runs)
  // Extract runs: token rows stored of the total, bytes stored, and the capture's speed.
  uint64_t rows_stored = 0, rows_total = 0, bytes_stored = 0;
  double bytes_per_second = 0;
};

struct DashboardSnapshot {
  int64_t unix_ms = 0;  // when the event loop took it
  std::string endpoint;
  std::vector<DashboardWorker> workers;  // by id
  std::vector<DashboardRun> runs;        // oldest first
  uint64_t workers_lost_total = 0;       // since this coordinator process started
  // Over every run ever (runs[] may hold only the recent ones), counted from persisted events.
  uint64_t checkpoints_total = 0;
  uint64_t run_workers_lost_total = 0;
  uint64_t ooms_total = 0;
  uint64_t restarts_total = 0;  // runs are not restarted yet
};

// Seconds until the run's last step at its current speed; negative when unknown.
double EstimatedSecondsLeft(const DashboardRun& run);

std::string RenderStateJson(const DashboardSnapshot& snapshot);
// Prometheus text exposition format 0.0.4.
std::string RenderMetrics(const DashboardSnapshot& snapshot);
// The self-contained page served at / (inline CSS and JS; it polls /api/state).
std::string_view DashboardPageHtml();

}  // namespace strata::coordinator
