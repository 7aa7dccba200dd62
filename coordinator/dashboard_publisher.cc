#include "coordinator/dashboard_publisher.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "shard/plan_summary.h"

namespace strata::coordinator {

namespace {

// The run's parallel plan as it stands (shard::SummarizePlan, as `strata status` shows it).
DashboardPlan PlanOf(const RunSpec& spec) {
  const shard::PlanSummary summary = shard::SummarizePlan(spec);
  return {true,
          summary.dp,
          summary.pp,
          summary.tp,
          summary.zero,
          summary.micro_batch,
          summary.gradient_accumulation,
          summary.recompute,
          summary.stages,
          summary.keep_gathered,
          summary.offload};
}

}  // namespace

void DashboardPublisher::RebuildWorkers(int64_t now) {
  workers_built_ms_ = now;
  SharedVector<DashboardWorker> list;
  list.reserve(c_.workers.all().size());
  for (const auto& [id, w] : c_.workers.all()) {
    list.push_back({w.id, w.host, w.pid, schema::WorkerStateName(w.state), w.memory.device, w.memory.total_bytes,
                    w.memory.free_bytes, w.memory.allocated_bytes, w.memory.peak_bytes, now - w.last_heartbeat_ms,
                    w.current_run, w.memory_history});
  }
  workers_ = std::move(list);
}

// ---------------------------------------------------------------- dashboard
// Copies what the HTTP dashboard shows into an immutable snapshot (the HTTP thread never sees
// c_.workers.all() or c_.runs). Events are re-read from the store only for runs that logged new ones.
void DashboardPublisher::Publish() {
  c_.journal.Flush(c_.runs);  // the events it counts are in the store
  if (!c_.options.publish_snapshot) return;
  const int64_t now = c_.clock.SteadyMs();
  auto s = std::make_shared<DashboardSnapshot>();
  s->unix_ms = c_.clock.UnixMs();
  s->endpoint = c_.options.listen;
  s->workers_lost_total = c_.workers.lost_total();
  // What moves a worker between idle, busy and lost shows at once: a registration, a loss, a run
  // changing state. Memory and heartbeat ages follow within kWorkerListEveryMs.
  uint64_t signature = c_.workers.all().size() * 1000003u + c_.workers.lost_total();
  for (const auto& [id, run] : c_.runs) {
    signature = signature * 31 + std::hash<std::string>()(id) + static_cast<uint64_t>(run.state());
  }
  if (workers_built_ms_ < 0 || now - workers_built_ms_ >= kWorkerListEveryMs || signature != workers_signature_) {
    workers_signature_ = signature;
    RebuildWorkers(now);
  }
  s->workers = workers_;
  std::vector<const RunEntry*> runs;
  for (const auto& [id, run] : c_.runs) runs.push_back(&run);
  std::sort(runs.begin(), runs.end(), [](auto* a, auto* b) { return a->created_ms < b->created_ms; });
  size_t terminal_left = std::count_if(runs.begin(), runs.end(), [](auto* r) { return r->terminal(); });
  for (const RunEntry* run : runs) {
    RunEventCache& cache = event_cache_[run->id];
    if (cache.seq != run->next_event_seq) RefreshEvents(*run, cache);
    s->checkpoints_total += cache.checkpoints;
    s->run_workers_lost_total += cache.workers_lost;
    s->ooms_total += cache.ooms;
    // Every active run, and the 50 most recent finished ones: old history stays in `strata status`.
    if (run->terminal() && terminal_left-- > 50) continue;
    DashboardRun& r = s->runs.emplace_back();
    r.id = run->id;
    r.name = run->name;
    r.state = schema::RunStateName(run->state());
    r.created_unix_ms = run->created_ms;
    r.updated_unix_ms = run->updated_ms;
    r.step = run->step;
    r.total_steps = run->TotalSteps();
    r.tokens_per_step = int64_t{run->spec.train.global_batch} * run->spec.model.sequence;
    r.losses = run->losses;
    r.tokens_per_second = run->tokens_per_second;
    r.workers = run->workers;
    r.message = run->message;
    r.events = cache.events;
    r.checkpoints = cache.checkpoints;
    r.workers_lost = cache.workers_lost;
    r.ooms = cache.ooms;
    r.kind = run->spec.kind;
    for (const auto& [kind, count] : run->handled) r.handled.emplace_back(kind, count);
    for (const auto& m : run->memory) r.memory.push_back({m.worker, m.estimate, m.workspace, m.measured});
    if (run->spec.is_extract()) {
      r.rows_stored = run->extract.stored_rows;
      r.rows_total = run->extract.total_rows;
      r.bytes_stored = run->extract.stored_bytes;
      r.bytes_per_second = run->extract.bytes_per_second;
    } else {
      r.plan = PlanOf(run->spec);
    }
  }
  c_.options.publish_snapshot(std::move(s));
}

void DashboardPublisher::RefreshEvents(const RunEntry& run, RunEventCache& cache) {
  auto records = c_.journal.store().ScanMetadata(keys::EventPrefix(run.id));
  if (!records.ok()) return;
  cache = RunEventCache{};
  cache.seq = run.next_event_seq;
  for (auto& [key, bytes] : *records) {
    auto ev = schema::DecodedRecord<Event>::Decode(bytes);
    if (!ev.ok()) continue;
    DashboardEvent e{ev->root().getUnixMs(), ev->root().getKind().cStr(), ev->root().getMessage().cStr()};
    cache.checkpoints += e.kind == EventKindName(EventKind::kCheckpoint);
    cache.workers_lost += e.kind == EventKindName(EventKind::kWorkerLost);
    cache.ooms += e.kind == EventKindName(EventKind::kOom);
    cache.events.push_back(std::move(e));
  }
  if (cache.events.size() > 100) cache.events.erase(cache.events.begin(), cache.events.end() - 100);
}

// One line for `systemctl status`: "serving ipc://...: 2/3 workers live, 1 runs running, 0 pending".
std::string DashboardPublisher::Summary() const {
  size_t live = 0, running = 0, pending = 0;
  for (const auto& [id, w] : c_.workers.all()) live += w.state != WorkerState::LOST;
  for (const auto& [id, r] : c_.runs) {
    running += r.running();
    pending += r.pending();
  }
  return "serving " + c_.options.listen + ": " + std::to_string(live) + "/" + std::to_string(c_.workers.all().size()) +
         " workers live, " + std::to_string(running) + " runs running, " + std::to_string(pending) + " pending";
}

}  // namespace strata::coordinator
