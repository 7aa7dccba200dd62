#include "cli/cluster_file.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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
    file.http = j.value("http", "");
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
  if (!file.http.empty()) j["http"] = file.http;
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

Result<std::string> EnsureHttpTokenFile(const std::string& state_dir) {
  const std::string path = state_dir + "/http.token";
  if (std::filesystem::exists(path)) return path;
  unsigned char bytes[16];
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return IoError("cannot read /dev/urandom for the dashboard token");
  std::string token;
  for (unsigned char b : bytes) {
    token += "0123456789abcdef"[b >> 4];
    token += "0123456789abcdef"[b & 15];
  }
  token += "\n";
  // Created 0600 from the start: the token never sits world-readable, even briefly.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return IoError("cannot create " + path + ": " + std::strerror(errno));
  const bool written = ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
  ::close(fd);
  if (!written) return IoError("cannot write " + path);
  return path;
}

Result<int> PickLocalPort(int preferred) {
  for (int port : {preferred, 0}) {
    if (port < 0) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return IoError(std::string("cannot open a socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(addr);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    if (ok) return static_cast<int>(ntohs(addr.sin_port));
  }
  return Unavailable("no free TCP port on 127.0.0.1 for the dashboard");
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
