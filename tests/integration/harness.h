// What every multi-process test needs: run a command (the `strata` CLI or a daemon) and capture
// its exit code and output, read files, a monotonic clock and a free loopback port.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::testing {

struct CommandResult {
  int rc = -1;  // exit code; -1 if killed by a signal
  std::string out;
  std::string err;
};

// Runs `command` through the shell; stdout and stderr go to files under `scratch_dir`.
CommandResult RunCommand(const std::string& command, const std::string& scratch_dir);
// Runs STRATA_BIN_DIR/strata with `args`.
CommandResult RunStrata(const std::string& args, const std::string& scratch_dir);
// `strata ARGS --json`: its output parsed; a non-zero exit or output that is not JSON fails the
// running test (and gives null).
nlohmann::json RunStrataJson(const std::string& args, const std::string& scratch_dir);

std::string ReadFile(const std::string& path);
// A scratch directory for a test suite's local cluster: made under /tmp from `mkdtemp_template`
// (ending in XXXXXX), with STRATA_STATE_DIR set to DIR/state, STRATA_CLUSTER unset, and a text
// corpus in DIR/corpus.txt (the GPL every Debian machine ships, else a repeated sentence).
std::string MakeClusterScratchDir(const std::string& mkdtemp_template);
int64_t NowMs();

// Starts argv[0] with `argv` in a child process, stdout and stderr to `log`; returns its pid.
int SpawnDaemon(std::vector<std::string> argv, const std::string& log);
// SIGTERM to each, then waits for each up to `grace_ms` before SIGKILL; reaps them all.
void StopDaemons(const std::vector<int>& pids, int grace_ms = 5000);
// A loopback TCP port that was free a moment ago.
int FreePort();

}  // namespace strata::testing
