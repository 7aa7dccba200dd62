#include "common/log.h"

#include <fcntl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/hex.h"
#include "common/task_log.h"

namespace strata::log {
namespace {

spdlog::level::level_enum ToSpd(Level level) {
  switch (level) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger>& Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("strata");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
    return l;
  }();
  return logger;
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warning";
    case Level::kError:
      return "error";
  }
  return "info";
}

thread_local std::shared_ptr<TaskLog> thread_task_log;

}  // namespace

void Init(const std::string& component, Level min_level) {
  auto& logger = Logger();
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [" + component + "] %v");
  logger->set_level(ToSpd(min_level));
  logger->flush_on(spdlog::level::info);
}

void Write(Level level, const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  Logger()->log(ToSpd(level), "{} ({}:{})", message, base ? base + 1 : file, line);
  if (thread_task_log && Logger()->should_log(ToSpd(level))) {
    thread_task_log->Append(level, message + " (" + (base ? base + 1 : file) + ":" + std::to_string(line) + ")");
  }
}

Result<std::shared_ptr<TaskLog>> TaskLog::Open(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec) return Unavailable("cannot create the log directory " + parent.string() + ": " + ec.message());
  std::filesystem::permissions(parent, std::filesystem::perms::owner_all, ec);  // 0700, as STORE is
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Unavailable("cannot open the log file " + path + ": " + std::strerror(errno));
  return std::shared_ptr<TaskLog>(new TaskLog(fd));
}

TaskLog::~TaskLog() { ::close(fd_); }

void TaskLog::Append(Level level, const std::string& text) {
  const auto now = std::chrono::system_clock::now();
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[40];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::string line = stamp;
  char millis[8];
  std::snprintf(millis, sizeof(millis), ".%03dZ ", static_cast<int>(ms % 1000));
  line += millis;
  line += LevelName(level);
  line += ' ';
  line += text;
  line += '\n';
  MutexLock lock(mutex_);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string TaskLogPath(const std::string& store_path, const std::string& run_id, uint32_t rank) {
  return store_path + "/logs/" + HexOf(run_id) + "/rank-" + std::to_string(rank) + ".log";
}

ScopedThreadTaskLog::ScopedThreadTaskLog(std::shared_ptr<TaskLog> log) : previous_(std::move(thread_task_log)) {
  thread_task_log = std::move(log);
}

ScopedThreadTaskLog::~ScopedThreadTaskLog() { thread_task_log = std::move(previous_); }

bool ParseTaskLogTime(const std::string& line, int64_t* unix_ms) {
  // "YYYY-MM-DDTHH:MM:SS.mmmZ"
  if (line.size() < 24 || line[4] != '-' || line[10] != 'T' || line[19] != '.' || line[23] != 'Z') return false;
  std::tm utc{};
  int millis = 0;
  if (std::sscanf(line.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d", &utc.tm_year, &utc.tm_mon, &utc.tm_mday, &utc.tm_hour,
                  &utc.tm_min, &utc.tm_sec, &millis) != 7) {
    return false;
  }
  utc.tm_year -= 1900;
  utc.tm_mon -= 1;
  *unix_ms = static_cast<int64_t>(timegm(&utc)) * 1000 + millis;
  return true;
}

}  // namespace strata::log
