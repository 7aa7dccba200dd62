// The dashboard's renderers on a hand-made snapshot (exact Prometheus text and JSON), and the HTTP
// server wired to a real coordinator (its own thread, real ipc + TCP sockets, real RocksDB): what
// /api/state shows follows the coordinator, and cancel needs the bearer token.
#include "coordinator/dashboard.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/net.h"
#include "coordinator/client.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_server.h"

namespace strata::coordinator {
namespace {

using json = nlohmann::json;

DashboardSnapshot HandMade() {
  DashboardSnapshot s;
  s.unix_ms = 1700000000000;
  s.endpoint = "ipc:///tmp/x.sock";
  s.workers_lost_total = 1;
  s.checkpoints_total = 3;
  s.run_workers_lost_total = 1;
  s.workers.push_back({"worker-0", "host-a", 42, "busy", "cuda:0", 80ull << 30, 60ull << 30, 12ull << 30,
                       15ull << 30, 250, "r1"});
  s.workers.push_back({"worker-\"1\"", "host-a", 43, "lost", "cpu", 0, 0, 0, 0, 4500, ""});
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
  s.runs.push_back(r);
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
  EXPECT_NE(text.find("strata_worker_memory_used_bytes{worker=\"worker-0\",device=\"cuda:0\"} 21474836480\n"), std::string::npos);
  EXPECT_NE(text.find("strata_worker_heartbeat_age_seconds{worker=\"worker-0\",device=\"cuda:0\"} 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("strata_worker_up{worker=\"worker-\\\"1\\\"\",device=\"cpu\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("strata_workers{state=\"busy\"} 1\nstrata_workers{state=\"idle\"} 0\nstrata_workers{state=\"lost\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("strata_run_loss{run=\"r1\",name=\"tiny\"} 3.125\n"), std::string::npos);
  EXPECT_NE(text.find("strata_run_step{run=\"r1\",name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("strata_run_tokens_per_second{run=\"r1\",name=\"tiny\"} 500\n"), std::string::npos);
  EXPECT_EQ(text.find("run=\"r0\""), std::string::npos) << "finished runs get no per-run series";
  EXPECT_NE(text.find("strata_runs{state=\"finished\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("strata_runs{state=\"running\"} 1\n"), std::string::npos);
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
  ASSERT_EQ(j["runs"].size(), 2u);
  const json& r = j["runs"][0];
  EXPECT_EQ(r["state"], "running");
  EXPECT_EQ(r["step"], 3);
  EXPECT_EQ(r["total_steps"], 10);
  EXPECT_EQ(r["loss"], 3.125);
  EXPECT_EQ(r["loss_points"], json::parse("[[1,5.5],[2,4.25],[3,3.125]]"));
  EXPECT_DOUBLE_EQ(r["eta_seconds"].get<double>(), 7 * 1000 / 500.0);  // 7 steps x 1000 tokens at 500 tok/s
  ASSERT_EQ(r["events"].size(), 2u);
  EXPECT_EQ(r["events"][1]["kind"], "checkpoint");
  EXPECT_TRUE(j["runs"][1]["eta_seconds"].is_null()) << "no ETA for a finished run";
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
  submit.root().initSubmitRun().setSpecToml("name = \"t\"\n[model]\nhidden = 32\nheads = 2\nsequence = 16\n[data]\npath = \"" +
                                            dir + "/corpus.txt\"\n[train]\nsteps = 3\nglobal_batch = 2\n");
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
  for (int i = 0; i < 20 && (state = run_state()) != "cancelled"; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(state, "cancelled");
  auto again = web.Post(path, httplib::Headers{{"Authorization", "Bearer s3cret"}}, "", "text/plain");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409) << "cancelling a cancelled run is a conflict: " << again->body;
  auto unknown = web.Post("/api/runs/nope/cancel", httplib::Headers{{"Authorization", "Bearer s3cret"}}, "", "text/plain");
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
