// End-to-end tests of the authenticated control plane (docs/security.md): a real coordinator
// process on tcp://127.0.0.1 with CURVE keys, real workers, driven through the real `strata` CLI.
// They check what an operator relies on: only holders of an authorized key get commands in, a
// recorded session cannot be replayed, refusals do not stop the service, and training over tcp
// still works with CURVE on both planes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using testing::CommandResult;
using testing::FreePort;
using testing::NowMs;
using testing::ReadFile;

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A one-connection TCP proxy that records every byte the client sends: what an eavesdropper on
// the network would capture.
class RecordingProxy {
 public:
  explicit RecordingProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(listen_fd_, 4);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~RecordingProxy() {
    stop_.store(true);
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  std::string recorded() {
    std::lock_guard<std::mutex> lock(mutex_);
    return recorded_;
  }

 private:
  void Serve() {
    pollfd accept_poll{listen_fd_, POLLIN, 0};
    while (!stop_.load() && poll(&accept_poll, 1, 50) <= 0) {
    }
    if (stop_.load()) return;
    const int client = accept(listen_fd_, nullptr, nullptr);
    const int server = ConnectLoopback(target_port_);
    if (client < 0 || server < 0) return;
    char buf[65536];
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    while (!stop_.load()) {
      if (poll(fds, 2, 50) <= 0) continue;
      if (fds[0].revents) {
        const ssize_t n = read(client, buf, sizeof(buf));
        if (n <= 0) break;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          recorded_.append(buf, n);
        }
        if (write(server, buf, n) != n) break;
      }
      if (fds[1].revents) {
        const ssize_t n = read(server, buf, sizeof(buf));
        if (n <= 0 || write(client, buf, n) != n) break;
      }
    }
    close(client);
    close(server);
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::string recorded_;  // guarded by mutex_
  std::thread thread_;
};

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-sec-XXXXXX";
    dir_ = mkdtemp(tmpl);
    unsetenv("STRATA_CLUSTER");
    unsetenv("STRATA_KEYS");
    setenv("STRATA_STATE_DIR", (dir_ + "/state").c_str(), 1);
  }

  void TearDown() override {
    if (fs::exists(dir_ + "/state/cluster.json")) Strata("down");  // a test that failed after `up`
    testing::StopDaemons(pids_);
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  CommandResult Run(const std::string& command) { return testing::RunCommand(command, dir_); }
  CommandResult Strata(const std::string& args) { return Run(std::string(STRATA_BIN_DIR) + "/strata " + args); }

  // Starts a binary in the background with output to `log`; TearDown stops it.
  int Spawn(std::vector<std::string> argv, const std::string& log) {
    const int pid = testing::SpawnDaemon(std::move(argv), log);
    pids_.push_back(pid);
    return pid;
  }

  // A coordinator on tcp://127.0.0.1:PORT with the keys in `keys`; waits until it answers.
  std::string StartCoordinator(const std::string& keys) {
    const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(FreePort());
    Spawn({std::string(STRATA_BIN_DIR) + "/strata-coordinator", "--listen", endpoint, "--state-dir",
           dir_ + "/coordinator", "--keys", keys},
          CoordinatorLog());
    const int64_t deadline = NowMs() + 15000;
    while (NowMs() < deadline) {
      if (Strata("--cluster " + endpoint + " --keys " + keys + " --timeout-ms 500 workers --json").rc == 0) {
        return endpoint;
      }
    }
    ADD_FAILURE() << "coordinator did not come up:\n" << ReadFile(CoordinatorLog());
    return endpoint;
  }
  std::string CoordinatorLog() const { return dir_ + "/coordinator.log"; }

  std::string Keygen(const std::string& name) {
    const std::string keys = dir_ + "/" + name;
    auto r = Strata("keygen " + keys);
    EXPECT_EQ(r.rc, 0) << r.err;
    return keys;
  }

  // A key directory holding a valid CURVE pair that the cluster does not know, plus the
  // cluster's (public) coordinator.pub: everything an outsider could have.
  std::string StrangerKeys(const std::string& cluster_keys) {
    const std::string keys = Keygen("stranger");
    fs::copy_file(cluster_keys + "/coordinator.pub", keys + "/coordinator.pub", fs::copy_options::overwrite_existing);
    return keys;
  }

  std::string WriteSpec(const std::string& name, int dp, int steps) {
    std::ofstream corpus(dir_ + "/corpus.txt");
    for (int i = 0; i < 400; ++i) corpus << "the quick brown fox jumps over the lazy dog. ";
    corpus.close();
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << "name = \"" << name << "\"\n"
                        << "[model]\nlayers = 1\nhidden = 32\nheads = 2\nvocab = 256\nsequence = 16\n"
                        << "[data]\npath = \"corpus.txt\"\n"
                        << "[train]\nsteps = " << steps << "\nglobal_batch = 4\nlr = 0.003\nseed = 7\n"
                        << "[parallel]\ndp = " << dp << "\n";
    return path;
  }

  size_t RunCount(const std::string& endpoint, const std::string& keys) {
    auto r = Strata("--cluster " + endpoint + " --keys " + keys + " status --json");
    EXPECT_EQ(r.rc, 0) << r.err;
    try {
      return json::parse(r.out).size();
    } catch (const std::exception&) {
      ADD_FAILURE() << "not JSON: " << r.out;
      return 0;
    }
  }

  std::string dir_;
  std::vector<int> pids_;
  int commands_ = 0;
};

