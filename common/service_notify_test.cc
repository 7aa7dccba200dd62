// ServiceNotifier against a real AF_UNIX datagram socket standing in for systemd's notify socket:
// the datagrams it receives are exactly what systemd would parse.
#include "common/service_notify.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

namespace strata {
namespace {

class ServiceNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-notify-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/notify.sock";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    ASSERT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
  }

  void TearDown() override {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    close(fd_);
    std::filesystem::remove_all(dir_);
  }

  // The next datagram, or nothing within timeout_ms.
  std::optional<std::string> Receive(int timeout_ms = 500) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }

  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(ServiceNotifyTest, SilentWithoutNotifySocket) {
  unsetenv("NOTIFY_SOCKET");
  setenv("WATCHDOG_USEC", "100000", 1);
  ServiceNotifier notifier;
  EXPECT_FALSE(notifier.enabled());
  EXPECT_EQ(notifier.watchdog_usec(), 0u);
  notifier.Ready("serving");
  notifier.SetStatus("busy");
  notifier.WatchdogPing();
  notifier.Stopping("bye");
  EXPECT_EQ(Receive(100), std::nullopt);
}

TEST_F(ServiceNotifyTest, ReadyOnceWithStatus) {
  ServiceNotifier notifier;
  ASSERT_TRUE(notifier.enabled());
  notifier.Ready("listening on ipc:///x");
  EXPECT_EQ(Receive(), "READY=1\nSTATUS=listening on ipc:///x");
  notifier.Ready("again");  // systemd needs it once; a second READY would be noise
  EXPECT_EQ(Receive(100), std::nullopt);
}

TEST_F(ServiceNotifyTest, StatusSendsOnlyChangesAsOneLine) {
  ServiceNotifier notifier;
  notifier.SetStatus("2 workers\n1 run");
  EXPECT_EQ(Receive(), "STATUS=2 workers 1 run");
  notifier.SetStatus("2 workers\n1 run");
  EXPECT_EQ(Receive(100), std::nullopt);
  notifier.SetStatus("3 workers");
  EXPECT_EQ(Receive(), "STATUS=3 workers");
}

TEST_F(ServiceNotifyTest, WatchdogPingsAtHalfThePeriod) {
  setenv("WATCHDOG_USEC", "400000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  ServiceNotifier notifier;
  EXPECT_EQ(notifier.watchdog_usec(), 400000u);
  // Ping as fast as a busy loop would for 700 ms: one datagram per 200 ms gets through.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(700);
  while (std::chrono::steady_clock::now() < end) {
    notifier.WatchdogPing();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int pings = 0;
  while (auto d = Receive(50)) {
    EXPECT_EQ(*d, "WATCHDOG=1");
    ++pings;
  }
  EXPECT_GE(pings, 2);  // at 0, 200, 400 and 600 ms; a stalled machine may drop some
  EXPECT_LE(pings, 4);  // but never more: the rate limit holds
}

TEST_F(ServiceNotifyTest, NoPingsWithoutWatchdogOrForAnotherPid) {
  {
    ServiceNotifier notifier;  // no WATCHDOG_USEC: the unit has no WatchdogSec=
    EXPECT_EQ(notifier.watchdog_usec(), 0u);
    notifier.WatchdogPing();
  }
  setenv("WATCHDOG_USEC", "400000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid() + 1).c_str(), 1);  // inherited from a parent
  ServiceNotifier notifier;
  EXPECT_EQ(notifier.watchdog_usec(), 0u);
  notifier.WatchdogPing();
  EXPECT_EQ(Receive(100), std::nullopt);
}

TEST_F(ServiceNotifyTest, Stopping) {
  ServiceNotifier notifier;
  notifier.Stopping("draining");
  EXPECT_EQ(Receive(), "STOPPING=1\nSTATUS=draining");
}

TEST_F(ServiceNotifyTest, AManagerThatVanishedDoesNotHurt) {
  ServiceNotifier notifier;
  close(fd_);
  std::filesystem::remove(path_);
  fd_ = socket(AF_UNIX, SOCK_DGRAM, 0);  // so TearDown closes something valid
  notifier.Ready("x");                   // fails inside sd_notify: logged once, no crash
  notifier.SetStatus("y");
  SUCCEED();
}

}  // namespace
}  // namespace strata
