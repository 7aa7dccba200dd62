#include "coordinator/http_lobby.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string_view>

#include "common/log.h"

namespace strata::coordinator::http {
namespace {

// How much of the request is in the socket (never blocks, consumes nothing).
Arrival PeekRequest(int fd) {
  static thread_local std::string buf(kMaxRequestBytes, '\0');
  const ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return Arrival::kClosed;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? Arrival::kIncomplete : Arrival::kClosed;
  const std::string_view data(buf.data(), static_cast<size_t>(n));
  size_t end = data.find("\r\n\r\n");
  size_t sep = 4;
  if (const size_t lf = data.find("\n\n");
      lf != std::string_view::npos && (end == std::string_view::npos || lf < end)) {
    end = lf;
    sep = 2;
  }
  if (end == std::string_view::npos)
    return static_cast<size_t>(n) == buf.size() ? Arrival::kTooLarge : Arrival::kIncomplete;
  size_t body = 0;
  for (size_t at = data.find('\n'); at < end; at = data.find('\n', at + 1)) {
    const size_t line_end = std::min(data.find('\n', at + 1), end);
    std::string line(data.substr(at + 1, line_end - at - 1));
    std::transform(line.begin(), line.end(), line.begin(), [](unsigned char c) { return std::tolower(c); });
    if (line.rfind("transfer-encoding:", 0) == 0) return Arrival::kChunked;
    if (line.rfind("content-length:", 0) == 0) {
      try {
        body = std::stoull(line.substr(15));
      } catch (const std::exception&) {
        body = kMaxBodyBytes + 1;
      }
      if (body > kMaxBodyBytes) return Arrival::kBodyTooLarge;
    }
  }
  if (end + sep + body > buf.size()) return Arrival::kTooLarge;
  return static_cast<size_t>(n) >= end + sep + body ? Arrival::kComplete : Arrival::kIncomplete;
}

}  // namespace

int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

// Best effort: the client may be gone, and a refusal must never block.
void Refuse(int fd, int status, const char* reason, const std::string& message) {
  const std::string body = message + "\n";
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                               "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

}  // namespace

Lobby::Lobby(Limits limits, std::function<void(int, const std::string&)> dispatch)
    : limits_(limits), dispatch_(std::move(dispatch)) {
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([this] { Loop(); });
}

void Lobby::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  Wake();
  thread_.join();
  MutexLock lock(mu_);  // the lobby's thread is gone; the lock is for the analysis
  for (auto& [fd, c] : conns_) {
    if (c.parked) ::close(fd);
  }
  ::close(wake_);
}

bool Lobby::Admit(int fd, std::string* address_out) {
  const std::string address = PeerAddress(fd);
  *address_out = address;
  std::vector<int> evicted;
  {
    MutexLock lock(mu_);
    if (stopping_) {
      ::close(fd);
      return false;
    }
    if (per_address_[address] >= limits_.per_address && !EvictOldestParked(&address, &evicted)) {
      Refuse(fd, 503, "Service Unavailable",
             "too many connections from " + address + " (" + std::to_string(limits_.per_address) +
                 " are being served); close some and retry");
      return false;
    }
    if (total_ >= limits_.total && !EvictOldestParked(nullptr, &evicted)) {
      Refuse(fd, 503, "Service Unavailable",
             "the dashboard is serving its maximum of " + std::to_string(limits_.total) +
                 " connections; retry in a moment");
      return false;
    }
    ++per_address_[address];
    ++total_;
    conns_[fd] = Conn{address, Now() + limits_.deadline_ms, ++sequence_, false};
  }
  if (!evicted.empty()) Wake();
  const Arrival a = PeekRequest(fd);
  if (a == Arrival::kComplete) {
    MutexLock lock(mu_);
    conns_.erase(fd);  // still counted until Done
    return true;
  }
  if (a != Arrival::kIncomplete) {
    Finish(fd, a);
    return false;
  }
  {
    MutexLock lock(mu_);
    conns_[fd].parked = true;
  }
  Wake();
  return false;
}

