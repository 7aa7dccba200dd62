#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace strata::testing {

CommandResult RunCommand(const std::string& command, const std::string& scratch_dir) {
  static std::atomic<int> counter{0};
  const std::string base = scratch_dir + "/cmd" + std::to_string(getpid()) + "-" + std::to_string(++counter);
  const int status = std::system((command + " >" + base + ".out 2>" + base + ".err").c_str());
  CommandResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  return r;
}

int SpawnDaemon(std::vector<std::string> argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log.c_str(), "w", stdout)) _exit(126);
    dup2(fileno(stdout), STDERR_FILENO);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

void StopDaemons(const std::vector<int>& pids, int grace_ms) {
  for (int pid : pids) kill(pid, SIGTERM);
  for (int pid : pids) {
    const int64_t deadline = NowMs() + grace_ms;
    while (waitpid(pid, nullptr, WNOHANG) == 0) {
      if (NowMs() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

std::string MakeClusterScratchDir(const std::string& mkdtemp_template) {
  std::string tmpl = mkdtemp_template;
  const std::string dir = mkdtemp(tmpl.data());
  setenv("STRATA_STATE_DIR", (dir + "/state").c_str(), 1);
  unsetenv("STRATA_CLUSTER");
  std::ofstream corpus(dir + "/corpus.txt");
  std::ifstream gpl("/usr/share/common-licenses/GPL-3");
  if (gpl) {
    corpus << gpl.rdbuf();
  } else {
    for (int i = 0; i < 500; ++i) corpus << "the quick brown fox jumps over the lazy dog. ";
  }
  return dir;
}

CommandResult RunStrata(const std::string& args, const std::string& scratch_dir) {
  return RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args, scratch_dir);
}

nlohmann::json RunStrataJson(const std::string& args, const std::string& scratch_dir) {
  const CommandResult r = RunStrata(args + " --json", scratch_dir);
  EXPECT_EQ(r.rc, 0) << args << ": " << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception&) {
    ADD_FAILURE() << args << ": not JSON: " << r.out;
    return nlohmann::json();
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t NowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace strata::testing
