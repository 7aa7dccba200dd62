#include "common/service_notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace strata {
namespace {

int64_t SteadyUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

ServiceNotifier::ServiceNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && *socket != '\0';
  if (!enabled_) return;
  // sd_watchdog_enabled also honours WATCHDOG_PID: a variable inherited from a parent that
  // systemd watches is not ours, so a child never pings on its parent's behalf.
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0) watchdog_usec_ = usec;
}

void ServiceNotifier::Send(const std::string& state) {
  // unset_environment=0: the daemon notifies for its whole life, so the variables must stay.
  const int rc = sd_notify(0, state.c_str());
  if (rc < 0) {
    static bool warned = false;  // one line, not one per loop turn
    if (!warned) {
      STRATA_LOG(kWarn) << "cannot notify the service manager (" << std::strerror(-rc)
                        << "); systemd may consider this service hung";
      warned = true;
    }
  }
}

void ServiceNotifier::Ready(const std::string& status) {
  if (!enabled_ || ready_sent_) return;
  ready_sent_ = true;
  std::string state = "READY=1";
  if (!status.empty()) {
    last_status_ = OneLine(status);
    state += "\nSTATUS=" + last_status_;
  }
  Send(state);
}

void ServiceNotifier::SetStatus(const std::string& text) {
  if (!enabled_) return;
  std::string line = OneLine(text);
  if (line == last_status_) return;
  last_status_ = std::move(line);
  Send("STATUS=" + last_status_);
}

void ServiceNotifier::WatchdogPing() {
  if (!enabled_ || watchdog_usec_ == 0) return;
  const int64_t now = SteadyUs();
  if (last_ping_us_ != 0 && now - last_ping_us_ < static_cast<int64_t>(watchdog_usec_ / 2)) return;
  last_ping_us_ = now;
  Send("WATCHDOG=1");
}

void ServiceNotifier::Stopping(const std::string& status) {
  if (!enabled_) return;
  std::string state = "STOPPING=1";
  if (!status.empty()) {
    last_status_ = OneLine(status);
    state += "\nSTATUS=" + last_status_;
  }
  Send(state);
}

}  // namespace strata
