#include "bench/control_plane_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace cpbench {

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  p.count = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1)];
  };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  p.max = v.back();
  return p;
}

std::string Fmt(double v, int digits) {
  if (std::isnan(v)) return "-";
  char buf[64];
  snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Json(const BenchResult& r) {
  auto pct = [](const Percentiles& p) {
    return "{\"p50\":" + (std::isnan(p.p50) ? std::string("null") : Fmt(p.p50, 3)) +
           ",\"p99\":" + (std::isnan(p.p99) ? std::string("null") : Fmt(p.p99, 3)) +
           ",\"max\":" + (std::isnan(p.max) ? std::string("null") : Fmt(p.max, 3)) +
           ",\"n\":" + std::to_string(p.count) + "}";
  };
  std::ostringstream o;
  o << "{\"workers\":" << r.workers << ",\"all_registered\":" << (r.all_registered ? "true" : "false")
    << ",\"register_s\":" << Fmt(r.register_s, 2) << ",\"window_s\":" << Fmt(r.window_s, 1)
    << ",\"coordinator_cpu_cores\":" << Fmt(r.cpu_fraction, 3)
    << ",\"bench_cpu_cores\":" << Fmt(r.bench_cpu_fraction, 3)
    << ",\"vmrss_mib\":" << Fmt(static_cast<double>(r.rss_kb) / 1024, 1)
    << ",\"vmhwm_mib\":" << Fmt(static_cast<double>(r.hwm_kb) / 1024, 1)
    << ",\"heartbeats_per_s\":" << Fmt(r.heartbeats_per_s, 0) << ",\"heartbeats_dropped\":" << r.heartbeats_dropped
    << ",\"errors_to_workers\":" << r.errors << ",\"loop_delay_ms\":" << pct(r.loop_delay_ms)
    << ",\"probe_failures\":" << r.probe_failures << ",\"submit_to_assign_ms\":" << pct(r.submit_ms)
    << ",\"workers_request_ms\":" << pct(r.workers_request_ms) << ",\"workers_reply_bytes\":" << r.workers_reply_bytes
    << ",\"workers_live\":" << r.workers_live << ",\"cli_workers_ms\":" << pct(r.cli_workers_ms)
    << ",\"api_state_ms\":" << pct(r.api_state_ms) << ",\"api_state_bytes\":" << r.api_state_bytes;
  if (!r.submit_error.empty()) o << ",\"submit_error\":\"" << r.submit_error << "\"";
  o << ",\"partial\":" << (r.partial ? "true" : "false") << ",\"minutes\":[";
  for (size_t i = 0; i < r.minutes.size(); ++i) {
    const auto& m = r.minutes[i];
    o << (i ? "," : "") << "{\"vmrss_mib\":" << Fmt(static_cast<double>(m.rss_kb) / 1024, 1)
      << ",\"loop_delay_ms\":" << pct(m.loop_delay_ms)
      << ",\"api_state_ms\":" << (std::isnan(m.api_state_ms) ? std::string("null") : Fmt(m.api_state_ms, 1))
      << ",\"api_state_bytes\":" << m.api_state_bytes << ",\"poll_ms\":" << pct(m.poll_ms) << "}";
  }
  o << "]}";
  return o.str();
}

void PrintTable(const std::vector<BenchResult>& results) {
  printf(
      "\n| workers | coord CPU (cores) | bench CPU | VmRSS / VmHWM MiB | heartbeats/s | loop delay p50 / p99 ms | "
      "submit->assign p50 / max ms | workersRequest ms | `strata workers` ms | GET /api/state ms (bytes) |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : results) {
    printf("| %d%s%s | %s | %s | %s / %s | %s | %s / %s | %s / %s | %s (%zu live) | %s | %s (%zu) |\n", r.workers,
           r.all_registered ? "" : " (not all registered)", r.partial ? " (partial)" : "",
           Fmt(r.cpu_fraction, 3).c_str(), Fmt(r.bench_cpu_fraction, 2).c_str(),
           Fmt(static_cast<double>(r.rss_kb) / 1024, 0).c_str(), Fmt(static_cast<double>(r.hwm_kb) / 1024, 0).c_str(),
           Fmt(r.heartbeats_per_s, 0).c_str(), Fmt(r.loop_delay_ms.p50).c_str(), Fmt(r.loop_delay_ms.p99).c_str(),
           Fmt(r.submit_ms.p50).c_str(), Fmt(r.submit_ms.max).c_str(), Fmt(r.workers_request_ms.p50, 1).c_str(),
           static_cast<size_t>(r.workers_live), Fmt(r.cli_workers_ms.p50, 0).c_str(),
           Fmt(r.api_state_ms.p50, 1).c_str(), r.api_state_bytes);
  }
}

}  // namespace cpbench
