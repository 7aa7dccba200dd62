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
#include <sys/epoll.h>
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
#include <queue>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "client/coordinator_client.h"
#include "common/net.h"
#include "schema/envelope.h"

namespace {

using strata::net::SteadyMs;

// Set by SIGINT / SIGTERM; with the deadline, every loop below checks Stopping().
std::atomic<bool> g_stop{false};
int64_t g_deadline_us = 0;  // 0: none

extern "C" void OnStopSignal(int) { g_stop.store(true); }

int64_t SteadyUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

// ---------------------------------------------------------------- simulated workers
struct SimWorker {
  std::unique_ptr<zmq::socket_t> socket;
  std::string name;
  std::string register_bytes;
  std::string heartbeat_bytes;
  bool registered = false;
  int64_t next_heartbeat_ms = 0;
  int64_t last_register_ms = 0;
};

// What the senders tell the main thread. It lives in a MAP_SHARED mapping: the workers are spread
// over child processes, because each simulated worker costs the sender two descriptors (its
// socket's mailbox and its connection) and a container's hard limit (often 20k) cannot be raised.
struct Shared {
  static constexpr int kMaxAssignments = 256;
  struct Assignment {
    char run_id[128];
    int64_t arrived_us;
  };
  std::atomic<bool> stop{false};
  std::atomic<int64_t> registered{0};
  std::atomic<int64_t> heartbeats_sent{0};
  std::atomic<int64_t> heartbeats_dropped{0};  // EAGAIN on a full pipe: the coordinator is behind
  std::atomic<int64_t> errors_received{0};     // e.g. "unknown worker; register again" after a loss
  std::atomic<int> heartbeat_interval_ms{500};
  std::atomic<int> assignments_claimed{0};
  std::atomic<int> assignments_published{0};  // slots [0, published) are complete
  Assignment assignments[kMaxAssignments];

  void AddAssignment(const std::string& run_id, int64_t arrived_us) {
    const int slot = assignments_claimed.fetch_add(1);
    if (slot >= kMaxAssignments) return;
    snprintf(assignments[slot].run_id, sizeof(assignments[slot].run_id), "%s", run_id.c_str());
    assignments[slot].arrived_us = arrived_us;
    int expected = slot;  // publish in slot order (assignments come one submit at a time)
    while (!assignments_published.compare_exchange_weak(expected, slot + 1)) expected = slot;
  }
  int64_t FindAssignment(const std::string& run_id) const {
    const int published = std::min(assignments_published.load(), kMaxAssignments);
    for (int i = 0; i < published; ++i) {
      if (run_id == assignments[i].run_id) return assignments[i].arrived_us;
    }
    return -1;
  }
};

// One thread owns a slice of the workers and their sockets: it registers them, answers nothing
// but Registered / AssignTask / Error, and sends each one's heartbeat at its own phase of the interval.
class SenderThread {
 public:
  SenderThread(zmq::context_t& context, Shared& shared, std::string endpoint, std::vector<SimWorker> workers)
      : context_(context), shared_(shared), endpoint_(std::move(endpoint)), workers_(std::move(workers)) {}

