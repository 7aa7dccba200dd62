// The coordinator's event loop: one thread, one ROUTER socket, one poll loop that feeds each message
// to the CoordinatorCore (core.h: the rooms, wired) and turns its timer queue. The rooms:
//   WorkerRegistry     register, heartbeat, lost (worker_registry.h)
//   Admission          pending runs onto idle workers (admission.h)
//   TrainRun           the train-run state machine (train_run.h)
//   ExtractScheduler   extract runs, by chunk (extract_scheduler.h)
//   CheckpointCommitter shard reports, cross-host copies, commits, retention (checkpoint_committer.h)
//   Journal            the metadata store's keys and writes (journal.h)
//   RpcHandlers        decode, call one room, encode (rpc_handlers.h)
//   DashboardPublisher snapshots for the HTTP thread (dashboard_publisher.h)
// Every handler and timer runs to completion on this thread, so no state needs a lock.
#include "coordinator/coordinator.h"

#include <malloc.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/log.h"
#include "common/net.h"
#include "common/thread_annotations.h"
#include "coordinator/clock.h"
#include "coordinator/core.h"
#include "schema/envelope.h"

namespace strata::coordinator {
namespace {

constexpr int kDrainBatch = 256;

// Gives the allocator's free pages back to the system once a minute, on a thread of its own (it
// walks every arena under their locks, never the loop's state). ZeroMQ's I/O thread holds each
// received message in an 8 KiB batch buffer, so a second in which the loop falls behind 20,000
// heartbeats leaves ~160 MiB free but mapped, and glibc keeps it: without this the
// coordinator's RSS is the high-water mark of every burst, not what it holds.
class MemoryTrimmer {
 public:
  MemoryTrimmer()
      : thread_([this] {
          MutexLock lock(mutex_);
          while (!wake_.WaitFor(lock, std::chrono::seconds(60), [this]() STRATA_REQUIRES(mutex_) { return stop_; })) {
            lock.Unlock();
            malloc_trim(0);
            lock.Lock();
          }
        }) {}
  ~MemoryTrimmer() {
    {
      MutexLock lock(mutex_);
      stop_ = true;
    }
    wake_.NotifyAll();
    thread_.join();
  }

 private:
  Mutex mutex_;
  CondVar wake_;
  bool stop_ STRATA_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: it starts once the members above exist
};

class CoordinatorImpl final : public Coordinator, private Outbox {
 public:
  CoordinatorImpl(CoordinatorOptions options, std::unique_ptr<storage::ShardStore> store)
      : options_(std::move(options)),
        core_(options_, options_.clock ? *options_.clock : SystemClock::Get(), std::move(store), *this,
              [this] { stop_requested_.store(true); }),
        router_(context_, zmq::socket_type::router) {}

  Status Init() {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::router_handover, 1);   // a restarted worker takes over its routing id
    router_.set(zmq::sockopt::router_mandatory, 1);  // sends to a vanished peer fail instead of vanishing
    STRATA_RETURN_IF_ERROR(SetUpCurve());
    try {
      router_.bind(options_.listen);
    } catch (const zmq::error_t& e) {
      return Unavailable("cannot listen on " + options_.listen + ": " + e.what() +
                         "; is another coordinator running there? (`strata down` stops it)");
    }
    return core_.Load();
  }

  void RequestStop() override { stop_requested_.store(true); }

  Status Run() override {
    STRATA_LOG(kInfo) << "coordinator listening on " << options_.listen << " with " << core_.cluster().runs.size()
                      << " runs loaded";
    if (options_.on_ready) options_.on_ready(core_.Summary());
    std::vector<zmq::message_t> frames;
    MemoryTrimmer trimmer;
    while (!stop_requested_.load()) {
      // Handshakes wait on ZAP answers, so this thread serves them while it waits for messages.
      // What is queued is drained in one go (at most kDrainBatch, then the timers): 10,000
      // workers send 20,000 heartbeats a second, and a poll per message cost more than the message
      // (the ZAP socket waits for the batch: a handshake waits at most kDrainBatch messages).
      if (curve::PollWithZap(router_, zap_.get(), 100)) {
        for (int i = 0; i < kDrainBatch && net::TryRecvMultipart(router_, &frames); ++i) HandleFrames(frames);
      }
      core_.RunDueTimers();
      if (options_.on_tick) options_.on_tick();
    }
    STRATA_LOG(kInfo) << "coordinator stopping";
    return Status::Ok();
  }

