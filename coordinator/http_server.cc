#include "coordinator/http_server.h"

#include <chrono>
#include <httplib.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/log.h"
#include "coordinator/client.h"
#include "schema/envelope.h"

namespace strata::coordinator {
namespace {

// Compares without an early exit, so response timing does not reveal how much of a guess matched.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

class HttpServerImpl final : public HttpServer {
 public:
  explicit HttpServerImpl(HttpServerOptions options)
      : options_(std::move(options)), client_(options_.coordinator_endpoint, 5000, options_.keys) {}

  ~HttpServerImpl() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Status Listen() {
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
    return Status::Ok();
  }

  int port() const override { return port_; }

  void Publish(std::shared_ptr<const DashboardSnapshot> snapshot) override {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    snapshot_ = std::move(snapshot);
  }

 private:
  std::shared_ptr<const DashboardSnapshot> Latest() {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    return snapshot_;
  }

  void Routes() {
    server_.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(std::string(DashboardPageHtml()), "text/html; charset=utf-8");
    });
    server_.Get("/api/state", [this](const httplib::Request&, httplib::Response& res) {
      auto s = Latest();
      if (!s) return NotReady(res);
      res.set_header("Cache-Control", "no-store");
      res.set_content(RenderStateJson(*s), "application/json");
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
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (auth.rfind(prefix, 0) != 0 || !SameToken(auth.substr(prefix.size()), options_.token)) {
        res.set_header("WWW-Authenticate", "Bearer");
        return Error(res, 401, "send Authorization: Bearer <token>, the token in the cluster's http.token file");
      }
      const std::string run = httplib::detail::decode_url(req.matches[1], false);
      schema::EnvelopeBuilder request;
      request.root().initCancelRun().setRunId(run);
      std::unique_lock<std::mutex> lock(client_mu_);  // one DEALER socket, one caller at a time
      auto reply = client_.Call(request);
      lock.unlock();
      if (!reply.ok()) {
        const StatusCode code = reply.status().code();
        return Error(res, code == StatusCode::kNotFound ? 404 : code == StatusCode::kInvalidArgument ? 409 : 502,
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
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex snapshot_mu_;
  std::shared_ptr<const DashboardSnapshot> snapshot_;
  std::mutex client_mu_;
  CoordinatorClient client_;
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
    return InvalidArgument("--http " + address + ": expected HOST:PORT or PORT, e.g. 127.0.0.1:8080 (port 0 picks a free one)");
  }
  return std::make_pair(host, p);
}

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read the token file " + path + "; create it (mode 0600) with one line, the token");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) return InvalidArgument("the token file " + path + " is empty; put a random token on its first line");
  return token;
}

std::string LocalEndpointFor(const std::string& listen) {
  for (const std::string wildcard : {"tcp://*:", "tcp://0.0.0.0:"}) {
    if (listen.rfind(wildcard, 0) == 0) return "tcp://127.0.0.1:" + listen.substr(wildcard.size());
  }
  return listen;
}

}  // namespace strata::coordinator
