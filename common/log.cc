#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstring>

namespace strata::log {
namespace {

spdlog::level::level_enum ToSpd(Level level) {
  switch (level) {
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarn: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
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
}

}  // namespace strata::log
