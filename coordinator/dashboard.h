// What the coordinator's HTTP dashboard shows: an immutable snapshot of workers and runs that the
// event loop publishes (it owns the state; the HTTP thread only ever reads a finished snapshot),
// and the renderers of that snapshot as JSON (/api/state), Prometheus text (/metrics) and the
// HTML page (/).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "spec/spec_choices.h"

namespace strata::coordinator {

// One heartbeat's memory, as the dashboard's chart keeps it.
struct DashboardMemorySample {
  int64_t unix_ms = 0;
  uint64_t used = 0;       // total - free (any process)
  uint64_t allocated = 0;  // held by the worker's tensors
};

// A worker's memory over the last 10 minutes: a sample every kEveryMs in a ring of fixed size,
// allocated whole, so what the coordinator holds is set by the cluster's size, never by its
// uptime. Shared immutable (std::shared_ptr<const MemoryHistory>): the registry appends to a copy
// when a sample is due and snapshots share the current one, so publishing copies no samples.
class MemoryHistory {
 public:
  static constexpr int64_t kEveryMs = 5000;
  static constexpr size_t kCapacity = 120;

  void Append(const DashboardMemorySample& sample) {  // the oldest is dropped once full
    if (size_ < kCapacity) {
      ring_[(begin_ + size_++) % kCapacity] = sample;
    } else {
      ring_[begin_] = sample;
      begin_ = (begin_ + 1) % kCapacity;
    }
  }
  size_t size() const { return size_; }
  const DashboardMemorySample& operator[](size_t i) const { return ring_[(begin_ + i) % kCapacity]; }  // 0: oldest
  const DashboardMemorySample& newest() const { return (*this)[size_ - 1]; }                           // size() > 0

 private:
  std::array<DashboardMemorySample, kCapacity> ring_{};
  size_t begin_ = 0, size_ = 0;
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
  std::shared_ptr<const MemoryHistory> memory_history;  // null: no sample yet
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

// A vector shared between snapshots, copied only when one is changed: the worker list is rebuilt
// at most once a second (WorkerListEveryMs) while snapshots go out every 250 ms, and at 10,000
// workers a rebuild held the event loop for milliseconds.
template <typename T>
class SharedVector {
 public:
  void push_back(T value) { Mutable().push_back(std::move(value)); }
  void reserve(size_t n) { Mutable().reserve(n); }
  size_t size() const { return items_ ? items_->size() : 0; }
  bool empty() const { return size() == 0; }
  const T& operator[](size_t i) const { return (*items_)[i]; }
  const T& front() const { return items_->front(); }
  const T* begin() const { return items_ ? items_->data() : nullptr; }
  const T* end() const { return items_ ? items_->data() + items_->size() : nullptr; }

 private:
  std::vector<T>& Mutable() {
    if (!items_) {
      items_ = std::make_shared<std::vector<T>>();
    } else if (items_.use_count() > 1) {
      items_ = std::make_shared<std::vector<T>>(*items_);
    }
    return *items_;
  }
  std::shared_ptr<std::vector<T>> items_;
};

struct DashboardSnapshot {
  int64_t unix_ms = 0;  // when the event loop took it
  std::string endpoint;
  SharedVector<DashboardWorker> workers;  // by id; as of up to a second before unix_ms
  std::vector<DashboardRun> runs;         // oldest first
  uint64_t workers_lost_total = 0;        // since this coordinator process started
  // Over every run ever (runs[] may hold only the recent ones), counted from persisted events.
  uint64_t checkpoints_total = 0;
  uint64_t run_workers_lost_total = 0;
  uint64_t ooms_total = 0;
  uint64_t restarts_total = 0;  // runs are not restarted yet
};

// Seconds until the run's last step at its current speed; negative when unknown.
double EstimatedSecondsLeft(const DashboardRun& run);

// Which workers /api/state lists (`?workers_offset=&workers_limit=`), by id: at 10,000 workers
// the whole list with its charts is tens of megabytes a poll. Counts by state cover them all.
struct WorkerPage {
  static constexpr size_t kDefaultLimit = 100, kMaxLimit = 1000;
  size_t offset = 0;
  size_t limit = kDefaultLimit;
};

// The page from the query's values (null: not given): whole numbers, the limit 1 to kMaxLimit;
// InvalidArgument naming the parameter otherwise.
Result<WorkerPage> ParseWorkerPage(const std::string* offset, const std::string* limit);

std::string RenderStateJson(const DashboardSnapshot& snapshot, const WorkerPage& page = {});
// Prometheus text exposition format 0.0.4.
std::string RenderMetrics(const DashboardSnapshot& snapshot);
// The self-contained page served at / (inline CSS and JS; it polls /api/state).
std::string_view DashboardPageHtml();

}  // namespace strata::coordinator
