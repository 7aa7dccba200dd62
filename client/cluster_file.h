// Where a local cluster lives: `strata up` writes STATE_DIR/cluster.json (endpoint and the
// pids it started) so later commands find the cluster without flags.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace strata::client {

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

// Where a process stands. A killed process is not gone the moment kill() returns: its threads
// leave one by one, and its files - the RocksDB LOCK among them - close only when the last one
// does, which under load or in disk sleep takes a second or more. Its leader can even show as a
// zombie, or with an empty command line, while other threads still hold the files. So "gone"
// means no thread of it is left; a pending SIGKILL, a leader past exit or a zombie leader with
// threads left is "exiting".
enum class ProcessLife { kGone, kRunning, kExiting };

// `pid` as Linux's /proc shows it, any program.
ProcessLife LifeOf(int pid);
namespace internal {
// The rule of LifeOf over the texts of /proc/PID/stat and /proc/PID/status (tests feed states a
// real process cannot be held in).
ProcessLife LifeFromProc(const std::string& stat, const std::string& status);
}  // namespace internal

// True while `pid` runs one of our binaries (guards against pid reuse), exiting included: what
// still holds a store is not gone.
bool IsStrataProcess(int pid);
// Waits until a strata process that is exiting is gone: true at once for a gone or running one,
// false if it is still exiting after `timeout_ms`.
bool AwaitExitOf(int pid, int timeout_ms);

// The strata-coordinator and strata-worker processes running on this machine whose arguments
// name a path under `state_dir` (as `strata up` starts them): `strata down` stops them even when
// cluster.json is gone or unreadable.
std::vector<ClusterProcess> FindStrataProcesses(const std::string& state_dir);

}  // namespace strata::client
