// The HTTP dashboard's lobby (private to coordinator/http_server.cc): slow clients.
//
// httplib serves a connection on one thread of a fixed pool (8 threads here) and reads a request
// with a timeout per recv(), so a client that sends its headers one byte at a time keeps a thread
// as long as it likes: eight such clients and the dashboard answered no one (64 of them: ~107 s).
// So a connection gets a pool thread only once its whole request (headers and Content-Length body)
// sits in the socket's receive buffer, which MSG_PEEK sees without consuming it. Until then it
// waits in this lobby: one poll() thread, no pool thread. A connection waits at most
// request_deadline_ms (then 408). At max_connections_per_address or max_connections, the oldest
// connection still sending its request (of that address, or of all) is closed to make room: a
// complete request always gets in, and slow clients can only push out each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
namespace strata::coordinator::http {

constexpr size_t kMaxRequestBytes = 16 * 1024;  // request line, headers and body together
constexpr size_t kMaxBodyBytes = 4 * 1024;      // the only body is a cancel's, which is empty
constexpr size_t kPoolThreads = 8;              // httplib's default on a machine of <= 9 cores

enum class Arrival { kIncomplete, kComplete, kClosed, kTooLarge, kBodyTooLarge, kChunked };

int64_t SteadyNowMs();

// The connections accepted and not yet closed: those waiting for their request (parked, polled by
// the lobby's thread) and those a pool thread serves. Thread-safe.
class Lobby {
 public:
  struct Limits {
    int deadline_ms, per_address, total;
  };
  // dispatch(fd, address) serves a complete request on a pool thread, closes fd and calls
  // Done(address).
  Lobby(Limits limits, std::function<void(int, const std::string&)> dispatch);
  ~Lobby() { Stop(); }

  void Stop();

  // A freshly accepted connection (on a pool thread). True: its request is complete, serve it on
  // this thread now, close it and call Done(*address); false: the lobby owns fd from here.
  bool Admit(int fd, std::string* address_out);

  // A served connection from `address` was closed.
  void Done(const std::string& address);

 private:
  struct Conn {
    std::string address;
    int64_t deadline_ms;
    uint64_t sequence;  // accept order: the oldest has the smallest
    bool parked;
    bool evicted = false;  // shut down to make room, uncounted, closed by the lobby's thread
  };

  static int64_t Now() { return SteadyNowMs(); }

  void Wake();

  // Shuts down (does not close: the fd number must not be reused while the lobby's thread may
  // poll it) the oldest parked connection, of `address` if given.
  bool EvictOldestParked(const std::string* address, std::vector<int>* evicted) STRATA_REQUIRES(mu_);

  void Forget(int fd) STRATA_REQUIRES(mu_);

  // A parked or just-admitted connection that will not be served: answer why (best effort), close.
  void Finish(int fd, Arrival a);

  void Loop();

  const Limits limits_;
  const std::function<void(int, const std::string&)> dispatch_;
  int wake_ = -1;
  std::thread thread_;
  Mutex mu_;
  bool stopping_ STRATA_GUARDED_BY(mu_) = false;
  std::map<int, Conn> conns_ STRATA_GUARDED_BY(mu_);               // admitted, not yet being served
  std::map<std::string, int> per_address_ STRATA_GUARDED_BY(mu_);  // counted connections by peer address
  int total_ STRATA_GUARDED_BY(mu_) = 0;
  uint64_t sequence_ STRATA_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ STRATA_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::coordinator::http