  void Run() {
    const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    for (size_t i = 0; i < workers_.size(); ++i) {
      auto& w = workers_[i];
      w.socket = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
      w.socket->set(zmq::sockopt::linger, 0);
      w.socket->set(zmq::sockopt::routing_id, w.name);
      w.socket->set(zmq::sockopt::reconnect_ivl, 100);
      w.socket->connect(endpoint_);
      // ZMQ_FD says "look at this socket"; level-triggered, and every send is followed by a drain
      // because a send can consume the signal of a message that arrived meanwhile.
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = i;
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, w.socket->get(zmq::sockopt::fd), &ev);
    }
    std::vector<epoll_event> events(256);
    int64_t last_register_sweep_ms = 0;
    while (!shared_.stop.load(std::memory_order_relaxed)) {
      int64_t now = SteadyMs();
      if (now - last_register_sweep_ms >= 250) {  // (re)registration: rare, a sweep is fine
        last_register_sweep_ms = now;
        for (auto& w : workers_) {
          if (w.registered || now - w.last_register_ms < 2000) continue;
          w.last_register_ms = now;
          Send(w, w.register_bytes);
          Drain(w);
        }
      }
      // Heartbeats in due order: the heap holds (due time, worker) of every registered worker.
      while (!due_.empty() && due_.top().first <= now) {
        const size_t i = due_.top().second;
        due_.pop();
        SimWorker& w = workers_[i];
        if (!w.registered || w.next_heartbeat_ms > now) continue;  // lost, or a stale entry
        const bool sent = Send(w, w.heartbeat_bytes);
        (sent ? shared_.heartbeats_sent : shared_.heartbeats_dropped).fetch_add(1, std::memory_order_relaxed);
        w.next_heartbeat_ms += shared_.heartbeat_interval_ms.load(std::memory_order_relaxed);
        if (w.next_heartbeat_ms <= now) w.next_heartbeat_ms = now + 1;  // we fell behind: do not burst
        due_.emplace(w.next_heartbeat_ms, i);
        Drain(w);
        now = SteadyMs();
      }
      const int64_t next_due = due_.empty() ? now + 20 : due_.top().first;
      const int timeout = static_cast<int>(std::clamp<int64_t>(next_due - SteadyMs(), 0, 20));
      const int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), timeout);
      for (int k = 0; k < n; ++k) Drain(workers_[events[k].data.u64]);
    }
    close(epoll_fd);
    for (auto& w : workers_) w.socket.reset();
  }

 private:
  bool Send(SimWorker& w, const std::string& bytes) {
    try {
      return w.socket->send(strata::net::Buffer(bytes), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void Drain(SimWorker& w) {
    for (;;) {
      // ZMQ_EVENTS processes the socket's pending commands and clears ZMQ_FD's signal.
      if (!(w.socket->get(zmq::sockopt::events) & ZMQ_POLLIN)) return;
      zmq::message_t frame;
      if (!w.socket->recv(frame, zmq::recv_flags::dontwait)) return;
      const int64_t arrived_us = SteadyUs();
      auto decoded = strata::schema::DecodeEnvelope(strata::net::Bytes(frame));
      if (!decoded.ok()) continue;
      auto root = (*decoded)->root();
      switch (root.which()) {
        case Envelope::REGISTERED:
          if (!w.registered) {
            w.registered = true;
            shared_.heartbeat_interval_ms.store(static_cast<int>(root.getRegistered().getHeartbeatIntervalMs()));
            // Phases spread evenly over the interval: worker k of N first beats k/N of it later.
            w.next_heartbeat_ms = SteadyMs() + PhaseOffsetMs(w);
            due_.emplace(w.next_heartbeat_ms, static_cast<size_t>(&w - workers_.data()));
            shared_.registered.fetch_add(1);
          }
          break;
        case Envelope::ASSIGN_TASK:
          shared_.AddAssignment(root.getAssignTask().getRunId().cStr(), arrived_us);
          break;
        case Envelope::ERROR:
          shared_.errors_received.fetch_add(1);
          if (w.registered && std::string(root.getError().getCode().cStr()) == "NotFound") {
            w.registered = false;  // declared lost: register again, as a real worker does
            w.last_register_ms = 0;
            shared_.registered.fetch_sub(1);
          }
          break;
        default:
          break;  // CancelTask and the rest: a simulated worker has no task to stop
      }
    }
  }

  int64_t PhaseOffsetMs(const SimWorker& w) const {
    const size_t index = static_cast<size_t>(std::stoul(w.name.substr(w.name.rfind('-') + 1)));
    const int interval = shared_.heartbeat_interval_ms.load();
    return static_cast<int64_t>(index % 997) * interval / 997;  // spread, independent of the thread split
  }

  zmq::context_t& context_;
  Shared& shared_;
  std::string endpoint_;
  std::vector<SimWorker> workers_;
  using Due = std::pair<int64_t, size_t>;  // (steady ms, index into workers_)
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
};

std::string WorkerName(int i) {
  char name[32];
  snprintf(name, sizeof(name), "sim-%05d", i);
  return name;
}

SimWorker MakeWorker(int i, int workers_per_host, const std::string& state_dir) {
  SimWorker w;
  w.name = WorkerName(i);
  const std::string host = "simhost-" + std::to_string(i / workers_per_host);
  strata::MemorySnapshot memory;
  memory.device = "cpu";
  memory.total_bytes = 64ull << 30;
  memory.free_bytes = (40ull << 30) + static_cast<uint64_t>(i % 97) * (16ull << 20);
  memory.allocated_bytes = (300ull << 20) + static_cast<uint64_t>(i % 13) * (1ull << 20);
  memory.reserved_bytes = memory.allocated_bytes;
  memory.peak_bytes = memory.allocated_bytes + (50ull << 20);
  {
    strata::schema::EnvelopeBuilder msg;
    auto r = msg.root().initRegisterWorker();
    r.setName(w.name);
    r.setHost(host);
    r.setPid(static_cast<uint32_t>(100000 + i));
    strata::schema::WriteMemoryStats(memory, r.initMemory());
    r.setStorePath(state_dir + "/stores/" + w.name);
    r.setDataAddress("ipc://" + state_dir + "/data-" + w.name);
    r.initStoredCheckpoints(0);
    r.setStoredCheckpointsKnown(true);
    w.register_bytes = msg.Serialize();
  }
  {
    // Heartbeats are encoded once per worker: the coordinator's cost is what we measure, and
    // re-encoding 20k messages a second would only take CPU from it on a small machine.
    strata::schema::EnvelopeBuilder msg;
    auto hb = msg.root().initHeartbeat();
    hb.setWorkerId(w.name);
    strata::schema::WriteMemoryStats(memory, hb.initMemory());
    w.heartbeat_bytes = msg.Serialize();
  }
  return w;
}

// ---------------------------------------------------------------- measurements
struct Percentiles {
  double p50 = NAN, p99 = NAN, max = NAN;
  size_t count = 0;
};

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  p.count = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1)];
  };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  p.max = v.back();
  return p;
}

