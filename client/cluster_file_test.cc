#include "client/cluster_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace strata::client {
namespace {

using internal::LifeFromProc;

const char* kRunningStatus =
    "Name:\tstrata-worker\nState:\tS (sleeping)\nThreads:\t9\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n";

TEST(ProcessLife, ReadsStateFlagsThreadsAndPendingSignals) {
  // Fields after the command name: state, ppid, pgrp, session, tty, tpgid, flags.
  const std::string running = "4242 (strata-worker) S 1 4242 4242 0 -1 4194560 100 0";
  EXPECT_EQ(LifeFromProc(running, kRunningStatus), ProcessLife::kRunning);
  // The name may hold spaces and parentheses.
  EXPECT_EQ(LifeFromProc("4242 (a) b) R 1 4242 4242 0 -1 4194560 1 0", kRunningStatus), ProcessLife::kRunning);
  // SIGKILL sent, not yet acted on (the process sleeps in the disk, say).
  EXPECT_EQ(LifeFromProc("4242 (strata-worker) D 1 4242 4242 0 -1 4194560 1 0",
                         "State:\tD (disk sleep)\nThreads:\t9\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n"),
            ProcessLife::kExiting);
  EXPECT_EQ(LifeFromProc(running, "Threads:\t9\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n"),
            ProcessLife::kExiting);
  // Another pending signal (SIGTERM, handled) is no exit.
  EXPECT_EQ(LifeFromProc(running, "Threads:\t9\nSigPnd:\t0000000000004000\nShdPnd:\t0000000000000000\n"),
            ProcessLife::kRunning);
  // PF_EXITING: the leader is past do_exit's start.
  EXPECT_EQ(LifeFromProc("4242 (strata-worker) R 1 4242 4242 0 -1 4194564 1 0", kRunningStatus), ProcessLife::kExiting);
  // A zombie leader is gone only when no other thread is left.
  EXPECT_EQ(LifeFromProc("4242 (strata-worker) Z 1 4242 4242 0 -1 4227084 1 0", "Threads:\t3\n"),
            ProcessLife::kExiting);
  EXPECT_EQ(LifeFromProc("4242 (strata-worker) Z 1 4242 4242 0 -1 4227084 1 0", "Threads:\t1\n"), ProcessLife::kGone);
  EXPECT_EQ(LifeFromProc("", ""), ProcessLife::kGone);  // the pid vanished while we read
}

// What `strata up` met after a kill -9: a process whose leader is a zombie while another of its
// threads still holds a store's lock. It is exiting, not gone, for as long as that lock is held.
TEST(ProcessLife, ZombieLeaderWithAThreadHoldingALockIsNotGone) {
  char path[] = "/tmp/strata-life-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int lock_fd = open(path, O_RDWR);
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (lock_fd < 0 || fcntl(lock_fd, F_SETLK, &lock) != 0) _exit(3);
    pthread_t holder;
    pthread_create(
        &holder, nullptr,
        [](void*) -> void* {
          for (;;) pause();
        },
        nullptr);
    // The leader thread alone leaves (no unwinding through the test framework's frames); the
    // holder keeps the process and its files.
    syscall(SYS_exit, 0);
  }
  const auto lock_is_held = [&] {
    const int probe = open(path, O_RDWR);
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    fcntl(probe, F_GETLK, &lock);
    close(probe);
    return lock.l_type != F_UNLCK;
  };
  // Wait until the leader is a zombie.
  std::string state;
  for (int i = 0; i < 400 && state != "Z"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string line((std::istreambuf_iterator<char>(stat)), {});
    const size_t close_paren = line.rfind(')');
    state = close_paren == std::string::npos ? "" : line.substr(close_paren + 2, 1);
  }
  ASSERT_EQ(state, "Z");
  EXPECT_TRUE(lock_is_held());
  EXPECT_EQ(LifeOf(child), ProcessLife::kExiting);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_EQ(LifeOf(child), ProcessLife::kGone);
  EXPECT_FALSE(lock_is_held());
  unlink(path);
}

TEST(ProcessLife, ARunningProcessIsRunningAndAReapedOneGone) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();
  }
  EXPECT_EQ(LifeOf(child), ProcessLife::kRunning);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(LifeOf(child), ProcessLife::kGone);
  EXPECT_EQ(LifeOf(0), ProcessLife::kGone);
}

}  // namespace
}  // namespace strata::client
