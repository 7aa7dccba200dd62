// control_plane_bench's measurements: what one worker count gave, as a JSON line and a table row.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cpbench {

struct Percentiles {
  double p50 = NAN, p99 = NAN, max = NAN;
  size_t count = 0;
};

struct BenchResult {
  int workers = 0;
  bool all_registered = false;
  double register_s = 0;
  double window_s = 0;
  double cpu_fraction = 0;
  double bench_cpu_fraction = 0;
  int64_t rss_kb = 0, hwm_kb = 0;
  double heartbeats_per_s = 0;
  int64_t heartbeats_dropped = 0;
  int64_t errors = 0;
  Percentiles loop_delay_ms;
  int64_t probe_failures = 0;
  Percentiles submit_ms;
  std::string submit_error;
  Percentiles workers_request_ms;
  size_t workers_reply_bytes = 0;
  int64_t workers_live = 0;
  Percentiles cli_workers_ms;
  Percentiles api_state_ms;
  size_t api_state_bytes = 0;
  bool partial = false;  // stopped early (deadline or signal): what was measured until then
  // One per full minute of the window: the coordinator's RSS, that minute's loop delay and a
  // GET /api/state (ms, bytes; NaN / 0 without the dashboard).
  struct Minute {
    int64_t rss_kb = 0;
    Percentiles loop_delay_ms;
    double api_state_ms = NAN;
    size_t api_state_bytes = 0;
    Percentiles poll_ms;  // that minute's GETs of the dashboard's poller (--poll-ms)
  };
  std::vector<Minute> minutes;
};

Percentiles Summarize(std::vector<double> v);
std::string Fmt(double v, int digits = 2);  // "-" for NaN
std::string Json(const BenchResult& r);
void PrintTable(const std::vector<BenchResult>& results);

}  // namespace cpbench
