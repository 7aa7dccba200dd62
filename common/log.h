// Logging facade. This header includes neither spdlog nor fmt on purpose: pip LibTorch 2.11
// ships fmt 12 headers that clash with Debian's spdlog (built for fmt 9), so files that see
// LibTorch must log through this stream-style API only. The sink lives in log.cc.
#pragma once

#include <sstream>
#include <string>

namespace strata::log {

enum class Level { kDebug, kInfo, kWarn, kError };

// Sets the process-wide minimum level and the component name printed on every line.
void Init(const std::string& component, Level min_level = Level::kInfo);
void Write(Level level, const char* file, int line, const std::string& message);

class LineBuilder {
 public:
  LineBuilder(Level level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LineBuilder() { Write(level_, file_, line_, stream_.str()); }
  template <typename T>
  LineBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  Level level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace strata::log

// STRATA_LOG(kInfo) << "worker " << id << " registered";
#define STRATA_LOG(level) ::strata::log::LineBuilder(::strata::log::Level::level, __FILE__, __LINE__)