 private:
  // Anyone who can send this socket a message controls the cluster (submits runs, whose specs
  // name files and code to load), so a network address without CURVE is refused outright.
  Status SetUpCurve() {
    if (options_.keys_dir.empty()) {
      if (!curve::RequiresCurve(options_.listen)) return Status::Ok();
      return InvalidArgument("refusing to listen on " + options_.listen +
                             " without authentication: anyone who can reach it could run commands. Make keys "
                             "with `strata keygen DIR` and pass --keys DIR (or listen on ipc://PATH)");
    }
    STRATA_ASSIGN_OR_RETURN(curve::ServerKeys keys, curve::LoadServerKeys(options_.keys_dir));
    // The ZAP handler must be bound before the ROUTER: without one libzmq admits any client.
    STRATA_ASSIGN_OR_RETURN(zap_, curve::ZapHandler::Bind(context_, keys.authorized, "coordinator"));
    curve::ConfigureServer(router_, keys.own);
    STRATA_LOG(kInfo) << "CURVE on: " << keys.authorized.size() << " authorized key(s) from " << options_.keys_dir;
    return Status::Ok();
  }

  void HandleFrames(std::vector<zmq::message_t>& frames) {
    if (frames.size() != 2) {
      STRATA_LOG(kWarn) << "dropped a message of " << frames.size() << " frames (expected identity + envelope)";
      return;
    }
    const std::string identity(static_cast<const char*>(frames[0].data()), frames[0].size());
    auto decoded = schema::DecodeEnvelope(net::Bytes(frames[1]));
    if (!decoded.ok()) {
      STRATA_LOG(kWarn) << "dropped an undecodable message (" << frames[1].size()
                        << " bytes): " << decoded.status().message();
      Send(identity, schema::MakeErrorReply(0, decoded.status()));
      return;
    }
    auto root = (*decoded)->root();
    try {
      core_.Dispatch(identity, root);
    } catch (const std::exception& e) {
      // A handler must never take the loop down: a malformed-but-decodable message lands here.
      STRATA_LOG(kError) << "handler failed: " << e.what();
      Send(identity,
           schema::MakeErrorReply(root.getRequestId(), InvalidArgument(std::string("bad request: ") + e.what())));
    }
  }

  void Send(const std::string& identity, const std::string& bytes) override {
    try {
      router_.send(net::Buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router_.send(net::Buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      STRATA_LOG(kDebug) << "could not reach peer: " << e.what();  // peer gone: its timeout handles it
    }
  }

  CoordinatorOptions options_;
  std::atomic<bool> stop_requested_{false};
  CoordinatorCore core_;
  zmq::context_t context_{1};
  std::unique_ptr<curve::ZapHandler> zap_;  // declared before router_: outlives it
  zmq::socket_t router_;
};

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorOptions& options) {
  if (options.state_dir.empty()) return InvalidArgument("coordinator: --state-dir is required");
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir, ec);
  if (ec) return IoError("cannot create state dir " + options.state_dir + ": " + ec.message());
  storage::StoreOptions store_options;
  store_options.salvage = options.salvage;
  STRATA_ASSIGN_OR_RETURN(auto store, storage::ShardStore::Open(options.state_dir + "/metadata", store_options));
  auto coordinator = std::make_unique<CoordinatorImpl>(options, std::move(store));
  STRATA_RETURN_IF_ERROR(coordinator->Init());
  return std::unique_ptr<Coordinator>(std::move(coordinator));
}

}  // namespace strata::coordinator
