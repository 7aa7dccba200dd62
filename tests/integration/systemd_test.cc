// The systemd deployment, tested without systemd as PID 1: deploy/install.sh into a temporary
// root, `systemd-analyze verify` on the units it installed, and the real strata-coordinator and
// strata-worker started the way a Type=notify unit starts them (NOTIFY_SOCKET, WATCHDOG_USEC,
// WATCHDOG_PID), with this test owning the notify socket that systemd would own. It checks what
// systemd acts on: READY=1 only once the daemon serves (the worker: once registered), WATCHDOG=1
// well inside the period, sent by the main pid (NotifyAccess=main), and STOPPING=1 on SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace strata {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CommandResult {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

CommandResult Sh(const std::string& command, const std::string& out_path) {
  const int status = std::system((command + " >" + out_path + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out_path)};
}

// systemd's end of the sd_notify protocol: a datagram socket that learns each sender's pid.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ok_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    const int one = 1;
    ok_ = ok_ && setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) == 0;  // as systemd does
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return path_; }

  struct Message {
    std::string text;
    pid_t pid = 0;
    int64_t at_ms = 0;
    bool Has(const std::string& assignment) const {
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) {
        if (line == assignment) return true;
      }
      return false;
    }
  };

  std::optional<Message> Receive(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, std::max(0, timeout_ms)) != 1) return std::nullopt;
    char buf[4096];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_, &msg, 0);
    if (n < 0) return std::nullopt;
    Message m{std::string(buf, static_cast<size_t>(n)), 0, NowMs()};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        m.pid = cred.pid;
      }
    }
    return m;
  }

  // Everything that arrives within `ms`.
  std::vector<Message> Collect(int ms) {
    std::vector<Message> all;
    const int64_t end = NowMs() + ms;
    while (NowMs() < end) {
      if (auto m = Receive(static_cast<int>(end - NowMs()))) all.push_back(*m);
    }
    return all;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool ok_ = false;
};

