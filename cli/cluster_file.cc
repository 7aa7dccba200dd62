#include "cli/cluster_file.h"

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata::cli {

std::string DefaultStateDir() {
  if (const char* dir = std::getenv("STRATA_STATE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) return std::string(xdg) + "/strata";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.local/share/strata";
}

std::string ClusterFilePath(const std::string& state_dir) { return state_dir + "/cluster.json"; }

Result<ClusterFile> ReadClusterFile(const std::string& state_dir) {
  std::ifstream in(ClusterFilePath(state_dir));
  if (!in) {
    return NotFound("no local cluster under " + state_dir + " (no cluster.json); start one with `strata up`" +
                    " or name one with --cluster / STRATA_CLUSTER");
  }
  try {
    auto j = nlohmann::json::parse(in);
    ClusterFile file;
    file.endpoint = j.at("endpoint").get<std::string>();
    file.state_dir = j.value("state_dir", state_dir);
    for (auto& p : j.value("processes", nlohmann::json::array())) {
      file.processes.push_back({p.at("name").get<std::string>(), p.at("pid").get<int>()});
    }
    return file;
  } catch (const std::exception& e) {
    return Corruption(ClusterFilePath(state_dir) + " is damaged (" + e.what() + "); run `strata down` then `strata up`");
  }
}

Status WriteClusterFile(const ClusterFile& file) {
  nlohmann::json j;
  j["endpoint"] = file.endpoint;
  j["state_dir"] = file.state_dir;
  j["processes"] = nlohmann::json::array();
  for (auto& p : file.processes) j["processes"].push_back({{"name", p.name}, {"pid", p.pid}});
  const std::string path = ClusterFilePath(file.state_dir);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return IoError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);  // atomic: readers never see half a file
  if (ec) return IoError("cannot write " + path + ": " + ec.message());
  return Status::Ok();
}

bool IsStrataProcess(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string argv0;
  std::getline(in, argv0, '\0');
  if (argv0.find("strata") == std::string::npos) return false;
  // A zombie (exited, not yet reaped) is not alive.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  stat >> pid_field >> comm >> state;
  return state != "Z";
}

}  // namespace strata::cli