struct BenchResult {
  int workers = 0;
  bool all_registered = false;
  double register_s = 0;
  double window_s = 0;
  double cpu_fraction = 0;
  double bench_cpu_fraction = 0;
  int64_t rss_kb = 0, hwm_kb = 0;
  double heartbeats_per_s = 0;
  int64_t heartbeats_dropped = 0;
  int64_t errors = 0;
  Percentiles loop_delay_ms;
  int64_t probe_failures = 0;
  Percentiles submit_ms;
  std::string submit_error;
  Percentiles workers_request_ms;
  size_t workers_reply_bytes = 0;
  int64_t workers_live = 0;
  Percentiles cli_workers_ms;
  Percentiles api_state_ms;
  size_t api_state_bytes = 0;
  bool partial = false;  // stopped early (deadline or signal): what was measured until then
  // One per full minute of the window: the coordinator's RSS, that minute's loop delay and a
  // GET /api/state (ms, bytes; NaN / 0 without the dashboard).
  struct Minute {
    int64_t rss_kb = 0;
    Percentiles loop_delay_ms;
    double api_state_ms = NAN;
    size_t api_state_bytes = 0;
  };
  std::vector<Minute> minutes;
};

std::string Fmt(double v, int digits = 2) {
  if (std::isnan(v)) return "-";
  char buf[64];
  snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Json(const BenchResult& r) {
  auto pct = [](const Percentiles& p) {
    return "{\"p50\":" + (std::isnan(p.p50) ? std::string("null") : Fmt(p.p50, 3)) +
           ",\"p99\":" + (std::isnan(p.p99) ? std::string("null") : Fmt(p.p99, 3)) +
           ",\"max\":" + (std::isnan(p.max) ? std::string("null") : Fmt(p.max, 3)) +
           ",\"n\":" + std::to_string(p.count) + "}";
  };
  std::ostringstream o;
  o << "{\"workers\":" << r.workers << ",\"all_registered\":" << (r.all_registered ? "true" : "false")
    << ",\"register_s\":" << Fmt(r.register_s, 2) << ",\"window_s\":" << Fmt(r.window_s, 1)
    << ",\"coordinator_cpu_cores\":" << Fmt(r.cpu_fraction, 3)
    << ",\"bench_cpu_cores\":" << Fmt(r.bench_cpu_fraction, 3)
    << ",\"vmrss_mib\":" << Fmt(static_cast<double>(r.rss_kb) / 1024, 1)
    << ",\"vmhwm_mib\":" << Fmt(static_cast<double>(r.hwm_kb) / 1024, 1)
    << ",\"heartbeats_per_s\":" << Fmt(r.heartbeats_per_s, 0) << ",\"heartbeats_dropped\":" << r.heartbeats_dropped
    << ",\"errors_to_workers\":" << r.errors << ",\"loop_delay_ms\":" << pct(r.loop_delay_ms)
    << ",\"probe_failures\":" << r.probe_failures << ",\"submit_to_assign_ms\":" << pct(r.submit_ms)
    << ",\"workers_request_ms\":" << pct(r.workers_request_ms) << ",\"workers_reply_bytes\":" << r.workers_reply_bytes
    << ",\"workers_live\":" << r.workers_live << ",\"cli_workers_ms\":" << pct(r.cli_workers_ms)
    << ",\"api_state_ms\":" << pct(r.api_state_ms) << ",\"api_state_bytes\":" << r.api_state_bytes;
  if (!r.submit_error.empty()) o << ",\"submit_error\":\"" << r.submit_error << "\"";
  o << ",\"partial\":" << (r.partial ? "true" : "false") << ",\"minutes\":[";
  for (size_t i = 0; i < r.minutes.size(); ++i) {
    const auto& m = r.minutes[i];
    o << (i ? "," : "") << "{\"vmrss_mib\":" << Fmt(static_cast<double>(m.rss_kb) / 1024, 1)
      << ",\"loop_delay_ms\":" << pct(m.loop_delay_ms)
      << ",\"api_state_ms\":" << (std::isnan(m.api_state_ms) ? std::string("null") : Fmt(m.api_state_ms, 1))
      << ",\"api_state_bytes\":" << m.api_state_bytes << "}";
  }
  o << "]}";
  return o.str();
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
      zmq::context_t context;
      context.set(zmq::ctxopt::max_sockets, opt.workers_per_process + 64);
      context.set(zmq::ctxopt::io_threads, 1);
      std::vector<std::vector<SimWorker>> slices(static_cast<size_t>(opt.sender_threads));
      for (int i = p; i < n; i += processes) {
        slices[static_cast<size_t>((i / processes) % opt.sender_threads)].push_back(
            MakeWorker(i, opt.workers_per_host, dir));
      }
      std::vector<std::unique_ptr<SenderThread>> threads_of_slices;
      std::vector<std::thread> threads;
      for (auto& slice : slices) {
        threads_of_slices.push_back(std::make_unique<SenderThread>(context, shared, endpoint, std::move(slice)));
        threads.emplace_back([s = threads_of_slices.back().get()] { s->Run(); });
      }
      for (auto& t : threads) t.join();
      threads_of_slices.clear();
      context.close();
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
                "N=%d minute %zu: RSS %.0f MiB, loop delay p50 %s / p99 %s ms, GET /api/state %s ms (%zu bytes)\n", n,
                result.minutes.size(), static_cast<double>(m.rss_kb) / 1024, Fmt(m.loop_delay_ms.p50).c_str(),
                Fmt(m.loop_delay_ms.p99).c_str(), Fmt(m.api_state_ms, 1).c_str(), m.api_state_bytes);
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
          "       [--warmup-seconds 3] [--sender-threads 2] [--workers-per-process 4000] [--probe-hz 10] [--submits 5] "
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
  printf(
      "\n| workers | coord CPU (cores) | bench CPU | VmRSS / VmHWM MiB | heartbeats/s | loop delay p50 / p99 ms | "
      "submit->assign p50 / max ms | workersRequest ms | `strata workers` ms | GET /api/state ms (bytes) |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : results) {
    printf("| %d%s%s | %s | %s | %s / %s | %s | %s / %s | %s / %s | %s (%zu live) | %s | %s (%zu) |\n", r.workers,
           r.all_registered ? "" : " (not all registered)", r.partial ? " (partial)" : "",
           Fmt(r.cpu_fraction, 3).c_str(), Fmt(r.bench_cpu_fraction, 2).c_str(),
           Fmt(static_cast<double>(r.rss_kb) / 1024, 0).c_str(), Fmt(static_cast<double>(r.hwm_kb) / 1024, 0).c_str(),
           Fmt(r.heartbeats_per_s, 0).c_str(), Fmt(r.loop_delay_ms.p50).c_str(), Fmt(r.loop_delay_ms.p99).c_str(),
           Fmt(r.submit_ms.p50).c_str(), Fmt(r.submit_ms.max).c_str(), Fmt(r.workers_request_ms.p50, 1).c_str(),
           static_cast<size_t>(r.workers_live), Fmt(r.cli_workers_ms.p50, 0).c_str(),
           Fmt(r.api_state_ms.p50, 1).c_str(), r.api_state_bytes);
  }
  return g_stop.load() ? 130 : 0;
}
