// Tells a service manager (systemd, Type=notify) how a daemon is doing, over the sd_notify
// datagram protocol: READY=1 once it serves, STATUS= a line for `systemctl status`, WATCHDOG=1
// while its loop turns (WatchdogSec= restarts a daemon whose pings stop), STOPPING=1 on the way
// out. Without a manager (NOTIFY_SOCKET unset: a shell, `strata up`, tests) every call is a no-op,
// so daemons call it unconditionally. Not thread-safe: one loop thread owns a notifier.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

class ServiceNotifier {
 public:
  // Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID once; later environment changes are not seen.
  ServiceNotifier();

  // True when a manager listens (NOTIFY_SOCKET set).
  bool enabled() const { return enabled_; }
  // The manager's watchdog period in microseconds, 0 when it wants no pings (or it is meant
  // for another process: WATCHDOG_PID names a different pid).
  uint64_t watchdog_usec() const { return watchdog_usec_; }

  // READY=1 (with STATUS= when `status` is not empty). Only the first call sends.
  void Ready(const std::string& status = "");
  // STATUS=<text>; newlines become spaces (the protocol is one assignment per line). Sends only
  // when the text changed since the last one, so callers may call it every loop turn.
  void SetStatus(const std::string& text);
  // WATCHDOG=1, at most once per half watchdog period (systemd's advice), so calling it every
  // loop turn is cheap; a loop that stops turning stops the pings and systemd restarts the daemon.
  void WatchdogPing();
  // STOPPING=1 (with STATUS=), so `systemctl stop` shows "deactivating" while we drain.
  void Stopping(const std::string& status = "");

 private:
  void Send(const std::string& state);

  bool enabled_ = false;
  bool ready_sent_ = false;
  uint64_t watchdog_usec_ = 0;
  int64_t last_ping_us_ = 0;  // steady clock; 0 = never
  std::string last_status_;
};

}  // namespace strata
