// `strata logs RUN [--rank R] [--follow] [--since DURATION]` (one rank's log of one run) and
// `strata metrics RUN [--csv]` (the run's per-step metrics, JSONL as stored or CSV). Both read
// through the coordinator (RunFileRequest in schema/messages.capnp).
#pragma once

#include <cstdint>
#include <string>

#include "cli/activations_command.h"  // CoordinatorAddress
#include "common/status.h"

namespace strata::cli {

struct LogsRequest {
  std::string run;
  uint32_t rank = 0;
  bool follow = false;  // poll for new lines until the run has ended
  std::string since;    // e.g. "10m": only lines stamped within that long before now
};

// "500ms", "30s", "10m", "2h", "1d" -> milliseconds; anything else is InvalidArgument.
Result<int64_t> ParseDurationMs(const std::string& text);

// Both return the process exit code (cli/exit.h).
int ShowLogs(const CoordinatorAddress& coordinator, const LogsRequest& request);
int ShowMetrics(const CoordinatorAddress& coordinator, const std::string& run, bool csv,
                const std::string& tensorboard_dir = "");

}  // namespace strata::cli
