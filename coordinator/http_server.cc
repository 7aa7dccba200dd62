#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "client/coordinator_client.h"
#include "common/log.h"
#include "common/thread_annotations.h"
#include "coordinator/http_lobby.h"
#include "schema/envelope.h"

namespace strata::coordinator {
namespace {

using http::kMaxBodyBytes;
using http::kPoolThreads;
using http::Lobby;
using http::SteadyNowMs;

// A served connection as httplib's request parser sees it. The request is in the receive buffer
// already; the whole exchange, the response's write included, must end by `deadline_ms` (a client
// that reads its answer a byte at a time cannot keep a pool thread either).
class ServedStream final : public httplib::Stream {
 public:
  ServedStream(int fd, int64_t deadline_ms) : fd_(fd), deadline_ms_(deadline_ms) {}
  bool is_readable() const override { return Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }
  ssize_t read(char* ptr, size_t size) override {
    if (!is_readable()) return -1;
    return ::recv(fd_, ptr, size, 0);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { Address(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Address(::getsockname, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  bool Wait(short events) const {
    const int64_t left = deadline_ms_ - SteadyNowMs();
    if (left <= 0) return false;
    pollfd p{fd_, events, 0};
    int n;
    while ((n = ::poll(&p, 1, static_cast<int>(left))) < 0 && errno == EINTR) {
    }
    return n > 0;
  }
  template <typename GetName>
  void Address(GetName get, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = "";
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }
  const int fd_;
  const int64_t deadline_ms_;
};

// httplib's server with the lobby in front: every accepted socket goes through Lobby::Admit on a
// pool thread (briefly) and is served only once its request is complete, one request per
// connection (a kept-alive connection would skip the lobby).
class GuardedServer final : public httplib::Server {
 public:
  explicit GuardedServer(Lobby::Limits limits)
      : serve_ms_(limits.deadline_ms), lobby_(limits, [this](int fd, const std::string& address) {
          pool_->enqueue([this, fd, address] { Serve(fd, address); });
        }) {
    new_task_queue = [this] {
      pool_ = new httplib::ThreadPool(kPoolThreads);  // httplib owns and deletes it when listen() ends
      return pool_;
    };
    set_payload_max_length(kMaxBodyBytes);
  }
  // Before httplib's stop(): the lobby dispatches to the pool, which lives until listen() returns.
  void StopLobby() { lobby_.Stop(); }

 protected:
  bool process_and_close_socket(socket_t sock) override {
    std::string address;
    if (lobby_.Admit(sock, &address)) Serve(sock, address);
    return true;
  }

 private:
  void Serve(int fd, const std::string& address) {
    ServedStream stream(fd, SteadyNowMs() + serve_ms_);
    bool closed = false;
    process_request(stream, /*close_connection=*/true, closed, nullptr);
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    lobby_.Done(address);
  }

  const int serve_ms_;
  httplib::TaskQueue* pool_ = nullptr;  // set on the accept thread before any connection is accepted
  Lobby lobby_;
};

// Compares without an early exit, so response timing does not reveal how much of a guess matched.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

class HttpServerImpl final : public HttpServer {
 public:
  explicit HttpServerImpl(HttpServerOptions options)
      : options_(std::move(options)),
        loopback_(IsLoopbackHost(options_.host)),
        server_(Lobby::Limits{options_.request_deadline_ms, options_.max_connections_per_address,
                              options_.max_connections}),
        client_(options_.coordinator_endpoint, 5000, options_.keys) {}

  ~HttpServerImpl() override {
    server_.StopLobby();
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Status Listen() {
    if (!loopback_ && options_.token.empty() && !options_.public_read) {
      return InvalidArgument("--http " + options_.host + ":" + std::to_string(options_.port) +
                             " is reachable from other machines and would show anyone run names, paths, pids and "
                             "events: give --http-token-file (reads then need the token too), or --http-public-read "
                             "to allow that, or bind 127.0.0.1 and tunnel (ssh -L)");
    }
    Routes();
    // httplib's default adds SO_REUSEPORT, which would let a second coordinator bind the same
    // port silently; SO_REUSEADDR alone still allows a quick restart.
    server_.set_socket_options([](int sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    if (options_.port == 0) {
      port_ = server_.bind_to_any_port(options_.host);
    } else if (server_.bind_to_port(options_.host, options_.port)) {
      port_ = options_.port;
    }
    if (port_ <= 0) {
      return Unavailable("the dashboard cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                         "; the port is taken or the host is not an address of this machine - pick another --http");
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op until the accept loop runs: wait for it, or a server destroyed right away
    // would leave that loop (and the destructor's join) running forever.
    for (int i = 0; i < 2000 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!server_.is_running()) {
      server_.stop();
      thread_.join();
      return Unavailable("the dashboard on " + options_.host + ":" + std::to_string(port_) + " did not start");
    }
    STRATA_LOG(kInfo) << "dashboard on http://" << options_.host << ":" << port_;
    if (!loopback_ && options_.public_read) {
      STRATA_LOG(kWarn) << "dashboard: --http-public-read: anyone who can reach " << options_.host << ":" << port_
                        << " can read run names, paths, pids and events without the token (actions still need it)";
    } else if (!loopback_) {
      STRATA_LOG(kWarn) << "dashboard: " << options_.host << ":" << port_
                        << " is reachable from other machines: reads need the token too (Authorization: Bearer), "
                           "and it travels in clear text over HTTP - prefer 127.0.0.1 and an ssh tunnel";
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  void Publish(std::shared_ptr<const DashboardSnapshot> snapshot) override {
    MutexLock lock(snapshot_mu_);
    snapshot_ = std::move(snapshot);
    published_ms_ = SteadyNowMs();
  }

 private:
  std::shared_ptr<const DashboardSnapshot> Latest() {
    MutexLock lock(snapshot_mu_);
    return snapshot_;
  }

  // How long ago the newest snapshot came; -1 before the first.
  int64_t PublishedAgeMs() {
    MutexLock lock(snapshot_mu_);
    return published_ms_ < 0 ? -1 : SteadyNowMs() - published_ms_;
  }

  // Before any route: the Host check (loopback binds) and the token for reads (other binds).
  httplib::Server::HandlerResponse Guard(const httplib::Request& req, httplib::Response& res) {
    if (loopback_) {
      // DNS rebinding: a web page from evil.example whose name then resolves to 127.0.0.1 can make
      // the browser read this port, but the browser still sends Host: evil.example. Any port is
      // accepted, so `ssh -L 8080:127.0.0.1:PORT` and http://localhost:8080 keep working.
      if (!LoopbackHostHeader(req.get_header_value("Host"))) {
        Error(res, 403,
              "the Host header must be localhost, 127.0.0.1 or [::1] (with any port): this dashboard "
              "answers only requests addressed to the loopback interface (DNS rebinding guard); "
              "reach it through http://127.0.0.1:" +
                  std::to_string(port_) + " or an ssh tunnel");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    }
    // Beyond loopback every read but the page itself and /healthz (which hold no data) needs the
    // token: the kubelet probes /healthz without one.
    if (options_.public_read || req.method == "POST" ||
        (req.method == "GET" && (req.path == "/" || req.path == "/healthz"))) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (!Authorized(req)) {
      res.set_header("WWW-Authenticate", "Bearer");
      Error(res, 401,
            "this dashboard listens beyond loopback, so reads need the token too: send "
            "Authorization: Bearer <token> (the first line of the coordinator's --http-token-file), or "
            "restart the coordinator with --http-public-read to let anyone read");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  bool Authorized(const httplib::Request& req) const {
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    return !options_.token.empty() && auth.rfind(prefix, 0) == 0 &&
           SameToken(auth.substr(prefix.size()), options_.token);
  }

  static bool LoopbackHostHeader(const std::string& host) {
    std::string name = host;
    if (!name.empty() && name.front() == '[') {
      const size_t close = name.find(']');
      if (close == std::string::npos) return false;
      name = name.substr(1, close - 1);
    } else if (const size_t colon = name.rfind(':'); colon != std::string::npos) {
      name = name.substr(0, colon);
    }
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    return name == "localhost" || name == "127.0.0.1" || name == "::1";
  }

  void Routes() {
    server_.set_pre_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { return Guard(req, res); });
    server_.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(std::string(DashboardPageHtml()), "text/html; charset=utf-8");
    });
    server_.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      const int64_t age = PublishedAgeMs();
      if (age < 0) return Error(res, 503, "starting: the coordinator has not published its state yet");
      if (age > options_.health_stale_ms) {
        return Error(res, 503,
                     "the coordinator's event loop last published its state " + std::to_string(age) +
                         " ms ago (it does every ~250 ms): it is stuck or starved");
      }
      res.set_content("ok: state published " + std::to_string(age) + " ms ago\n", "text/plain; charset=utf-8");
    });
    server_.Get("/api/state", [this](const httplib::Request& req, httplib::Response& res) {
      auto param = [&](const char* name) -> std::optional<std::string> {
        if (!req.has_param(name)) return std::nullopt;
        return req.get_param_value(name);
      };
      const auto offset = param("workers_offset"), limit = param("workers_limit");
      auto page = ParseWorkerPage(offset ? &*offset : nullptr, limit ? &*limit : nullptr);
      if (!page.ok()) return Error(res, 400, page.status().message());
      auto s = Latest();
      if (!s) return NotReady(res);
      res.set_header("Cache-Control", "no-store");
      res.set_content(RenderStateJson(*s, *page), "application/json");
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      auto s = Latest();
      if (!s) return NotReady(res);
      res.set_content(RenderMetrics(*s), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Post(R"(/api/runs/([^/]+)/cancel)", [this](const httplib::Request& req, httplib::Response& res) {
      if (options_.token.empty()) {
        return Error(res, 403, "cancelling from the dashboard is off: start the coordinator with --http-token-file");
      }
      if (!Authorized(req)) {
        res.set_header("WWW-Authenticate", "Bearer");
        return Error(res, 401, "send Authorization: Bearer <token>, the token in the cluster's http.token file");
      }
      const std::string run = httplib::detail::decode_url(req.matches[1], false);
      schema::EnvelopeBuilder request;
      request.root().initCancelRun().setRunId(run);
      MutexLock lock(client_mu_);  // one DEALER socket, one caller at a time
      auto reply = client_.Call(request);
      lock.Unlock();
      if (!reply.ok()) {
        const StatusCode code = reply.status().code();
        return Error(res,
                     code == StatusCode::kNotFound          ? 404
                     : code == StatusCode::kInvalidArgument ? 409
                                                            : 502,
                     reply.status().message());
      }
      STRATA_LOG(kInfo) << "run " << run << " cancelled from the dashboard by " << req.remote_addr;
      res.set_content(nlohmann::json{{"cancelled", run}}.dump(), "application/json");
    });
  }

  static void NotReady(httplib::Response& res) { Error(res, 503, "the coordinator has not published its state yet"); }

  static void Error(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(message + "\n", "text/plain; charset=utf-8");
  }

  HttpServerOptions options_;
  const bool loopback_;
  GuardedServer server_;
  std::thread thread_;
  int port_ = 0;
  Mutex snapshot_mu_;
  std::shared_ptr<const DashboardSnapshot> snapshot_ STRATA_GUARDED_BY(snapshot_mu_);
  int64_t published_ms_ STRATA_GUARDED_BY(snapshot_mu_) = -1;  // steady clock
  Mutex client_mu_;
  client::CoordinatorClient client_ STRATA_GUARDED_BY(client_mu_);
};

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options) {
  auto server = std::make_unique<HttpServerImpl>(options);
  STRATA_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

Result<std::pair<std::string, int>> ParseHttpAddress(const std::string& address) {
  std::string host = "127.0.0.1", port = address;
  if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    if (colon > 0) host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int p = -1;
  try {
    size_t used = 0;
    p = std::stoi(port, &used);
    if (used != port.size()) p = -1;
  } catch (const std::exception&) {
  }
  if (p < 0 || p > 65535) {
    return InvalidArgument("--http " + address +
                           ": expected HOST:PORT or PORT, e.g. 127.0.0.1:8080 (port 0 picks a free one)");
  }
  return std::make_pair(host, p);
}

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read the token file " + path + "; create it (mode 0600) with one line, the token");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty())
    return InvalidArgument("the token file " + path + " is empty; put a random token on its first line");
  return token;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string LocalEndpointFor(const std::string& listen) {
  for (const std::string wildcard : {"tcp://*:", "tcp://0.0.0.0:"}) {
    if (listen.rfind(wildcard, 0) == 0) return "tcp://127.0.0.1:" + listen.substr(wildcard.size());
  }
  return listen;
}

}  // namespace strata::coordinator
