// The dashboard's renderers on a hand-made snapshot (exact Prometheus text and JSON), and the HTTP
// server wired to a real coordinator (its own thread, real ipc + TCP sockets, real RocksDB): what
// /api/state shows follows the coordinator, and cancel needs the bearer token.
#include "coordinator/dashboard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/coordinator_client.h"
#include "common/net.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_server.h"

namespace strata::coordinator {
namespace {

using client::CoordinatorClient;

using json = nlohmann::json;

std::shared_ptr<const MemoryHistory> History(std::vector<DashboardMemorySample> samples) {
  auto h = std::make_shared<MemoryHistory>();
  for (const auto& m : samples) h->Append(m);
  return h;
}

DashboardSnapshot HandMade() {
  DashboardSnapshot s;
  s.unix_ms = 1700000000000;
  s.endpoint = "ipc:///tmp/x.sock";
  s.workers_lost_total = 1;
  s.checkpoints_total = 3;
  s.run_workers_lost_total = 1;
  s.workers.push_back(
      {"worker-0", "host-a", 42, "busy", "cuda:0", 80ull << 30, 60ull << 30, 12ull << 30, 15ull << 30, 250, "r1",
       History({{1699999999000, 20ull << 30, 11ull << 30}, {1700000000000, 20ull << 30, 12ull << 30}})});
  s.workers.push_back({"worker-\"1\"", "host-a", 43, "lost", "cpu", 0, 0, 0, 0, 4500, "", nullptr});
  DashboardRun r;
  r.id = "r1";
  r.name = "tiny";
  r.state = "running";
  r.step = 3;
  r.total_steps = 10;
  r.tokens_per_step = 1000;
  r.losses = {5.5, 4.25, 3.125};
  r.tokens_per_second = 500;
  r.workers = {"worker-0"};
  r.events = {{1700000000000, "submitted", "run r1 submitted"}, {1700000000100, "checkpoint", "at step 2"}};
  r.checkpoints = 1;
  r.kind = RunKind::kTrain;
  r.handled = {{"worker-lost", 1}, {"oom", 2}};
  r.plan = {true, 2, 2, 1, 3, 4, 2, false, {3, 5}, 2, Offload::kOptimizerAndParams};
  r.memory = {{"worker-0", 10ull << 30, 1ull << 30, 9ull << 30}};
  s.runs.push_back(r);
  DashboardRun x;
  x.id = "x1";
  x.name = "acts";
  x.kind = RunKind::kExtract;
  x.state = "running";
  x.rows_stored = 4096;
  x.rows_total = 16384;
  x.bytes_stored = 1 << 20;
  x.bytes_per_second = 2.5e8;
  s.runs.push_back(x);
  DashboardRun done;
  done.id = "r0";
  done.name = "old";
  done.state = "finished";
  done.losses = {1.0};
  s.runs.push_back(done);
  return s;
}

TEST(DashboardRender, MetricsAreExactPrometheusText) {
  const std::string text = RenderMetrics(HandMade());
  // Families: HELP and TYPE once, before their samples.
  EXPECT_NE(text.find("# HELP strata_worker_memory_free_bytes Free device memory, as the device reports it.\n"
                      "# TYPE strata_worker_memory_free_bytes gauge\n"
                      "strata_worker_memory_free_bytes{worker=\"worker-0\",device=\"cuda:0\"} 64424509440\n"
                      "strata_worker_memory_free_bytes{worker=\"worker-\\\"1\\\"\",device=\"cpu\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("strata_worker_memory_used_bytes{worker=\"worker-0\",device=\"cuda:0\"} 21474836480\n"),
            std::string::npos);
  EXPECT_NE(text.find("strata_worker_heartbeat_age_seconds{worker=\"worker-0\",device=\"cuda:0\"} 0.25\n"),
            std::string::npos);
  EXPECT_NE(text.find("strata_worker_up{worker=\"worker-\\\"1\\\"\",device=\"cpu\"} 0\n"), std::string::npos);
  EXPECT_NE(
      text.find(
          "strata_workers{state=\"busy\"} 1\nstrata_workers{state=\"idle\"} 0\nstrata_workers{state=\"lost\"} 1\n"),
      std::string::npos);
  EXPECT_NE(text.find("strata_run_loss{run=\"r1\",name=\"tiny\"} 3.125\n"), std::string::npos);
  EXPECT_NE(text.find("strata_run_step{run=\"r1\",name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("strata_run_tokens_per_second{run=\"r1\",name=\"tiny\"} 500\n"), std::string::npos);
  EXPECT_EQ(text.find("run=\"r0\""), std::string::npos) << "finished runs get no per-run series";
  EXPECT_NE(text.find("strata_runs{state=\"finished\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("strata_runs{state=\"running\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE strata_checkpoints_committed_total counter\nstrata_checkpoints_committed_total 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE strata_workers_lost_total counter\nstrata_workers_lost_total 1\n"), std::string::npos);
  // Each TYPE line is unique.
  size_t types = 0, pos = 0;
  std::set<std::string> names;
  while ((pos = text.find("# TYPE ", pos)) != std::string::npos) {
    const size_t end = text.find(' ', pos + 7);
    EXPECT_TRUE(names.insert(text.substr(pos + 7, end - pos - 7)).second);
    ++types;
    pos = end;
  }
  EXPECT_GE(types, 15u);
}

TEST(DashboardRender, LossBeforeTheFirstStepIsNaN) {
  DashboardSnapshot s;
  DashboardRun r;
  r.id = "p";
  r.name = "p";
  r.state = "pending";
  s.runs.push_back(r);
  EXPECT_NE(RenderMetrics(s).find("strata_run_loss{run=\"p\",name=\"p\"} NaN\n"), std::string::npos);
}

TEST(DashboardRender, StateJsonCarriesWorkersRunsEventsAndEta) {
  const json j = json::parse(RenderStateJson(HandMade()));
  ASSERT_EQ(j["workers"].size(), 2u);
  EXPECT_EQ(j["workers"][0]["id"], "worker-0");
  EXPECT_EQ(j["workers"][0]["memory"]["total"], 80ull << 30);
  EXPECT_EQ(j["workers"][0]["memory"]["free"], 60ull << 30);
  EXPECT_EQ(j["workers"][0]["heartbeat_age_ms"], 250);
  EXPECT_EQ(j["workers"][1]["id"], "worker-\"1\"");
  ASSERT_EQ(j["runs"].size(), 3u);
  const json& r = j["runs"][0];
  EXPECT_EQ(r["state"], "running");
  EXPECT_EQ(r["step"], 3);
  EXPECT_EQ(r["total_steps"], 10);
  EXPECT_EQ(r["loss"], 3.125);
  EXPECT_EQ(r["loss_points"], json::parse("[[1,5.5],[2,4.25],[3,3.125]]"));
  EXPECT_DOUBLE_EQ(r["eta_seconds"].get<double>(), 7 * 1000 / 500.0);  // 7 steps x 1000 tokens at 500 tok/s
  ASSERT_EQ(r["events"].size(), 2u);
  EXPECT_EQ(r["events"][1]["kind"], "checkpoint");
  EXPECT_TRUE(j["runs"][2]["eta_seconds"].is_null()) << "no ETA for a finished run";
  EXPECT_EQ(j["workers"][0]["memory_history"],
            json::parse("[[1699999999000,21474836480,11811160064],[1700000000000,21474836480,12884901888]]"));
  EXPECT_EQ(j["workers"][1]["memory_history"], json::array());
}

// A worker's chart holds the last MemoryHistory::kCapacity samples, oldest first, in memory
// allocated once: the coordinator's size is set by the cluster, not by how long it has run.
TEST(DashboardRender, MemoryHistoryKeepsTheLastSamplesInOrderInAFixedRing) {
  MemoryHistory h;
  EXPECT_EQ(h.size(), 0u);
  const size_t n = MemoryHistory::kCapacity + 7;
  for (size_t i = 0; i < n; ++i) h.Append({static_cast<int64_t>(i), i * 10, i});
  ASSERT_EQ(h.size(), MemoryHistory::kCapacity);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(h[i].unix_ms, static_cast<int64_t>(i + 7)) << i;
  EXPECT_EQ(h.newest().used, (n - 1) * 10);
  static_assert(sizeof(MemoryHistory) <= 4096, "a worker's chart stays a few KiB");
  // Ten minutes of samples.
  EXPECT_EQ(MemoryHistory::kEveryMs * static_cast<int64_t>(MemoryHistory::kCapacity), 600000);
}

// /api/state lists one page of workers (at 10,000 workers the whole list was 86 MB a poll); the
// counts by state cover every worker.
TEST(DashboardRender, StateJsonListsAPageOfWorkersAndCountsThemAll) {
  DashboardSnapshot s;
  for (int i = 0; i < 250; ++i) {
    s.workers.push_back({"w" + std::to_string(1000 + i), "h", 1,
                         i % 5 == 0 ? "lost"
                         : i % 2    ? "busy"
                                    : "idle",
                         "cpu", 0, 0, 0, 0, 0, "", nullptr});
  }
  json j = json::parse(RenderStateJson(s));
  EXPECT_EQ(j["workers_total"], 250);
  EXPECT_EQ(j["workers_offset"], 0);
  ASSERT_EQ(j["workers"].size(), WorkerPage::kDefaultLimit);
  EXPECT_EQ(j["workers"][0]["id"], "w1000");
  EXPECT_EQ(j["workers_by_state"], json::parse(R"({"idle": 100, "busy": 100, "lost": 50})"));
  j = json::parse(RenderStateJson(s, WorkerPage{200, 100}));
  ASSERT_EQ(j["workers"].size(), 50u);
  EXPECT_EQ(j["workers"][0]["id"], "w1200");
  EXPECT_EQ(j["workers"][49]["id"], "w1249");
  j = json::parse(RenderStateJson(s, WorkerPage{400, 10}));
  EXPECT_EQ(j["workers"].size(), 0u) << "past the end: an empty page";
  EXPECT_EQ(j["workers_total"], 250);
}

TEST(DashboardRender, WorkerPageParametersAreBoundedAndNamedWhenBad) {
  const std::string zero = "0", five = "5", big = "1001", neg = "-1", text = "ten", huge = "99999999999999999999";
  auto page = ParseWorkerPage(&five, &five);
  ASSERT_TRUE(page.ok()) << page.status().message();
  EXPECT_EQ(page->offset, 5u);
  EXPECT_EQ(page->limit, 5u);
  page = ParseWorkerPage(nullptr, nullptr);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->offset, 0u);
  EXPECT_EQ(page->limit, WorkerPage::kDefaultLimit);
  for (const std::string* bad : {&zero, &big, &neg, &text, &huge}) {
    auto r = ParseWorkerPage(nullptr, bad);
    ASSERT_FALSE(r.ok()) << *bad;
    EXPECT_NE(r.status().message().find("workers_limit must be a whole number from 1 to 1000, got '" + *bad + "'"),
              std::string::npos)
        << r.status().message();
  }
  for (const std::string* bad : {&neg, &text, &huge}) {
    auto r = ParseWorkerPage(bad, nullptr);
    ASSERT_FALSE(r.ok()) << *bad;
    EXPECT_NE(r.status().message().find("workers_offset"), std::string::npos) << r.status().message();
  }
}

TEST(DashboardRender, StateJsonCarriesPlanFailuresRankMemoryAndExtractRows) {
  const json j = json::parse(RenderStateJson(HandMade()));
  const json& r = j["runs"][0];
  EXPECT_EQ(r["kind"], "train");
  EXPECT_EQ(r["handled"], json::parse(R"({"oom": 2, "worker-lost": 1})"));
  EXPECT_EQ(r["plan"],
            json::parse(R"({"dp": 2, "pp": 2, "tp": 1, "zero": 3, "micro_batch": 4, "gradient_accumulation": 2,
                                       "recompute": false, "stages": [3, 5], "keep_gathered": 2, "offload": "optimizer+params"})"));
  EXPECT_EQ(r["memory"], json::parse(R"([{"worker": "worker-0", "estimate": 10737418240, "workspace": 1073741824,
                                         "measured_peak": 9663676416}])"));
  EXPECT_DOUBLE_EQ(r["step_seconds"].get<double>(), 1000 / 500.0);  // 1000 tokens a step at 500 tok/s
  EXPECT_TRUE(r["extract"].is_null());
  const json& x = j["runs"][1];
  EXPECT_EQ(x["kind"], "extract");
  EXPECT_TRUE(x["plan"].is_null());
  EXPECT_TRUE(x["step_seconds"].is_null());
  EXPECT_EQ(
      x["extract"],
      json::parse(R"({"rows_stored": 4096, "rows_total": 16384, "bytes_stored": 1048576, "bytes_per_second": 2.5e8})"));
  EXPECT_EQ(j["runs"][2]["kind"], "train") << "a run without a kind is a train run";
  EXPECT_EQ(j["runs"][2]["handled"], json::object());
}

TEST(DashboardRender, LongLossCurvesAreThinnedButKeepTheLastStep) {
  DashboardSnapshot s;
  DashboardRun r;
  r.state = "running";
  for (int i = 0; i < 5001; ++i) r.losses.push_back(10.0 - i * 0.001);
  s.runs.push_back(r);
  const json points = json::parse(RenderStateJson(s))["runs"][0]["loss_points"];
  EXPECT_LE(points.size(), 1001u);
  EXPECT_GE(points.size(), 500u);
  EXPECT_EQ(points.front()[0], 1);
  EXPECT_EQ(points.back()[0], 5001);
}

TEST(DashboardRender, PageIsSelfContained) {
  const std::string page(DashboardPageHtml());
  EXPECT_NE(page.find("/api/state"), std::string::npos);
  for (const char* external : {"src=\"http", "href=\"http", "<link", "@import", "//cdn"}) {
    EXPECT_EQ(page.find(external), std::string::npos) << external;
  }
}

TEST(HttpAddress, Parses) {
  EXPECT_EQ(ParseHttpAddress("8080").value(), std::make_pair(std::string("127.0.0.1"), 8080));
  EXPECT_EQ(ParseHttpAddress(":0").value(), std::make_pair(std::string("127.0.0.1"), 0));
  EXPECT_EQ(ParseHttpAddress("0.0.0.0:9").value(), std::make_pair(std::string("0.0.0.0"), 9));
  EXPECT_FALSE(ParseHttpAddress("host:http").ok());
  EXPECT_FALSE(ParseHttpAddress("1:70000").ok());
  EXPECT_EQ(LocalEndpointFor("tcp://*:5555"), "tcp://127.0.0.1:5555");
  EXPECT_EQ(LocalEndpointFor("ipc:///x"), "ipc:///x");
}

// A real coordinator publishing to a real HTTP server: a pending run (no workers) shows up, a
// cancel without the token is refused and changes nothing, one with the token cancels it.
TEST(HttpServer, ServesTheCoordinatorsStateAndCancelsOnlyWithTheToken) {
  char tmpl[] = "/tmp/strata-dash-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/corpus.txt") << std::string(10000, 'x');
  std::unique_ptr<HttpServer> http;
  std::mutex http_mu;
  CoordinatorOptions options;
  options.state_dir = dir + "/state";
  options.listen = "ipc://" + dir + "/c.sock";
  options.publish_snapshot = [&](std::shared_ptr<const DashboardSnapshot> s) {
    std::lock_guard<std::mutex> lock(http_mu);
    if (http) http->Publish(std::move(s));
  };
  auto coordinator = Coordinator::Create(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  {
    auto started = HttpServer::Start({"127.0.0.1", 0, "s3cret", options.listen, std::nullopt});
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    std::lock_guard<std::mutex> lock(http_mu);
    http = std::move(started).value();
  }
  std::thread loop([&] { EXPECT_TRUE((*coordinator)->Run().ok()); });

  CoordinatorClient client(options.listen);
  schema::EnvelopeBuilder submit;
  submit.root().initSubmitRun().setSpecToml(
      "name = \"t\"\n[model]\nhidden = 32\nheads = 2\nsequence = 16\n[data]\npath = \"" + dir +
      "/corpus.txt\"\n[train]\nsteps = 3\nglobal_batch = 2\n");
  auto submitted = client.Call(submit);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const std::string run = (*submitted)->root().getSubmitted().getRunId().cStr();

  httplib::Client web("127.0.0.1", http->port());
  auto run_state = [&]() -> std::string {
    for (int i = 0; i < 50; ++i) {  // until a snapshot newer than the last change is out
      auto res = web.Get("/api/state");
      if (!res) ADD_FAILURE() << "GET /api/state: " << httplib::to_string(res.error());
      // 503 until the coordinator's first snapshot is out (it publishes every 250 ms): wait.
      if (res && res->status != 200 && res->status != 503) ADD_FAILURE() << res->status << " " << res->body;
      if (res && res->status == 200) {
        const json state = json::parse(res->body);
        for (auto& r : state["runs"]) {
          if (r["id"] == run) return r["state"];
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return "absent";
  };
  EXPECT_EQ(run_state(), "pending");

  auto page = web.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<canvas"), std::string::npos);
  auto metrics = web.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("strata_runs{state=\"pending\"} 1\n"), std::string::npos) << metrics->body;

  const std::string path = "/api/runs/" + run + "/cancel";
  auto no_token = web.Post(path);
  ASSERT_TRUE(no_token);
  EXPECT_EQ(no_token->status, 401);
  auto wrong = web.Post(path, httplib::Headers{{"Authorization", "Bearer s3cres"}}, "", "text/plain");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(run_state(), "pending");

  auto ok = web.Post(path, httplib::Headers{{"Authorization", "Bearer s3cret"}}, "", "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  std::string state;
  for (int i = 0; i < 20 && (state = run_state()) != "cancelled"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(state, "cancelled");
  auto again = web.Post(path, httplib::Headers{{"Authorization", "Bearer s3cret"}}, "", "text/plain");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409) << "cancelling a cancelled run is a conflict: " << again->body;
  auto unknown =
      web.Post("/api/runs/nope/cancel", httplib::Headers{{"Authorization", "Bearer s3cret"}}, "", "text/plain");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);

  (*coordinator)->RequestStop();
  loop.join();
  {
    std::lock_guard<std::mutex> lock(http_mu);
    http.reset();
  }
  std::filesystem::remove_all(dir);
}

// Raw loopback TCP connections for the slow-client tests.
int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

HttpServerOptions LocalOptions(const std::string& token = "") {
  HttpServerOptions o;
  o.host = "127.0.0.1";
  o.token = token;
  o.coordinator_endpoint = "ipc:///tmp/none";
  return o;
}

// Slowloris: 80 clients send a request's headers one byte at a time and never finish. Before the
// lobby, each held one of httplib's 8 pool threads (a read timeout per byte), and a normal GET
// waited ~107 s behind 64 of them; now it must answer at once while they keep trickling.
TEST(HttpServer, SlowClientsDoNotStarveOthers) {
  auto server = HttpServer::Start(LocalOptions());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  (*server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  const int port = (*server)->port();

  const std::string partial =
      "GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  std::vector<int> slow;
  for (int i = 0; i < 80; ++i) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t at = 0; !stop.load() && at < partial.size(); ++at) {
      for (int fd : slow) (void)!::send(fd, &partial[at], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // they all hold what they can

  for (int attempt = 0; attempt < 3; ++attempt) {
    httplib::Client web("127.0.0.1", port);
    web.set_connection_timeout(5);
    web.set_read_timeout(5);
    const auto start = std::chrono::steady_clock::now();
    auto res = web.Get("/api/state");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(res) << "GET /api/state behind 80 slow clients: " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_LT(seconds, 2.0) << "a normal GET waited behind slow clients";
  }
  stop.store(true);
  trickle.join();
  for (int fd : slow) ::close(fd);
}

// A request that does not arrive whole within the deadline is answered 408 and closed.
TEST(HttpServer, ARequestThatNeverCompletesIsClosedAtTheDeadline) {
  HttpServerOptions o = LocalOptions();
  o.request_deadline_ms = 300;
  auto server = HttpServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = ConnectLoopback((*server)->port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::send(fd, "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL), 16);
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto start = std::chrono::steady_clock::now();
  char buf[512] = {0};
  const ssize_t n = ::recv(fd, buf, sizeof(buf) - 1, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_GT(n, 0) << "no answer within 3 s";
  EXPECT_EQ(std::string(buf).rfind("HTTP/1.1 408", 0), 0u) << buf;
  EXPECT_LT(seconds, 2.0);
  ::close(fd);
}

// GET /api/state?workers_offset=&workers_limit= pages the workers; a bad value is a 400 naming
// the parameter, and the server goes on answering.
TEST(HttpServer, StatePagesWorkersAndRefusesABadPageNamingIt) {
  auto server = HttpServer::Start(LocalOptions());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  (*server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  httplib::Client web("127.0.0.1", (*server)->port());
  auto second = web.Get("/api/state?workers_offset=1&workers_limit=1");
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  const json j = json::parse(second->body);
  ASSERT_EQ(j["workers"].size(), 1u);
  EXPECT_EQ(j["workers"][0]["id"], "worker-\"1\"");
  EXPECT_EQ(j["workers_total"], 2);
  for (const char* bad : {"/api/state?workers_limit=0", "/api/state?workers_limit=x", "/api/state?workers_offset=-3"}) {
    auto res = web.Get(bad);
    ASSERT_TRUE(res) << bad;
    EXPECT_EQ(res->status, 400) << bad;
    EXPECT_NE(res->body.find("workers_"), std::string::npos) << res->body;
  }
  auto whole = web.Get("/api/state");
  ASSERT_TRUE(whole);
  EXPECT_EQ(json::parse(whole->body)["workers"].size(), 2u);
}

// Bound beyond loopback (0.0.0.0, reached here through 127.0.0.1): reads need the token too.
TEST(HttpServer, BeyondLoopbackReadsNeedTheToken) {
  HttpServerOptions o = LocalOptions("s3cret");
  o.host = "0.0.0.0";
  auto server = HttpServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  (*server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  httplib::Client web("127.0.0.1", (*server)->port());
  for (const char* path : {"/api/state", "/metrics"}) {
    auto res = web.Get(path);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << path;
    EXPECT_NE(res->body.find("Authorization: Bearer"), std::string::npos) << res->body;
    EXPECT_NE(res->body.find("--http-public-read"), std::string::npos) << res->body;
    auto wrong = web.Get(path, httplib::Headers{{"Authorization", "Bearer nope"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401) << path;
    auto ok = web.Get(path, httplib::Headers{{"Authorization", "Bearer s3cret"}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << path << ": " << ok->body;
  }
  auto page = web.Get("/");  // the page holds no data; it asks for the token itself
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);

  // Without a token file it refuses to start, unless reads are made public on purpose.
  HttpServerOptions open = LocalOptions();
  open.host = "0.0.0.0";
  auto refused = HttpServer::Start(open);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--http-token-file"), std::string::npos) << refused.status().message();
  open.public_read = true;
  auto public_server = HttpServer::Start(open);
  ASSERT_TRUE(public_server.ok()) << public_server.status().ToString();
  (*public_server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  httplib::Client anyone("127.0.0.1", (*public_server)->port());
  auto res = anyone.Get("/api/state");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

// GET /healthz, what the Kubernetes probes ask (docs/deploy-k8s.md): 503 until the first snapshot,
// 200 while snapshots keep coming, 503 once they stop (a stuck event loop), and no token needed
// beyond loopback, where the kubelet probes from (it shows no data).
TEST(HttpServer, HealthzFollowsTheEventLoopsSnapshots) {
  HttpServerOptions o = LocalOptions("s3cret");
  o.host = "0.0.0.0";
  o.health_stale_ms = 300;
  auto server = HttpServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  httplib::Client web("127.0.0.1", (*server)->port());
  auto starting = web.Get("/healthz");
  ASSERT_TRUE(starting);
  EXPECT_EQ(starting->status, 503);
  EXPECT_NE(starting->body.find("not published"), std::string::npos) << starting->body;

  (*server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  auto ok = web.Get("/healthz");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(ok->body.rfind("ok", 0), 0u) << ok->body;

  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // no snapshot for longer than 300 ms
  auto stale = web.Get("/healthz");
  ASSERT_TRUE(stale);
  EXPECT_EQ(stale->status, 503);
  EXPECT_NE(stale->body.find("event loop"), std::string::npos) << stale->body;

  (*server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  auto again = web.Get("/healthz");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
  auto state = web.Get("/api/state");  // the token still guards the data
  ASSERT_TRUE(state);
  EXPECT_EQ(state->status, 401);
}

// DNS rebinding: a page from another site whose name resolves to 127.0.0.1 still sends its own
// name as Host; a loopback dashboard answers only loopback names.
TEST(HttpServer, LoopbackAnswersOnlyLoopbackHostNames) {
  auto server = HttpServer::Start(LocalOptions());
  ASSERT_TRUE(server.ok());
  (*server)->Publish(std::make_shared<const DashboardSnapshot>(HandMade()));
  const std::string port = std::to_string((*server)->port());
  httplib::Client web("127.0.0.1", (*server)->port());
  for (const std::string& host :
       std::vector<std::string>{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example:" + port, ""}) {
    auto res = web.Get("/api/state", httplib::Headers{{"Host", host}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 403) << "Host: " << host;
    EXPECT_NE(res->body.find("DNS rebinding"), std::string::npos) << res->body;
  }
  for (const std::string& host : std::vector<std::string>{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:8080",
                                                          "[::1]:" + port, "localhost"}) {
    auto res = web.Get("/api/state", httplib::Headers{{"Host", host}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << "Host: " << host << ": " << res->body;
  }
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1") && IsLoopbackHost("127.1.2.3") && IsLoopbackHost("::1") &&
              IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0") || IsLoopbackHost("10.0.0.1") || IsLoopbackHost("::"));
}

TEST(HttpServer, WithoutATokenFileActionsAreOff) {
  auto server = HttpServer::Start({"127.0.0.1", 0, "", "ipc:///tmp/none", std::nullopt});
  ASSERT_TRUE(server.ok());
  httplib::Client web("127.0.0.1", (*server)->port());
  auto res = web.Post("/api/runs/x/cancel", httplib::Headers{{"Authorization", "Bearer "}}, "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 403);
  auto state = web.Get("/api/state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->status, 503) << "nothing published yet";
}

TEST(HttpServer, ATakenPortIsAClearError) {
  auto first = HttpServer::Start({"127.0.0.1", 0, "", "ipc:///tmp/none", std::nullopt});
  ASSERT_TRUE(first.ok());
  auto second = HttpServer::Start({"127.0.0.1", (*first)->port(), "", "ipc:///tmp/none", std::nullopt});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("port is taken"), std::string::npos);
}

}  // namespace
}  // namespace strata::coordinator
