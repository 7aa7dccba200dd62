// Control-plane scale (issue #25, item 5): N simulated workers speak the real protocol (ZeroMQ
// DEALER sockets, Cap'n Proto envelopes, as worker/worker.cc does) to a real strata-coordinator
// process on loopback (ipc://), and we measure what a large cluster costs the coordinator:
//
//   cpu          coordinator utime+stime (/proc/PID/stat) over a steady-state window in which every
//                worker heartbeats at the interval the coordinator asked for, as a fraction of one core
//   rss / hwm    coordinator VmRSS and VmHWM (/proc/PID/status) at the end of that window
//   loop delay   heartbeats carry no reply, so we time what a heartbeat waits behind: the round trip
//                of a cheap request (statusRequest of an unknown run id -> NotFound, no store read)
//                sent through the same ROUTER socket and event loop at --probe-hz while every
//                heartbeat flows. It is an upper bound on how long a heartbeat waits to be handled.
//   submit       submitRun with the client library -> the AssignTask envelope arriving at the
//                simulated worker chosen (a dp = 1 train run on a byte file); the run is then cancelled
//   listing      workersRequest round trip with N workers; the real `strata workers` command; the
//                dashboard's GET /api/state (coordinator started with --http)
//
// usage: control_plane_bench --coordinator build/bin/strata-coordinator --workers 1000,5000,10000 --seconds 20
// Prints one JSON line per N, then a table; during a window, a line a minute on stderr (the
// coordinator's RSS, that minute's loop delay, a GET /api/state). It ends by itself: past
// --deadline-s (default: what every N should take, twice) or on SIGINT / SIGTERM it stops where it
// is and prints what it measured so far, marked partial; every process it started dies with it
// (PR_SET_PDEATHSIG, even when it is killed). The bench itself runs on the same machine: its
// heartbeat senders take CPU too (reported as bench_cpu), which matters on a small box.
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/control_plane_report.h"
#include "bench/control_plane_sim.h"
#include "client/coordinator_client.h"
#include "common/net.h"
#include "schema/envelope.h"

namespace {

using namespace cpbench;
using strata::net::SteadyMs;

// Set by SIGINT / SIGTERM; with the deadline, every loop below checks Stopping().
std::atomic<bool> g_stop{false};
int64_t g_deadline_us = 0;  // 0: none

extern "C" void OnStopSignal(int) { g_stop.store(true); }

bool Stopping() { return g_stop.load() || (g_deadline_us > 0 && SteadyUs() > g_deadline_us); }

// In a forked child: die with this process, however it ends.
void DieWithParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // it ended before the call above
}

// Sleeps up to `ms`, in slices, returning early once Stopping().
void SleepUnlessStopping(int64_t ms) {
  const int64_t end = SteadyUs() + ms * 1000;
  while (!Stopping() && SteadyUs() < end) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

struct Options {
  std::string coordinator = "build/bin/strata-coordinator";
  std::string cli;  // default: strata beside the coordinator
  std::vector<int> worker_counts = {1000, 5000, 10000};
  int seconds = 20;
  int warmup_seconds = 3;
  int sender_threads = 2;          // per sender process
  int workers_per_process = 4000;  // each costs the sender ~2 descriptors
  int probe_hz = 10;
  int poll_ms = 1000;  // an open dashboard page's GET /api/state, every poll_ms (0: none)
  int submits = 5;
  int listings = 5;
  int workers_per_host = 8;
  int http_port = 18765;
  std::string work_dir;
  bool http = true;      // --no-http: start the coordinator without a dashboard (no /api/state)
  std::string perf_dir;  // non-empty: `perf record -g` the coordinator over the steady window
  int deadline_s = 0;    // 0: twice what the worker counts should take
};

// ---------------------------------------------------------------- the coordinator process
struct ProcessSample {
  double cpu_seconds = 0;  // utime + stime
  int64_t rss_kb = 0, hwm_kb = 0;
};

ProcessSample SampleProcess(pid_t pid) {
  ProcessSample s;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) stime = std::stoll(field);
    }
    s.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::stoll(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) s.hwm_kb = std::stoll(line.substr(6));
  }
  return s;
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    DieWithParent(parent);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Raises the open-file limit (hard too when we may) so the coordinator, which inherits it, can
// hold one ipc connection per worker; returns the soft limit now in force.
rlim_t RaiseFileLimit(rlim_t wanted) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_max < wanted) {
    rlimit raised{wanted, wanted};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return wanted;
  }
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  setrlimit(RLIMIT_NOFILE, &limit);
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

