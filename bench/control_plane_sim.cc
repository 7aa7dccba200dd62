#include "bench/control_plane_sim.h"

#include <sys/epoll.h>

#include <algorithm>
#include <memory>
#include <queue>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/net.h"
#include "schema/envelope.h"

namespace cpbench {
namespace {

using strata::net::SteadyMs;

struct SimWorker {
  std::unique_ptr<zmq::socket_t> socket;
  std::string name;
  std::string register_bytes;
  std::string heartbeat_bytes;
  bool registered = false;
  int64_t next_heartbeat_ms = 0;
  int64_t last_register_ms = 0;
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

}  // namespace

void RunSenderProcess(int process, int processes, int workers, const SenderOptions& options, Shared& shared,
                      const std::string& endpoint, const std::string& state_dir) {
  zmq::context_t context;
  context.set(zmq::ctxopt::max_sockets, options.workers_per_process + 64);
  context.set(zmq::ctxopt::io_threads, 1);
  std::vector<std::vector<SimWorker>> slices(static_cast<size_t>(options.threads));
  for (int i = process; i < workers; i += processes) {
    slices[static_cast<size_t>((i / processes) % options.threads)].push_back(
        MakeWorker(i, options.workers_per_host, state_dir));
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
}

}  // namespace cpbench