void Lobby::Done(const std::string& address) {
  MutexLock lock(mu_);
  if (--per_address_[address] <= 0) per_address_.erase(address);
  --total_;
}

void Lobby::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof(one));
}

bool Lobby::EvictOldestParked(const std::string* address, std::vector<int>* evicted) {
  int oldest = -1;
  uint64_t best = UINT64_MAX;
  for (const auto& [fd, c] : conns_) {
    if (c.parked && !c.evicted && (!address || c.address == *address) && c.sequence < best) {
      best = c.sequence;
      oldest = fd;
    }
  }
  if (oldest < 0) return false;
  Conn& c = conns_[oldest];
  c.evicted = true;
  --per_address_[c.address];
  --total_;
  ::shutdown(oldest, SHUT_RDWR);
  evicted->push_back(oldest);
  if (++evictions_ == 1 || evictions_ % 1000 == 0) {
    STRATA_LOG(kWarn) << "dashboard: closed a connection from " << c.address
                      << " that had not sent its whole request, to make room for a new one (" << evictions_
                      << " so far: too many slow or idle clients)";
  }
  return true;
}

void Lobby::Forget(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (!it->second.evicted) {
    if (--per_address_[it->second.address] == 0) per_address_.erase(it->second.address);
    --total_;
  }
  conns_.erase(it);
}

void Lobby::Finish(int fd, Arrival a) {
  switch (a) {
    case Arrival::kTooLarge:
      Refuse(fd, 431, "Request Header Fields Too Large",
             "the request is over " + std::to_string(kMaxRequestBytes) + " bytes; the dashboard takes small requests");
      break;
    case Arrival::kBodyTooLarge:
      Refuse(fd, 413, "Payload Too Large",
             "a request body may have at most " + std::to_string(kMaxBodyBytes) + " bytes");
      break;
    case Arrival::kChunked:
      Refuse(fd, 411, "Length Required", "send the body with Content-Length (chunked bodies are not accepted)");
      break;
    case Arrival::kIncomplete:
      Refuse(fd, 408, "Request Timeout",
             "the request did not arrive within " + std::to_string(limits_.deadline_ms) + " ms; send it whole");
      break;
    default:
      ::close(fd);
  }
  MutexLock lock(mu_);
  Forget(fd);
}

void Lobby::Loop() {
  std::vector<pollfd> fds;
  while (true) {
    int timeout = 1000;
    fds.assign(1, pollfd{wake_, POLLIN, 0});
    std::vector<int> closing;
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      const int64_t now = Now();
      for (auto it = conns_.begin(); it != conns_.end();) {
        if (it->second.parked && it->second.evicted) {
          ::close(it->first);
          it = conns_.erase(it);
          continue;
        }
        if (it->second.parked) {
          if (it->second.deadline_ms <= now) {
            closing.push_back(it->first);
          } else {
            fds.push_back(pollfd{it->first, POLLIN, 0});
            timeout = static_cast<int>(std::min<int64_t>(timeout, it->second.deadline_ms - now));
          }
        }
        ++it;
      }
    }
    for (int fd : closing) Finish(fd, Arrival::kIncomplete);
    if (!closing.empty()) continue;
    if (::poll(fds.data(), fds.size(), std::max(timeout, 1)) < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) {
      uint64_t n;
      (void)!::read(wake_, &n, sizeof(n));
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      {
        MutexLock lock(mu_);
        auto it = conns_.find(fd);
        if (it == conns_.end() || !it->second.parked || it->second.evicted) continue;  // next round closes it
      }
      const Arrival a = PeekRequest(fd);
      if (a == Arrival::kIncomplete) continue;
      if (a != Arrival::kComplete) {
        Finish(fd, a);
        continue;
      }
      std::string address;
      {
        MutexLock lock(mu_);
        auto it = conns_.find(fd);
        if (it == conns_.end() || it->second.evicted) continue;  // evicted meanwhile: next round closes it
        address = it->second.address;
        conns_.erase(it);  // served from here on; still counted until Done
      }
      dispatch_(fd, address);
    }
  }
}

}  // namespace strata::coordinator::http
