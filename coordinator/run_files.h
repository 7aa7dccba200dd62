// Per-run files: the metrics file this coordinator writes (STATE_DIR/metrics/RUN.jsonl, one JSON
// line per step) and, for `strata logs`, pieces of it or of a rank's log (written by its worker
// into its store directory). Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "coordinator/cluster.h"
#include "tensorboard/event_file.h"

namespace strata::coordinator {

class RunFiles {
 public:
  explicit RunFiles(Cluster& c);

  // Rank 0's report of `step`, appended once per step (a replayed or resent step is not).
  void AppendMetrics(const RunEntry& run, int64_t step, StepReport::Reader s);
  // Answers a RunFileRequest about `run`.
  void HandleRunFileRequest(const std::string& identity, uint64_t rid, const RunEntry& run, RunFileRequest::Reader req);

 private:
  std::string MetricsPath(const std::string& run_id) const {
    return c_.options.state_dir + "/metrics/" + run_id + ".jsonl";
  }
  int64_t LastMetricsStep(const std::string& run_id) const;

  static constexpr uint64_t kRunFileChunk = 1 << 20;
  Cluster& c_;
  std::map<std::string, int64_t> metrics_step_;  // run -> last step in its metrics file
  // run -> its TensorBoard event file, found or made on the run's first step here.
  std::map<std::string, tensorboard::EventFileWriter> boards_;
  std::string own_host_;
};

}  // namespace strata::coordinator