// A daemon started like systemd starts a Type=notify service with WatchdogSec=.
class Daemon {
 public:
  Daemon(const std::vector<std::string>& argv, const std::string& log_path, const NotifySocket* notify,
         int watchdog_usec) {
    pid_ = fork();
    if (pid_ == 0) {
      if (notify) {
        setenv("NOTIFY_SOCKET", notify->path().c_str(), 1);
        setenv("WATCHDOG_USEC", std::to_string(watchdog_usec).c_str(), 1);
        setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
      } else {
        unsetenv("NOTIFY_SOCKET");
      }
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      std::string command = "$";
      for (const auto& a : argv) command += " " + a;
      command += "\n";
      (void)!write(STDERR_FILENO, command.data(), command.size());
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  bool Running() {
    if (reaped_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      exit_status_ = status;
      return false;
    }
    return true;
  }
  // SIGTERM (what `systemctl stop` sends), then the exit code.
  int Stop(int timeout_ms = 20000) {
    kill(pid_, SIGTERM);
    const int64_t end = NowMs() + timeout_ms;
    while (Running() && NowMs() < end) usleep(20000);
    if (!reaped_) return -1;
    return WIFEXITED(exit_status_) ? WEXITSTATUS(exit_status_) : -1;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_status_ = 0;
};

constexpr int kWatchdogUsec = 400000;  // 400 ms: pings due every 200 ms

class SystemdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-sd-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  std::string Bin(const std::string& name) const { return std::string(STRATA_BIN_DIR) + "/" + name; }
  // The daemons run with the command lines of the units in deploy/systemd, expanded the way
  // systemd expands them: %i the instance, %S and %t the state and runtime roots (here under the
  // test's directory, created as StateDirectory=/RuntimeDirectory= would), ${VAR} one word and
  // $VAR split at spaces from deploy/systemd/strata.env, whose /run/... endpoints move under %t.
  // So a flag the units pass that a daemon does not accept fails here.
  std::string Endpoint() const { return "ipc://" + dir_ + "/run/strata/coordinator/coordinator.sock"; }
  std::vector<std::string> CoordinatorArgv() const { return UnitArgv("strata-coordinator.service", ""); }
  std::vector<std::string> WorkerArgv() const {
    auto argv = UnitArgv("strata-worker@.service", "0");
    // No GPU on CI machines: the same command line on a CPU device.
    for (auto& a : argv) {
      if (a == "cuda:0" && !std::getenv("STRATA_TEST_GPU")) a = "cpu";
    }
    return argv;
  }
  std::vector<std::string> UnitArgv(const std::string& unit, const std::string& instance) const {
    std::map<std::string, std::string> env;
    std::istringstream env_file(ReadFile(std::string(STRATA_SOURCE_DIR) + "/deploy/systemd/strata.env"));
    for (std::string line; std::getline(env_file, line);) {
      if (line.empty() || line[0] == '#' || line.find('=') == std::string::npos) continue;
      std::string value = line.substr(line.find('=') + 1);
      if (value.rfind("ipc:///run/", 0) == 0) value = "ipc://" + dir_ + value.substr(6);
      env[line.substr(0, line.find('='))] = value;
    }
    std::string text = ReadFile(std::string(STRATA_SOURCE_DIR) + "/deploy/systemd/" + unit);
    for (size_t at; (at = text.find("\\\n")) != std::string::npos;) text.replace(at, 2, " ");
    std::string exec;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("ExecStart=", 0) == 0) exec = line.substr(10);
    }
    std::vector<std::string> argv;
    std::istringstream words(exec);
    for (std::string w; words >> w;) {
      if (w.size() > 1 && w[0] == '$' && w[1] != '{') {  // $VAR: zero or more words
        std::istringstream split(env[w.substr(1)]);
        for (std::string part; split >> part;) argv.push_back(part);
        continue;
      }
      std::string out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (w[i] == '%' && i + 1 < w.size()) {
          const char spec = w[++i];
          out += spec == 'i'   ? instance
                 : spec == 'S' ? dir_ + "/state"
                 : spec == 't' ? dir_ + "/run"
                               : std::string(1, spec);
        } else if (w.compare(i, 2, "${") == 0 && w.find('}', i) != std::string::npos) {
          const size_t end = w.find('}', i);
          out += env[w.substr(i + 2, end - i - 2)];
          i = end;
        } else {
          out += w[i];
        }
      }
      argv.push_back(out);
    }
    EXPECT_FALSE(argv.empty()) << unit << " has no ExecStart=";
    if (!argv.empty()) argv[0] = Bin(fs::path(argv[0]).filename().string());  // /usr/local/bin -> the build
    fs::create_directories(dir_ + "/run/strata/coordinator");
    fs::create_directories(dir_ + "/run/strata/worker-" + instance);
    fs::create_directories(dir_ + "/state/strata");
    return argv;
  }
  // What `strata workers` shows, or null when the coordinator does not answer.
  json Workers() {
    auto r = Sh(Bin("strata") + " --cluster " + Endpoint() + " workers --json", dir_ + "/workers.out");
    if (r.rc != 0) return nullptr;
    try {
      return json::parse(r.out);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  // Waits for the first message carrying `assignment` (e.g. READY=1); nullopt on timeout.
  static std::optional<NotifySocket::Message> WaitFor(NotifySocket& notify, const std::string& assignment,
                                                      int timeout_ms, std::vector<NotifySocket::Message>* seen) {
    const int64_t end = NowMs() + timeout_ms;
    while (NowMs() < end) {
      auto m = notify.Receive(static_cast<int>(end - NowMs()));
      if (!m) break;
      seen->push_back(*m);
      if (m->Has(assignment)) return m;
    }
    return std::nullopt;
  }
  // Watchdog pings in `messages`: all from `pid`, never further apart than the period allows.
  static void ExpectSteadyPings(const std::vector<NotifySocket::Message>& messages, pid_t pid, int window_ms) {
    std::vector<int64_t> at;
    for (const auto& m : messages) {
      if (!m.Has("WATCHDOG=1")) continue;
      EXPECT_EQ(m.pid, pid) << "systemd (NotifyAccess=main) ignores pings from any other pid";
      at.push_back(m.at_ms);
    }
    // Due every 200 ms (half the period). The bounds leave room for a loaded 2-core CI machine
    // descheduling the daemon; a loop that stopped turning sends none at all.
    EXPECT_GE(static_cast<int>(at.size()), window_ms / 400) << "too few WATCHDOG=1 in " << window_ms << " ms";
    EXPECT_LE(static_cast<int>(at.size()), window_ms / 200 + 2) << "pings are not rate-limited";
    for (size_t i = 1; i < at.size(); ++i) {
      EXPECT_LT(at[i] - at[i - 1], 2 * kWatchdogUsec / 1000) << "pings stalled for two watchdog periods";
    }
  }

  std::string dir_;
};

TEST_F(SystemdTest, InstallIsIdempotentAndUnitsVerify) {
  const std::string root = dir_ + "/root";
  const std::string install = std::string(STRATA_SOURCE_DIR) + "/deploy/install.sh --build-dir " +
                              fs::path(STRATA_BIN_DIR).parent_path().string() + " --dest-root " + root;
  auto first = Sh(install, dir_ + "/install1.out");
  ASSERT_EQ(first.rc, 0) << first.out;
  for (const char* f : {"/usr/local/bin/strata", "/usr/local/bin/strata-coordinator", "/usr/local/bin/strata-worker",
                        "/etc/systemd/system/strata-coordinator.service", "/etc/systemd/system/strata-worker@.service",
                        "/etc/strata/strata.env"}) {
    EXPECT_TRUE(fs::exists(root + f)) << f << " not installed";
  }
  EXPECT_EQ(fs::status(root + "/usr/local/bin/strata-worker").permissions() & fs::perms::owner_exec,
            fs::perms::owner_exec);

  // An administrator's edits to the env file survive a second install; everything else is redone.
  { std::ofstream(root + "/etc/strata/strata.env", std::ios::app) << "STRATA_WORKER_ARGS=--peer-timeout-ms 9000\n"; }
  auto second = Sh(install, dir_ + "/install2.out");
  ASSERT_EQ(second.rc, 0) << second.out;
  EXPECT_NE(ReadFile(root + "/etc/strata/strata.env").find("--peer-timeout-ms 9000"), std::string::npos);

  // --prefix rewrites the binary paths in the units.
  auto other = Sh(install + " --prefix /opt/strata", dir_ + "/install3.out");
  ASSERT_EQ(other.rc, 0) << other.out;
  const std::string worker_unit = ReadFile(root + "/etc/systemd/system/strata-worker@.service");
  EXPECT_NE(worker_unit.find("ExecStart=/opt/strata/bin/strata-worker"), std::string::npos) << worker_unit;
  EXPECT_EQ(worker_unit.find("/usr/local/bin"), std::string::npos);

  if (std::system("command -v systemd-analyze >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "systemd-analyze is not installed (deploy/install-deps.sh installs systemd): units not verified";
  }
  // systemd-analyze verify checks that ExecStart binaries exist, so point the installed units
  // (the --prefix /opt/strata ones) at the binaries install.sh put under the temporary root.
  const std::string verify_dir = dir_ + "/verify";
  fs::create_directories(verify_dir);
  for (const char* u : {"strata-coordinator.service", "strata-worker@.service"}) {
    std::string text = ReadFile(root + "/etc/systemd/system/" + u);
    const std::string from = "=/opt/strata/bin/", to = "=" + root + "/opt/strata/bin/";
    for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, from.size(), to);
    std::ofstream(verify_dir + "/" + u) << text;
  }
  auto verify = Sh("cd " + verify_dir + " && systemd-analyze verify " + verify_dir + "/strata-coordinator.service " +
                       verify_dir + "/strata-worker@0.service " + verify_dir + "/strata-worker@7.service",
                   dir_ + "/verify.out");
  EXPECT_EQ(verify.rc, 0) << verify.out;
  // Unknown or misspelt keys are only warnings for systemd (rc 0): any warning about our units fails.
  EXPECT_EQ(verify.out.find("strata"), std::string::npos) << verify.out;
}

TEST_F(SystemdTest, CoordinatorIsReadyWhenServingAndPingsFromItsLoop) {
  NotifySocket notify(dir_ + "/coordinator.notify");
  ASSERT_TRUE(notify.ok()) << std::strerror(errno);
  Daemon coordinator(CoordinatorArgv(), dir_ + "/coordinator.log", &notify, kWatchdogUsec);

  std::vector<NotifySocket::Message> seen;
  auto ready = WaitFor(notify, "READY=1", 15000, &seen);
  ASSERT_TRUE(ready) << "no READY=1 within 15 s; log:\n" << ReadFile(dir_ + "/coordinator.log");
  EXPECT_EQ(ready->pid, coordinator.pid());
  // What `systemctl status` shows from then on (repeated only when it changes).
  EXPECT_TRUE(ready->Has("STATUS=serving " + Endpoint() + ": 0/0 workers live, 0 runs running, 0 pending"))
      << ready->text;
  // READY means serving: the CLI gets an answer right away.
  EXPECT_TRUE(Workers().is_array()) << "READY=1 sent before the coordinator answers";

  ExpectSteadyPings(notify.Collect(2000), coordinator.pid(), 2000);

  EXPECT_EQ(coordinator.Stop(), 0) << ReadFile(dir_ + "/coordinator.log");
  bool stopping = false;
  for (const auto& m : notify.Collect(200)) stopping |= m.Has("STOPPING=1");
  EXPECT_TRUE(stopping);
}

TEST_F(SystemdTest, WorkerIsReadyOnlyOnceRegistered) {
  NotifySocket notify(dir_ + "/worker.notify");
  ASSERT_TRUE(notify.ok()) << std::strerror(errno);
  // No coordinator yet: the worker keeps trying to register, its loop alive but not READY.
  Daemon worker(WorkerArgv(), dir_ + "/worker.log", &notify, kWatchdogUsec);
  std::vector<NotifySocket::Message> before;
  auto premature = WaitFor(notify, "WATCHDOG=1", 30000, &before);  // LibTorch loads first
  ASSERT_TRUE(premature) << "worker never pinged; log:\n" << ReadFile(dir_ + "/worker.log");
  auto waiting = notify.Collect(1500);
  ExpectSteadyPings(waiting, worker.pid(), 1500);
  before.insert(before.end(), waiting.begin(), waiting.end());
  for (const auto& m : before) {
    EXPECT_FALSE(m.Has("READY=1")) << "READY=1 before any coordinator was up";
  }
  bool registering = false;
  for (const auto& m : before) registering |= m.Has("STATUS=worker-0: registering (coordinator " + Endpoint() + ")");
  EXPECT_TRUE(registering);

  // The coordinator comes up (not under our notify socket); READY follows registration.
  Daemon coordinator(CoordinatorArgv(), dir_ + "/coordinator.log", nullptr, 0);
  std::vector<NotifySocket::Message> after;
  auto ready = WaitFor(notify, "READY=1", 15000, &after);
  ASSERT_TRUE(ready) << "no READY=1 within 15 s of the coordinator starting; log:\n" << ReadFile(dir_ + "/worker.log");
  EXPECT_EQ(ready->pid, worker.pid());
  EXPECT_TRUE(ready->Has("STATUS=worker-0: idle (coordinator " + Endpoint() + ")")) << ready->text;
  json workers = Workers();
  ASSERT_TRUE(workers.is_array() && workers.size() == 1) << workers.dump();
  EXPECT_EQ(workers[0]["worker_id"], "worker-0");
  EXPECT_EQ(workers[0]["pid"], worker.pid());

  ExpectSteadyPings(notify.Collect(1000), worker.pid(), 1000);
  EXPECT_EQ(worker.Stop(), 0) << ReadFile(dir_ + "/worker.log");
  bool stopping = false;
  for (const auto& m : notify.Collect(200)) stopping |= m.Has("STOPPING=1");
  EXPECT_TRUE(stopping);
  EXPECT_EQ(coordinator.Stop(), 0);
}

}  // namespace
}  // namespace strata