// The Z85 key on the last line of a key file.
std::string KeyIn(const std::string& path) {
  const std::string text = ReadFile(path);
  EXPECT_GE(text.size(), 41u) << path;
  return text.size() >= 41 ? text.substr(text.size() - 41, 40) : "";
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(0, stat(path.c_str(), &st)) << path;
  return st.st_mode & 0777;
}

TEST_F(SecurityTest, KeygenMakesPrivateKeysAndRefusesToOverwrite) {
  const std::string keys = Keygen("keys");
  EXPECT_EQ(0700u, ModeOf(keys));
  EXPECT_EQ(0600u, ModeOf(keys + "/coordinator.key"));
  EXPECT_EQ(0600u, ModeOf(keys + "/client.key"));
  EXPECT_NE(std::string::npos, ReadFile(keys + "/authorized_keys").find(KeyIn(keys + "/client.pub")));
  const std::string secret = ReadFile(keys + "/coordinator.key");
  auto again = Strata("keygen " + keys);
  EXPECT_NE(again.rc, 0);
  EXPECT_NE(std::string::npos, again.err.find("--force")) << again.err;
  EXPECT_EQ(secret, ReadFile(keys + "/coordinator.key"));
  auto forced = Strata("keygen --force " + keys);
  EXPECT_EQ(forced.rc, 0) << forced.err;
  EXPECT_NE(secret, ReadFile(keys + "/coordinator.key"));
  EXPECT_EQ(0600u, ModeOf(keys + "/coordinator.key"));
}

TEST_F(SecurityTest, CoordinatorOnTcpWithoutKeysRefusesToStart) {
  auto r =
      Run(std::string(STRATA_BIN_DIR) + "/strata-coordinator --listen tcp://127.0.0.1:" + std::to_string(FreePort()) +
          " --state-dir " + dir_ + "/coordinator");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(std::string::npos, (r.out + r.err).find("strata keygen")) << r.out << r.err;
}

TEST_F(SecurityTest, OnlyAuthorizedClientsGetCommandsIn) {
  const std::string keys = Keygen("keys");
  const std::string endpoint = StartCoordinator(keys);
  const std::string cluster = "--cluster " + endpoint + " --timeout-ms 1500 ";

  auto ok = Strata(cluster + "--keys " + keys + " workers --json");
  EXPECT_EQ(ok.rc, 0) << ok.err;

  // No key: the CURVE handshake fails; the call times out with a hint about keys.
  const int64_t start = NowMs();
  auto anonymous = Strata(cluster + "workers --json");
  EXPECT_NE(anonymous.rc, 0);
  EXPECT_LT(NowMs() - start, 10000);
  EXPECT_NE(std::string::npos, anonymous.err.find("--keys")) << anonymous.err;

  // A valid key pair that is not in authorized_keys: refused, and the refusal is logged.
  const std::string stranger = StrangerKeys(keys);
  auto refused = Strata(cluster + "--keys " + stranger + " submit " + WriteSpec("evil", 1, 1));
  EXPECT_NE(refused.rc, 0);
  const std::string stranger_key = KeyIn(stranger + "/client.pub");
  EXPECT_NE(std::string::npos, ReadFile(CoordinatorLog()).find("refused a CURVE connection"));
  EXPECT_NE(std::string::npos, ReadFile(CoordinatorLog()).find(stranger_key)) << ReadFile(CoordinatorLog());

  // The coordinator keeps serving authorized clients, and nothing was submitted.
  EXPECT_EQ(0u, RunCount(endpoint, keys));
  auto submit = Strata(cluster + "--keys " + keys + " submit " + WriteSpec("good", 1, 1));
  EXPECT_EQ(submit.rc, 0) << submit.err;
  EXPECT_EQ(1u, RunCount(endpoint, keys));
}

TEST_F(SecurityTest, ARecordedSessionCannotBeReplayed) {
  const std::string keys = Keygen("keys");
  const std::string endpoint = StartCoordinator(keys);
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  std::string captured;
  {
    // An authorized submit through a recording proxy: the run is created once.
    RecordingProxy proxy(port);
    auto submit = Strata("--cluster tcp://127.0.0.1:" + std::to_string(proxy.port()) + " --keys " + keys + " submit " +
                         WriteSpec("once", 1, 1));
    ASSERT_EQ(submit.rc, 0) << submit.err;
    captured = proxy.recorded();
  }
  ASSERT_EQ(1u, RunCount(endpoint, keys));
  ASSERT_GT(captured.size(), 200u);  // greeting, HELLO, INITIATE and the encrypted submit

  // Replay the exact bytes from a new connection, twice: the coordinator's per-connection cookie
  // and the session's short-term keys make them worthless.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    // The coordinator speaks first (the ZMTP signature): proof the replay reaches it.
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(1, poll(&p, 1, 2000));
    size_t received = read(fd, buf, sizeof(buf));
    ASSERT_EQ(static_cast<ssize_t>(captured.size()), write(fd, captured.data(), captured.size()));
    // Drain whatever comes back until the coordinator closes the connection (or 2 s pass).
    const int64_t deadline = NowMs() + 2000;
    while (NowMs() < deadline && poll(&p, 1, 100) >= 0) {
      if (!(p.revents & POLLIN)) continue;
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      received += n;
    }
    close(fd);
    EXPECT_GE(received, 10u) << "the replay never reached the coordinator (no ZMTP greeting came back)";
  }
  EXPECT_EQ(1u, RunCount(endpoint, keys)) << "a replayed submit created a run";
}

