// Renders a DashboardSnapshot. Pure functions of the snapshot (no clock, no I/O), so the unit
// tests pin the exact JSON and Prometheus text.
#include "coordinator/dashboard.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

namespace strata::coordinator {
namespace {

using json = nlohmann::json;

// The page draws at most this many loss points; longer runs are thinned evenly (the last step is
// always kept) so /api/state stays small however long a run is.
constexpr size_t kMaxLossPoints = 1000;

bool Terminal(const std::string& state) { return state == "finished" || state == "failed" || state == "cancelled"; }

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Byte counts print whole (not 8.589934592e+10); fractions keep 15 significant digits.
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.15g", v);
  }
  return buf;
}

// Builds one exposition: each family's HELP and TYPE come before its samples, once.
class MetricsWriter {
 public:
  void Family(const std::string& name, const std::string& type, const std::string& help) {
    out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels, double value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        out_ += (i ? "," : "") + labels[i].first + "=\"" + EscapeLabel(labels[i].second) + "\"";
      }
      out_ += "}";
    }
    out_ += " " + FormatValue(value) + "\n";
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// [[unix_ms, used, allocated], ...] oldest first: arrays, not objects, since a worker carries up
// to MemoryHistory::kCapacity.
json MemoryHistoryJson(const std::shared_ptr<const MemoryHistory>& history) {
  json out = json::array();
  for (size_t i = 0; history && i < history->size(); ++i) {
    const DashboardMemorySample& m = (*history)[i];
    out.push_back({m.unix_ms, m.used, m.allocated});
  }
  return out;
}

}  // namespace

Result<WorkerPage> ParseWorkerPage(const std::string* offset, const std::string* limit) {
  // Digits only (no sign, no space), at most 9 of them: nothing a caller types overflows.
  auto whole = [](const std::string& text) -> std::optional<size_t> {
    if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return static_cast<size_t>(std::stoul(text));
  };
  WorkerPage page;
  if (offset) {
    auto n = whole(*offset);
    if (!n)
      return InvalidArgument("workers_offset must be a whole number (0 for the first worker), got '" + *offset + "'");
    page.offset = *n;
  }
  if (limit) {
    auto n = whole(*limit);
    if (!n || *n < 1 || *n > WorkerPage::kMaxLimit) {
      return InvalidArgument("workers_limit must be a whole number from 1 to " + std::to_string(WorkerPage::kMaxLimit) +
                             ", got '" + *limit + "'");
    }
    page.limit = *n;
  }
  return page;
}

double EstimatedSecondsLeft(const DashboardRun& run) {
  if (run.state != "running" || run.tokens_per_second <= 0 || run.tokens_per_step <= 0) return -1;
  const int64_t left = std::max<int64_t>(0, run.total_steps - run.step);
  return static_cast<double>(left) * static_cast<double>(run.tokens_per_step) / run.tokens_per_second;
}

