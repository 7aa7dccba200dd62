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
};

// $STRATA_STATE_DIR, else $XDG_DATA_HOME/strata, else ~/.local/share/strata.
std::string DefaultStateDir();
std::string ClusterFilePath(const std::string& state_dir);
Result<ClusterFile> ReadClusterFile(const std::string& state_dir);
Status WriteClusterFile(const ClusterFile& file);

// True if `pid` is alive and runs one of our binaries (guards against pid reuse).
bool IsStrataProcess(int pid);

}  // namespace strata::cli