// Two worker processes on tcp:// data addresses with CURVE on both planes train a dp=2 run to
// the end, and the coordinator refuses a stranger while they do.
TEST_F(SecurityTest, DataParallelRunOverTcpWithCurve) {
  const std::string keys = Keygen("keys");
  const std::string endpoint = StartCoordinator(keys);
  for (int i = 0; i < 2; ++i) {
    const std::string name = "worker-" + std::to_string(i);
    Spawn({std::string(STRATA_BIN_DIR) + "/strata-worker", "--name", name, "--coordinator", endpoint, "--store",
           dir_ + "/" + name, "--data-address", "tcp://127.0.0.1:" + std::to_string(FreePort()), "--keys", keys,
           "--peer-timeout-ms", "30000"},
          dir_ + "/" + name + ".log");
  }
  const int64_t deadline = NowMs() + 60000;
  size_t live = 0;
  while (NowMs() < deadline && live < 2) {
    auto r = Strata("--cluster " + endpoint + " --keys " + keys + " workers --json");
    if (r.rc == 0) live = json::parse(r.out).size();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(2u, live) << ReadFile(dir_ + "/worker-0.log");
  // Two runs back to back: each task builds its data plane (and its ZAP handler) afresh.
  for (const char* name : {"dp2-a", "dp2-b"}) {
    auto run = Strata("--cluster " + endpoint + " --keys " + keys + " --timeout-ms 10000 submit --follow " +
                      WriteSpec(name, 2, 3));
    EXPECT_EQ(run.rc, 0) << run.out << run.err << ReadFile(dir_ + "/worker-0.log") << ReadFile(dir_ + "/worker-1.log");
  }
  auto status = Strata("--cluster " + endpoint + " --keys " + keys + " status --json");
  ASSERT_EQ(status.rc, 0) << status.err;
  const json runs = json::parse(status.out);
  ASSERT_EQ(2u, runs.size());
  for (const auto& run : runs) {
    EXPECT_EQ("finished", run["state"]) << runs.dump();
    EXPECT_EQ(2u, run["workers"].size());
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(std::string::npos,
              ReadFile(dir_ + "/worker-" + std::to_string(i) + ".log").find("(coordinator and data plane)"));
  }
}

// A local cluster stays on ipc:// without keys; its state dir (which holds the sockets) is
// private to its owner.
TEST_F(SecurityTest, UpMakesTheStateDirPrivate) {
  const std::string state = dir_ + "/state";
  fs::create_directories(state);
  fs::permissions(state, fs::perms::all);  // 0777: `up` must tighten it
  auto up = Strata("up --workers 1");
  ASSERT_EQ(up.rc, 0) << up.err;
  EXPECT_EQ(0700u, ModeOf(state));
  EXPECT_NE(std::string::npos, up.out.find("ipc://")) << up.out;
  auto down = Strata("down");
  EXPECT_EQ(down.rc, 0) << down.err;
}

// Keys in STATE_DIR/keys make `strata up` start a CURVE cluster (on ipc://), and later commands
// find them there without flags; a stranger's keys are refused.
TEST_F(SecurityTest, UpUsesKeysFoundInTheStateDir) {
  const std::string state = dir_ + "/state";
  ASSERT_EQ(0, Strata("keygen " + state + "/keys").rc);
  auto up = Strata("up --workers 1");
  ASSERT_EQ(up.rc, 0) << up.err;
  auto workers = Strata("workers --json");
  EXPECT_EQ(workers.rc, 0) << workers.err;
  EXPECT_NE(std::string::npos, ReadFile(state + "/logs/coordinator.log").find("CURVE on"));
  const std::string stranger = StrangerKeys(state + "/keys");
  EXPECT_NE(0, Strata("--keys " + stranger + " --timeout-ms 1000 workers --json").rc);
  auto down = Strata("down");
  EXPECT_EQ(down.rc, 0) << down.err;
}

TEST_F(SecurityTest, WorkerOnTcpWithoutKeysRefusesToStart) {
  auto r = Run(std::string(STRATA_BIN_DIR) +
               "/strata-worker --name w --coordinator tcp://127.0.0.1:" + std::to_string(FreePort()) + " --store " +
               dir_ + "/w --data-address tcp://127.0.0.1:" + std::to_string(FreePort()));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(std::string::npos, (r.out + r.err).find("--keys")) << r.out << r.err;
}

}  // namespace
}  // namespace strata
