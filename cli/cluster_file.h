// Where a local cluster lives: `strata up` writes STATE_DIR/cluster.json (endpoint and the
// pids it started) so later commands find the cluster without flags.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace strata::cli {

struct ClusterProcess {
  std::string name;  // "coordinator", "worker-0", ...
  int pid = 0;
};

struct ClusterFile {
  std::string endpoint;
  std::string state_dir;
  std::vector<ClusterProcess> processes;
  std::string http;  // the dashboard, "http://127.0.0.1:PORT"; empty when off
};

// $STRATA_STATE_DIR, else $XDG_DATA_HOME/strata, else ~/.local/share/strata.
std::string DefaultStateDir();
std::string ClusterFilePath(const std::string& state_dir);
Result<ClusterFile> ReadClusterFile(const std::string& state_dir);
Status WriteClusterFile(const ClusterFile& file);

// The dashboard's bearer token, STATE_DIR/http.token (mode 0600): made once with 128 random bits
// and kept, so a restarted coordinator accepts the token users already have.
Result<std::string> EnsureHttpTokenFile(const std::string& state_dir);
// A TCP port on 127.0.0.1 free right now: `preferred` if it is (a restarted coordinator keeps its
// dashboard URL), else one the kernel picks.
Result<int> PickLocalPort(int preferred);

// True if `pid` is alive and runs one of our binaries (guards against pid reuse).
bool IsStrataProcess(int pid);

// The strata-coordinator and strata-worker processes running on this machine whose arguments
// name a path under `state_dir` (as `strata up` starts them): `strata down` stops them even when
// cluster.json is gone or unreadable.
std::vector<ClusterProcess> FindStrataProcesses(const std::string& state_dir);

}  // namespace strata::cli