std::string RenderStateJson(const DashboardSnapshot& s, const WorkerPage& page) {
  json j;
  j["unix_ms"] = s.unix_ms;
  j["endpoint"] = s.endpoint;
  j["workers_lost_total"] = s.workers_lost_total;
  json by_state = {{"idle", 0}, {"busy", 0}, {"lost", 0}};
  for (const auto& w : s.workers) by_state[w.state] = by_state.value(w.state, 0) + 1;
  j["workers_total"] = s.workers.size();
  j["workers_by_state"] = std::move(by_state);
  j["workers_offset"] = page.offset;
  j["workers"] = json::array();
  const size_t end =
      page.offset >= s.workers.size() ? page.offset : std::min(s.workers.size(), page.offset + page.limit);
  for (size_t i = page.offset; i < end; ++i) {
    const DashboardWorker& w = s.workers[i];
    j["workers"].push_back({{"id", w.id},
                            {"host", w.host},
                            {"pid", w.pid},
                            {"state", w.state},
                            {"device", w.device},
                            {"memory",
                             {{"total", w.memory_total},
                              {"free", w.memory_free},
                              {"allocated", w.memory_allocated},
                              {"peak", w.memory_peak}}},
                            {"heartbeat_age_ms", w.heartbeat_age_ms},
                            {"current_run", w.current_run},
                            {"memory_history", MemoryHistoryJson(w.memory_history)}});
  }
  j["runs"] = json::array();
  for (const auto& r : s.runs) {
    json points = json::array();
    const size_t n = r.losses.size();
    const size_t stride = n > kMaxLossPoints ? (n + kMaxLossPoints - 1) / kMaxLossPoints : 1;
    for (size_t i = 0; i < n; i += stride) points.push_back({static_cast<int64_t>(i + 1), r.losses[i]});
    if (n > 0 && (n - 1) % stride != 0) points.push_back({static_cast<int64_t>(n), r.losses[n - 1]});
    json events = json::array();
    for (const auto& e : r.events) events.push_back({{"unix_ms", e.unix_ms}, {"kind", e.kind}, {"message", e.message}});
    const double eta = EstimatedSecondsLeft(r);
    json handled = json::object();
    for (const auto& [kind, count] : r.handled) handled[kind] = count;
    json memory = json::array();
    for (const auto& m : r.memory) {
      memory.push_back({{"worker", m.worker},
                        {"estimate", m.estimate},
                        {"workspace", m.workspace},
                        {"measured_peak", m.measured_peak}});
    }
    json plan = nullptr;
    if (r.plan.known) {
      plan = {{"dp", r.plan.dp},
              {"pp", r.plan.pp},
              {"tp", r.plan.tp},
              {"zero", r.plan.zero},
              {"micro_batch", r.plan.micro_batch},
              {"gradient_accumulation", r.plan.gradient_accumulation},
              {"recompute", r.plan.recompute},
              {"stages", r.plan.stages},
              {"keep_gathered", r.plan.keep_gathered},
              {"offload", std::string(Name(r.plan.offload))}};
    }
    json extract = nullptr;
    const bool capture = r.kind == RunKind::kExtract || r.kind == RunKind::kPatch;
    if (capture) {
      extract = {{"rows_stored", r.rows_stored},
                 {"rows_total", r.rows_total},
                 {"bytes_stored", r.bytes_stored},
                 {"bytes_per_second", r.bytes_per_second}};
    }
    const bool timed = !capture && r.tokens_per_second > 0 && r.tokens_per_step > 0;
    j["runs"].push_back(
        {{"id", r.id},
         {"name", r.name},
         {"kind", std::string(Name(r.kind))},
         {"state", r.state},
         {"created_unix_ms", r.created_unix_ms},
         {"updated_unix_ms", r.updated_unix_ms},
         {"step", r.step},
         {"total_steps", r.total_steps},
         {"loss", r.losses.empty() ? json(nullptr) : json(r.losses.back())},
         {"loss_points", std::move(points)},
         {"tokens_per_second", r.tokens_per_second},
         {"step_seconds", timed ? json(static_cast<double>(r.tokens_per_step) / r.tokens_per_second) : json(nullptr)},
         {"eta_seconds", eta < 0 ? json(nullptr) : json(eta)},
         {"workers", r.workers},
         {"message", r.message},
         {"checkpoints", r.checkpoints},
         {"workers_lost", r.workers_lost},
         {"ooms", r.ooms},
         {"restarts", r.restarts},
         {"handled", std::move(handled)},
         {"plan", std::move(plan)},
         {"memory", std::move(memory)},
         {"extract", std::move(extract)},
         {"events", std::move(events)}});
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // stored names may not be UTF-8
}

std::string RenderMetrics(const DashboardSnapshot& s) {
  MetricsWriter m;
  using Labels = std::vector<std::pair<std::string, std::string>>;

  m.Family("strata_workers", "gauge", "Registered workers by state.");
  std::map<std::string, int> by_state{{"idle", 0}, {"busy", 0}, {"lost", 0}};
  for (const auto& w : s.workers) ++by_state[w.state];
  for (const auto& [state, n] : by_state) m.Sample("strata_workers", {{"state", state}}, n);

  auto worker_gauge = [&](const std::string& name, const std::string& help, auto value) {
    m.Family(name, "gauge", help);
    for (const auto& w : s.workers) m.Sample(name, Labels{{"worker", w.id}, {"device", w.device}}, value(w));
  };
  worker_gauge("strata_worker_up", "1 while the worker sends heartbeats, 0 once it is lost.",
               [](const DashboardWorker& w) { return w.state == "lost" ? 0.0 : 1.0; });
  worker_gauge("strata_worker_memory_total_bytes", "Device memory of the worker's device.",
               [](const DashboardWorker& w) { return static_cast<double>(w.memory_total); });
  worker_gauge("strata_worker_memory_free_bytes", "Free device memory, as the device reports it.",
               [](const DashboardWorker& w) { return static_cast<double>(w.memory_free); });
  worker_gauge("strata_worker_memory_used_bytes", "Device memory in use (total - free), by any process.",
               [](const DashboardWorker& w) {
                 return static_cast<double>(w.memory_total >= w.memory_free ? w.memory_total - w.memory_free : 0);
               });
  worker_gauge("strata_worker_memory_allocated_bytes", "Memory held by the worker's tensors.",
               [](const DashboardWorker& w) { return static_cast<double>(w.memory_allocated); });
  worker_gauge("strata_worker_memory_peak_bytes", "Peak memory held by the worker's tensors.",
               [](const DashboardWorker& w) { return static_cast<double>(w.memory_peak); });
  worker_gauge("strata_worker_heartbeat_age_seconds", "Seconds since the worker's last heartbeat.",
               [](const DashboardWorker& w) { return static_cast<double>(w.heartbeat_age_ms) / 1000.0; });

  m.Family("strata_runs", "gauge", "Runs known to the coordinator, by state.");
  std::map<std::string, int> runs_by_state{
      {"pending", 0}, {"running", 0}, {"finished", 0}, {"failed", 0}, {"cancelled", 0}};
  for (const auto& r : s.runs) ++runs_by_state[r.state];
  for (const auto& [state, n] : runs_by_state) m.Sample("strata_runs", {{"state", state}}, n);

  // Per-run series only for runs still pending or running: finished runs keep their numbers in
  // /api/state and `strata status`, and the series count stays bounded by what is active.
  auto run_gauge = [&](const std::string& name, const std::string& help, auto value) {
    m.Family(name, "gauge", help);
    for (const auto& r : s.runs) {
      if (!Terminal(r.state)) m.Sample(name, Labels{{"run", r.id}, {"name", r.name}}, value(r));
    }
  };
  run_gauge("strata_run_step", "Last completed training step.", [](const DashboardRun& r) { return double(r.step); });
  run_gauge("strata_run_total_steps", "Steps the run will train.",
            [](const DashboardRun& r) { return double(r.total_steps); });
  run_gauge("strata_run_loss", "Training loss at the last step (NaN before the first).",
            [](const DashboardRun& r) { return r.losses.empty() ? std::nan("") : r.losses.back(); });
  run_gauge("strata_run_tokens_per_second", "Training throughput over all ranks.",
            [](const DashboardRun& r) { return r.tokens_per_second; });

  auto total = [&](const std::string& name, const std::string& help, double value) {
    m.Family(name, "counter", help);
    m.Sample(name, {}, value);
  };
  total("strata_checkpoints_committed_total", "Checkpoints committed (every rank's shard durable), all runs.",
        s.checkpoints_total);
  total("strata_run_workers_lost_total", "Workers lost while running a run, all runs.", s.run_workers_lost_total);
  total("strata_workers_lost_total", "Workers declared lost (heartbeat timeout) since the coordinator started.",
        s.workers_lost_total);
  total("strata_run_ooms_total", "Out-of-memory stops handled (re-planned and replayed), all runs.", s.ooms_total);
  total("strata_run_restarts_total", "Automatic run restarts (none yet: failed runs stay failed).", s.restarts_total);
  return m.Take();
}

}  // namespace strata::coordinator
