#include "client/cluster_file.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/hex.h"

namespace strata::client {

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
    return Corruption(ClusterFilePath(state_dir) + " is damaged (" + e.what() +
                      "); run `strata down` then `strata up`");
  }
}

Status WriteClusterFile(const ClusterFile& file) {
  nlohmann::json j;
  j["endpoint"] = file.endpoint;
  j["state_dir"] = file.state_dir;
  if (!file.http.empty()) j["http"] = file.http;
  j["processes"] = nlohmann::json::array();
  for (auto& p : file.processes) j["processes"].push_back({{"name", p.name}, {"pid", p.pid}});
  // Atomic and synced: a full disk leaves the old file whole (an ofstream reported the write
  // before its buffer reached the disk, so a full disk renamed an empty file into place).
  return WriteFileAtomically(ClusterFilePath(file.state_dir), j.dump(2) + "\n", 0600);
}

Result<std::string> EnsureHttpTokenFile(const std::string& state_dir) {
  const std::string path = state_dir + "/http.token";
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) > 1 && !ec) return path;
  unsigned char bytes[16];
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes)))
    return IoError("cannot read /dev/urandom for the dashboard token");
  std::string token = HexOf(std::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
  token += "\n";
  // Created 0600 from the start (the token never sits world-readable, even briefly) and whole or
  // not at all: a half-written token on a full disk would be kept forever.
  STRATA_RETURN_IF_ERROR(WriteFileAtomically(path, token, 0600));
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

namespace internal {

ProcessLife LifeFromProc(const std::string& stat, const std::string& status) {
  // stat: "PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS ..."; COMM may hold spaces and
  // parentheses, so fields are counted from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return ProcessLife::kGone;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  unsigned long long flags = 0;
  std::string skip;
  fields >> state >> skip >> skip >> skip >> skip >> skip >> flags;
  if (state.empty() || state == "X" || state == "x") return ProcessLife::kGone;
  int threads = 1;
  unsigned long long pending = 0;
  std::istringstream lines(status);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Threads:", 0) == 0) threads = std::atoi(line.c_str() + 8);
    if (line.rfind("SigPnd:", 0) == 0 || line.rfind("ShdPnd:", 0) == 0) {
      pending |= std::strtoull(line.c_str() + 7, nullptr, 16);
    }
  }
  if (state == "Z") return threads > 1 ? ProcessLife::kExiting : ProcessLife::kGone;
  constexpr unsigned long long kPfExiting = 0x4;  // include/linux/sched.h
  constexpr unsigned long long kSigKillBit = 1ull << (SIGKILL - 1);
  if ((flags & kPfExiting) != 0 || (pending & kSigKillBit) != 0) return ProcessLife::kExiting;
  return ProcessLife::kRunning;
}

}  // namespace internal

namespace {

std::string ReadProcFile(int pid, const char* name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + name);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

ProcessLife LifeOf(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return ProcessLife::kGone;
  return internal::LifeFromProc(ReadProcFile(pid, "stat"), ReadProcFile(pid, "status"));
}

namespace {

// LifeOf, kGone for a pid that runs none of our binaries (pid reuse). The command line is empty
// once an exiting process has let go of its memory; its name stays.
ProcessLife StrataLifeOf(int pid) {
  const ProcessLife life = LifeOf(pid);
  if (life == ProcessLife::kGone) return life;
  std::string argv0 = ReadProcFile(pid, "cmdline");
  argv0 = argv0.substr(0, argv0.find('\0'));
  const bool ours =
      argv0.find("strata") != std::string::npos || ReadProcFile(pid, "comm").find("strata") != std::string::npos;
  return ours ? life : ProcessLife::kGone;
}

}  // namespace

bool IsStrataProcess(int pid) { return StrataLifeOf(pid) != ProcessLife::kGone; }

bool AwaitExitOf(int pid, int timeout_ms) {
  for (int waited = 0;; waited += 50) {
    if (StrataLifeOf(pid) != ProcessLife::kExiting) return true;
    if (waited >= timeout_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<ClusterProcess> FindStrataProcesses(const std::string& state_dir) {
  std::vector<ClusterProcess> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int pid = std::atoi(name.c_str());
    if (pid == ::getpid()) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::vector<std::string> argv;
    for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
    if (argv.empty()) continue;
    const std::string binary = std::filesystem::path(argv[0]).filename().string();
    if (binary != "strata-coordinator" && binary != "strata-worker") continue;
    std::string label = binary == "strata-coordinator" ? "coordinator" : "";
    bool ours = false;
    for (size_t i = 1; i < argv.size(); ++i) {
      if (argv[i].rfind(state_dir + "/", 0) == 0) ours = true;
      if (argv[i] == "--name" && i + 1 < argv.size()) label = argv[i + 1];
    }
    if (ours && IsStrataProcess(pid)) found.push_back({label.empty() ? binary : label, pid});
  }
  return found;
}

}  // namespace strata::client
