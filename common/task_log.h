// Per-task log files. While a worker runs a task, the task's thread points its log lines at that
// run's file (STORE/logs/<hex run id>/rank-R.log) as well as at the process log, so `strata logs
// RUN --rank R` shows one rank of one run and nothing else. Kept apart from common/log.h, which
// LibTorch files include: the facade they see does not change.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/log.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace strata::log {

// One open log file, appended to from any thread (each line whole, under a mutex).
class TaskLog {
 public:
  // Opens `path` for appending, creating it 0600 and its missing parent directories 0700.
  static Result<std::shared_ptr<TaskLog>> Open(const std::string& path);
  ~TaskLog();
  TaskLog(const TaskLog&) = delete;
  TaskLog& operator=(const TaskLog&) = delete;

  // Appends "2026-11-27T10:38:08.123Z info <text>\n" (UTC; the timestamp `strata logs --since`
  // filters on). Write errors are dropped: a full disk must not stop training over a log line.
  void Append(Level level, const std::string& text);

 private:
  explicit TaskLog(int fd) : fd_(fd) {}
  Mutex mutex_;
  const int fd_;
};

// Where a worker with store `store_path` keeps the log of `rank` of `run_id`. The run id is
// hex-encoded so that no stored name can reach outside STORE/logs.
std::string TaskLogPath(const std::string& store_path, const std::string& run_id, uint32_t rank);

// While alive, every STRATA_LOG line of the calling thread also goes to `log` (null: none).
class ScopedThreadTaskLog {
 public:
  explicit ScopedThreadTaskLog(std::shared_ptr<TaskLog> log);
  ~ScopedThreadTaskLog();
  ScopedThreadTaskLog(const ScopedThreadTaskLog&) = delete;
  ScopedThreadTaskLog& operator=(const ScopedThreadTaskLog&) = delete;

 private:
  std::shared_ptr<TaskLog> previous_;
};

// Parses the timestamp a TaskLog line starts with into unix milliseconds; false if it has none.
bool ParseTaskLogTime(const std::string& line, int64_t* unix_ms);

}  // namespace strata::log