// A dp = 1 train run of a tiny GPT-2 on a byte file: valid, so the coordinator plans and assigns it.
std::string SubmitSpec(const std::string& data_path, int index) {
  return "name = \"cpbench-" + std::to_string(index) +
         "\"\n[model]\nfamily = \"gpt2\"\nlayers = 2\nhidden = 128\nheads = 4\nvocab = 256\nsequence = 128\n"
         "[data]\npath = \"" +
         data_path +
         "\"\nformat = \"bytes\"\n"
         "[train]\nsteps = 10\nglobal_batch = 4\nlr = 1e-3\n[parallel]\ndp = 1\npp = 1\ntp = 1\n[worker]\nthreads = "
         "1\n";
}

BenchResult RunOne(const Options& opt, int n) {
  BenchResult result;
  result.workers = n;
  const std::string dir = opt.work_dir + "/n" + std::to_string(n);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/state");
  const std::string endpoint = "ipc://" + dir + "/coordinator.sock";
  const int http_port = opt.http_port;
  std::vector<std::string> coordinator_argv = {opt.coordinator, "--listen", endpoint, "--state-dir", dir + "/state"};
  if (opt.http) {
    coordinator_argv.push_back("--http");
    coordinator_argv.push_back("127.0.0.1:" + std::to_string(http_port));
  }
  const pid_t coordinator = Spawn(coordinator_argv, dir + "/coordinator.log");
  // Wait until it answers.
  {
    strata::client::CoordinatorClient probe(endpoint, 500);
    for (int i = 0; i < 100 && !Stopping(); ++i) {
      strata::schema::EnvelopeBuilder req;
      req.root().initStatusRequest().setLastLossOnly(true);
      if (probe.Call(req).ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // Shared state in a shared mapping, then the sender processes: forked before this process
  // starts any ZeroMQ or HTTP thread.
  void* mapping = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  Shared& shared = *new (mapping) Shared();
  const int processes = (n + opt.workers_per_process - 1) / opt.workers_per_process;
  std::vector<pid_t> senders;
  const int64_t register_start = SteadyMs();
  const pid_t parent = getpid();
  for (int p = 0; p < processes && !Stopping(); ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      DieWithParent(parent);
      RunSenderProcess(p, processes, n, {opt.sender_threads, opt.workers_per_process, opt.workers_per_host}, shared,
                       endpoint, dir);
      _exit(0);
    }
    senders.push_back(pid);
  }
  auto senders_cpu = [&] {
    double total = 0;
    for (pid_t pid : senders) total += SampleProcess(pid).cpu_seconds;
    return total;
  };
  while (shared.registered.load() < n && SteadyMs() - register_start < 120000 && !Stopping())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  result.register_s = static_cast<double>(SteadyMs() - register_start) / 1000;
  result.all_registered = shared.registered.load() >= n;
  fprintf(stderr, "N=%d: %lld registered in %.1f s; warming up %d s\n", n,
          static_cast<long long>(shared.registered.load()), result.register_s, opt.warmup_seconds);
  SleepUnlessStopping(int64_t{opt.warmup_seconds} * 1000);

  // ---- steady window: CPU, memory, event-loop delay (probe round trips)
  pid_t perf = -1;
  if (!opt.perf_dir.empty()) {
    // Recorded until the listings are done (SIGINT): the window, the submits and the listings.
    perf = Spawn({"/usr/bin/perf", "record", "-g", "-p", std::to_string(coordinator), "-o",
                  opt.perf_dir + "/coordinator-n" + std::to_string(n) + ".data"},
                 opt.perf_dir + "/perf-n" + std::to_string(n) + ".log");
  }
  const ProcessSample before = SampleProcess(coordinator);
  const double bench_before = SelfCpuSeconds() + senders_cpu();
  const int64_t sent_before = shared.heartbeats_sent.load();
  const int64_t dropped_before = shared.heartbeats_dropped.load();
  const int64_t errors_before = shared.errors_received.load();
  const int64_t window_start_us = SteadyUs();
  std::vector<double> delays;
  // An open dashboard tab through the window: its GET /api/state (first page of workers) every
  // --poll-ms, timed; each minute's line summarises them.
  std::mutex poll_mu;
  std::vector<double> polls;  // guarded by poll_mu
  std::atomic<bool> poll_stop{false};
  std::thread poller;
  if (opt.http && opt.poll_ms > 0) {
    poller = std::thread([&] {
      httplib::Client http("127.0.0.1", http_port);
      http.set_read_timeout(60, 0);
      while (!poll_stop.load() && !Stopping()) {
        const int64_t t0 = SteadyUs();
        if (auto r = http.Get("/api/state?workers_offset=0&workers_limit=100"); r && r->status == 200) {
          std::lock_guard<std::mutex> lock(poll_mu);
          polls.push_back(static_cast<double>(SteadyUs() - t0) / 1000);
        }
        for (int64_t end = t0 + int64_t{opt.poll_ms} * 1000; SteadyUs() < end && !poll_stop.load() && !Stopping();)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  size_t poll_minute_begin = 0;
  {
    strata::client::CoordinatorClient probe(endpoint, 5000);
    const int64_t period_us = 1000000 / std::max(1, opt.probe_hz);
    int64_t next_us = window_start_us;
    size_t minute_begin = 0;  // delays[minute_begin..] are this minute's
    while (SteadyUs() - window_start_us < int64_t{opt.seconds} * 1000000 && !Stopping()) {
      if (SteadyUs() - window_start_us >= static_cast<int64_t>(result.minutes.size() + 1) * 60000000) {
        BenchResult::Minute m;
        m.rss_kb = SampleProcess(coordinator).rss_kb;
        m.loop_delay_ms =
            Summarize(std::vector<double>(delays.begin() + static_cast<std::ptrdiff_t>(minute_begin), delays.end()));
        minute_begin = delays.size();
        {
          std::lock_guard<std::mutex> lock(poll_mu);
          m.poll_ms = Summarize(
              std::vector<double>(polls.begin() + static_cast<std::ptrdiff_t>(poll_minute_begin), polls.end()));
          poll_minute_begin = polls.size();
        }
        if (opt.http) {
          httplib::Client http("127.0.0.1", http_port);
          http.set_read_timeout(60, 0);
          const int64_t t0 = SteadyUs();
          if (auto response = http.Get("/api/state"); response && response->status == 200) {
            m.api_state_ms = static_cast<double>(SteadyUs() - t0) / 1000;
            m.api_state_bytes = response->body.size();
          }
          next_us = SteadyUs();  // the probes resume after the listing
        }
        result.minutes.push_back(m);
        fprintf(stderr,
                "N=%d minute %zu: RSS %.0f MiB, loop delay p50 %s / p99 %s ms, GET /api/state %s ms (%zu bytes), "
                "dashboard polls p50 %s / max %s ms\n",
                n, result.minutes.size(), static_cast<double>(m.rss_kb) / 1024, Fmt(m.loop_delay_ms.p50).c_str(),
                Fmt(m.loop_delay_ms.p99).c_str(), Fmt(m.api_state_ms, 1).c_str(), m.api_state_bytes,
                Fmt(m.poll_ms.p50, 1).c_str(), Fmt(m.poll_ms.max, 1).c_str());
      }
      next_us += period_us;
      strata::schema::EnvelopeBuilder req;
      req.root().initStatusRequest().setRunId("cpbench-no-such-run");  // NotFound, answered from memory
      const int64_t t0 = SteadyUs();
      auto reply = probe.Call(req);
      const int64_t t1 = SteadyUs();
      if (reply.ok() || reply.status().code() == strata::StatusCode::kNotFound) {
        delays.push_back(static_cast<double>(t1 - t0) / 1000);
      } else {
        ++result.probe_failures;
      }
      const int64_t sleep_us = next_us - SteadyUs();
      if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }
  poll_stop.store(true);
  if (poller.joinable()) poller.join();
  const double window_s = static_cast<double>(SteadyUs() - window_start_us) / 1e6;
  const ProcessSample after = SampleProcess(coordinator);
  result.window_s = window_s;
  result.cpu_fraction = (after.cpu_seconds - before.cpu_seconds) / window_s;
  result.bench_cpu_fraction = (SelfCpuSeconds() + senders_cpu() - bench_before) / window_s;
  result.rss_kb = after.rss_kb;
  result.hwm_kb = after.hwm_kb;
  result.heartbeats_per_s = static_cast<double>(shared.heartbeats_sent.load() - sent_before) / window_s;
  result.heartbeats_dropped = shared.heartbeats_dropped.load() - dropped_before;
  result.errors = shared.errors_received.load() - errors_before;
  result.loop_delay_ms = Summarize(delays);

  // ---- submit -> AssignTask at a simulated worker, then cancel so the worker is idle again
  {
    strata::client::CoordinatorClient client(endpoint, 30000);
    std::vector<double> latencies;
    for (int i = 0; i < opt.submits && !Stopping(); ++i) {
      strata::schema::EnvelopeBuilder req;
      req.root().initSubmitRun().setSpecToml(SubmitSpec("/usr/share/common-licenses/GPL-3", i));
      const int64_t t0 = SteadyUs();
      auto reply = client.Call(req);
      if (!reply.ok()) {
        result.submit_error = reply.status().message();
        break;
      }
      const std::string run_id = (*reply)->root().getSubmitted().getRunId().cStr();
      int64_t arrived = -1;
      while (arrived < 0 && SteadyUs() - t0 < 10000000) {
        arrived = shared.FindAssignment(run_id);
        if (arrived < 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (arrived < 0) {
        result.submit_error = "no AssignTask for " + run_id + " within 10 s";
        break;
      }
      latencies.push_back(static_cast<double>(arrived - t0) / 1000);
      strata::schema::EnvelopeBuilder cancel;
      cancel.root().initCancelRun().setRunId(run_id);
      (void)client.Call(cancel);
    }
    result.submit_ms = Summarize(latencies);
  }

  // ---- listings: workersRequest, `strata workers`, GET /api/state
  {
    strata::client::CoordinatorClient client(endpoint, 60000);
    std::vector<double> times;
    for (int i = 0; i < opt.listings && !Stopping(); ++i) {
      strata::schema::EnvelopeBuilder req;
      req.root().setWorkersRequest();
      const int64_t t0 = SteadyUs();
      auto reply = client.Call(req);
      const int64_t t1 = SteadyUs();
      if (!reply.ok()) continue;
      times.push_back(static_cast<double>(t1 - t0) / 1000);
      int64_t live = 0;
      for (auto w : (*reply)->root().getWorkersReply().getWorkers()) live += w.getState() != WorkerState::LOST;
      result.workers_live = live;
      result.workers_reply_bytes = (*reply)->root().totalSize().wordCount * 8;
    }
    result.workers_request_ms = Summarize(times);
  }
  {
    std::vector<double> times;
    for (int i = 0; i < std::min(opt.listings, 3) && !Stopping(); ++i) {
      const int64_t t0 = SteadyUs();
      const pid_t cli =
          Spawn({opt.cli, "--cluster", endpoint, "--timeout-ms", "60000", "workers"}, dir + "/cli-workers.out");
      int status = 0;
      waitpid(cli, &status, 0);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) times.push_back(static_cast<double>(SteadyUs() - t0) / 1000);
    }
    result.cli_workers_ms = Summarize(times);
  }
  if (opt.http) {
    httplib::Client http("127.0.0.1", http_port);
    http.set_read_timeout(60, 0);
    std::vector<double> times;
    for (int i = 0; i < opt.listings && !Stopping(); ++i) {
      const int64_t t0 = SteadyUs();
      auto response = http.Get("/api/state");
      const int64_t t1 = SteadyUs();
      if (!response || response->status != 200) continue;
      times.push_back(static_cast<double>(t1 - t0) / 1000);
      result.api_state_bytes = response->body.size();
    }
    result.api_state_ms = Summarize(times);
  }

  result.partial = Stopping();
  if (perf > 0) {
    kill(perf, SIGINT);
    waitpid(perf, nullptr, 0);
  }
  shared.stop.store(true);
  for (pid_t pid : senders) {  // they stop at the flag; a stuck one is killed after 10 s
    int waited = 0;
    while (waitpid(pid, nullptr, WNOHANG) == 0 && waited++ < 200)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (waited > 200) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  munmap(mapping, sizeof(Shared));
  kill(coordinator, SIGTERM);
  int status = 0;
  for (int i = 0; i < 100 && waitpid(coordinator, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (waitpid(coordinator, &status, WNOHANG) == 0) {
    kill(coordinator, SIGKILL);
    waitpid(coordinator, &status, 0);
  }
  return result;
}

std::vector<int> ParseCounts(const std::string& list) {
  std::vector<int> counts;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) counts.push_back(std::stoi(item));
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", arg.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (arg == "--coordinator")
      opt.coordinator = value();
    else if (arg == "--cli")
      opt.cli = value();
    else if (arg == "--workers")
      opt.worker_counts = ParseCounts(value());
    else if (arg == "--seconds")
      opt.seconds = std::stoi(value());
    else if (arg == "--warmup-seconds")
      opt.warmup_seconds = std::stoi(value());
    else if (arg == "--sender-threads")
      opt.sender_threads = std::max(1, std::stoi(value()));
    else if (arg == "--workers-per-process")
      opt.workers_per_process = std::max(1, std::stoi(value()));
    else if (arg == "--poll-ms")
      opt.poll_ms = std::stoi(value());
    else if (arg == "--probe-hz")
      opt.probe_hz = std::stoi(value());
    else if (arg == "--submits")
      opt.submits = std::stoi(value());
    else if (arg == "--listings")
      opt.listings = std::stoi(value());
    else if (arg == "--http-port")
      opt.http_port = std::stoi(value());
    else if (arg == "--work-dir")
      opt.work_dir = value();
    else if (arg == "--perf-dir")
      opt.perf_dir = value();
    else if (arg == "--no-http")
      opt.http = false;
    else if (arg == "--deadline-s")
      opt.deadline_s = std::stoi(value());
    else {
      fprintf(
          stderr,
          "usage: control_plane_bench [--coordinator PATH] [--cli PATH] [--workers 1000,5000,10000] [--seconds 20]\n"
          "       [--warmup-seconds 3] [--sender-threads 2] [--workers-per-process 4000] [--probe-hz 10] [--poll-ms "
          "1000] [--submits 5] "
          "[--listings 5]\n"
          "       [--http-port 18765] [--work-dir DIR] [--no-http] [--perf-dir DIR (perf record -g the coordinator's "
          "window)]\n"
          "       [--deadline-s S (stop and print what was measured; default twice the expected time)]\n");
      return 2;
    }
  }
  opt.coordinator = std::filesystem::absolute(opt.coordinator).string();
  if (opt.cli.empty()) opt.cli = (std::filesystem::path(opt.coordinator).parent_path() / "strata").string();
  if (opt.work_dir.empty()) opt.work_dir = "/tmp/strata-cpbench-" + std::to_string(getpid());
  std::filesystem::create_directories(opt.work_dir);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction stop {};
  stop.sa_handler = OnStopSignal;
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
  // Per N: up to 120 s to register, the warm-up and the window, and a minute for the rest.
  int64_t expected_s = 0;
  for (size_t i = 0; i < opt.worker_counts.size(); ++i) expected_s += 120 + opt.warmup_seconds + opt.seconds + 60;
  g_deadline_us = SteadyUs() + (opt.deadline_s > 0 ? int64_t{opt.deadline_s} : 2 * expected_s) * 1000000;
  const int max_workers = *std::max_element(opt.worker_counts.begin(), opt.worker_counts.end());
  const rlim_t files = RaiseFileLimit(static_cast<rlim_t>(max_workers) * 4 + 4096);
  fprintf(stderr, "open-file limit %llu; work dir %s\n", static_cast<unsigned long long>(files), opt.work_dir.c_str());

  std::vector<BenchResult> results;
  for (int n : opt.worker_counts) {
    results.push_back(RunOne(opt, n));
    printf("%s\n", Json(results.back()).c_str());
    fflush(stdout);
    if (Stopping()) {
      fprintf(stderr, "%s: stopped after N=%d; what was measured is above\n",
              g_stop.load() ? "interrupted" : "past --deadline-s", n);
      break;
    }
  }
  PrintTable(results);
  return g_stop.load() ? 130 : 0;
}
