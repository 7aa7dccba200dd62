// ZeroMQ ring collectives for CPU workers. Each rank sends only to rank r+1 and receives only
// from rank r-1.
//
// The buffer is cut into n chunks, chunk c = ShardRange(count, n, c). Reduce-scatter: in step s
// (0..n-2) rank r sends chunk (r - s - 1) mod n and adds the chunk (r - s - 2) mod n received
// from rank r-1; after n-1 steps rank r holds the full sum of its own chunk r. All-gather: rank r
// starts with chunk r; in step s it sends chunk (r - s) mod n and copies in chunk (r - s - 1)
// mod n. All-reduce is the two in a row: each rank sends 2(n-1)/n of the buffer, the optimum for
// a ring. Summation order differs per chunk but the all-gather copies bytes, so every rank ends
// bit-identical. Broadcast passes the whole buffer around the ring from the root (n-1 hops).
//
// Wire: each message is [header: token u64, sequence u64, chunk u64][chunk bytes]. The inbound
// PULL socket is fresh per task; the token drops frames a previous task's peer may still send.
//
// Authentication: on tcp:// both sockets use CURVE (see communicator.h) and a ZAP handler admits
// only authorized peers, so a stranger on the network cannot inject a chunk (the token alone is
// no defence: it travels in clear text without CURVE).
#include <atomic>
#include <cstring>

#include "common/net.h"
#include "worker/communicator.h"

namespace strata::worker {
namespace {

struct FrameHeader {
  uint64_t token;
  uint64_t sequence;
  uint64_t chunk;
};

class ZmqCommunicator final : public Communicator {
 public:
  ZmqCommunicator(zmq::context_t& context, ZmqCommunicatorOptions options)
      : options_(std::move(options)),
        world_(static_cast<uint32_t>(options_.peer_addresses.size())),
        context_(&context) {}

  Status Init() {
    if (world_ == 0 || options_.rank >= world_) return InvalidArgument("communicator: rank outside the world");
    if (world_ == 1) return Status::Ok();
    const auto [own_endpoint, own_key] = curve::SplitAddressKey(options_.peer_addresses[options_.rank]);
    const auto [next_endpoint, next_key] = curve::SplitAddressKey(options_.peer_addresses[(options_.rank + 1) % world_]);
    const bool use_curve = curve::RequiresCurve(own_endpoint) || curve::RequiresCurve(next_endpoint);
    if (use_curve && !options_.curve) {
      return InvalidArgument("communicator: tcp:// data-plane addresses need CURVE keys (anyone could inject "
                             "gradients otherwise); start the workers with --keys DIR from `strata keygen`");
    }
    if (use_curve && next_key.empty()) {
      return InvalidArgument("communicator: rank " + std::to_string((options_.rank + 1) % world_) + "'s address " +
                             next_endpoint + " carries no CURVE key; start every worker with --keys DIR");
    }
    if (use_curve) {
      own_context_ = std::make_unique<zmq::context_t>(1);
      context_ = own_context_.get();
      STRATA_ASSIGN_OR_RETURN(zap_, curve::ZapHandler::Bind(*context_, options_.curve->authorized,
                                                           "data plane of rank " + std::to_string(options_.rank)));
    }
    inbound_ = zmq::socket_t(*context_, zmq::socket_type::pull);
    outbound_ = zmq::socket_t(*context_, zmq::socket_type::push);
    try {
      inbound_.set(zmq::sockopt::linger, 0);
      inbound_.set(zmq::sockopt::rcvhwm, 0);
      if (use_curve) curve::ConfigureServer(inbound_, options_.curve->own);
      inbound_.bind(own_endpoint);
      outbound_.set(zmq::sockopt::linger, 2000);  // let the last chunks out before closing
      outbound_.set(zmq::sockopt::sndhwm, 0);
      if (use_curve) curve::ConfigureClient(outbound_, options_.curve->own, next_key);
      outbound_.connect(next_endpoint);
    } catch (const zmq::error_t& e) {
      return Unavailable("communicator: cannot bind " + options_.peer_addresses[options_.rank] + " or reach rank " +
                         std::to_string((options_.rank + 1) % world_) + ": " + e.what());
    }
    return Status::Ok();
  }

  uint32_t rank() const override { return options_.rank; }
  uint32_t world_size() const override { return world_; }
  void Abort() override { aborted_.store(true); }

  Status AllReduceSum(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(ReduceScatterSum(data, count));
    return AllGather(data, count);
  }

  Status ReduceScatterSum(float* data, size_t count) override {
    return RingPass(data, count, /*offset=*/n() - 1, /*accumulate=*/true);
  }

  Status AllGather(float* data, size_t count) override {
    return RingPass(data, count, /*offset=*/0, /*accumulate=*/false);
  }

  Status Broadcast(float* data, size_t count, uint32_t root) override {
    if (aborted_.load()) return Aborted("communicator aborted");
    if (root >= world_) return InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank");
    if (world_ == 1) return Status::Ok();
    const uint32_t r = options_.rank;
    std::vector<float> incoming;
    if (r != root) {
      STRATA_RETURN_IF_ERROR(RecvChunk(&incoming, count, root));
      std::memcpy(data, incoming.data(), count * sizeof(float));
    }
    if ((r + 1) % world_ != root) STRATA_RETURN_IF_ERROR(SendChunk(data, count, root));
    return Status::Ok();
  }

 private:
  uint32_t n() const { return world_; }

  // n-1 ring steps; in step s rank r sends chunk (r - s + offset) mod n and receives chunk
  // (r - s - 1 + offset) mod n, adding it (reduce-scatter) or copying it (all-gather).
  Status RingPass(float* data, size_t count, uint32_t offset, bool accumulate) {
    if (aborted_.load()) return Aborted("communicator aborted");
    const uint32_t world = n();
    if (world == 1) return Status::Ok();
    const uint32_t r = options_.rank;
    std::vector<float> incoming;
    for (uint32_t s = 0; s + 1 < world; ++s) {
      const uint32_t send_c = (r + offset + world - s) % world;
      const uint32_t recv_c = (r + offset + 2 * world - s - 1) % world;
      const auto [send_begin, send_end] = ShardRange(count, world, send_c);
      const auto [recv_begin, recv_end] = ShardRange(count, world, recv_c);
      STRATA_RETURN_IF_ERROR(SendChunk(data + send_begin, send_end - send_begin, send_c));
      STRATA_RETURN_IF_ERROR(RecvChunk(&incoming, recv_end - recv_begin, recv_c));
      float* dst = data + recv_begin;
      if (accumulate) {
        for (size_t i = 0; i < incoming.size(); ++i) dst[i] += incoming[i];
      } else {
        std::memcpy(dst, incoming.data(), incoming.size() * sizeof(float));
      }
    }
    return Status::Ok();
  }

  Status SendChunk(const float* src, size_t count, uint32_t chunk) {
    FrameHeader header{options_.task_token, send_sequence_++, chunk};
    try {
      outbound_.send(zmq::buffer(&header, sizeof(header)), zmq::send_flags::sndmore);
      outbound_.send(zmq::buffer(src, count * sizeof(float)), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      return Unavailable(std::string("communicator: send failed: ") + e.what());
    }
    return Status::Ok();
  }

  Status RecvChunk(std::vector<float>* out, size_t count, uint32_t chunk) {
    const uint32_t from = (options_.rank + world_ - 1) % world_;
    const int64_t deadline = net::SteadyMs() + options_.peer_timeout_ms;
    std::vector<zmq::message_t> frames;
    while (true) {
      if (aborted_.load()) return Aborted("communicator aborted while waiting for rank " + std::to_string(from));
      if (net::SteadyMs() > deadline) {
        return DeadlineExceeded("rank " + std::to_string(options_.rank) + " waited " +
                                std::to_string(options_.peer_timeout_ms / 1000) + " s for rank " +
                                std::to_string(from) + "; it may have died or stalled");
      }
      // Waiting is also when this rank admits its neighbour: ZAP requests are answered here.
      if (!curve::PollWithZap(inbound_, zap_.get(), 50) || !net::RecvMultipart(inbound_, &frames, 0)) continue;
      if (frames.size() != 2 || frames[0].size() != sizeof(FrameHeader)) continue;  // not ours
      FrameHeader header;
      std::memcpy(&header, frames[0].data(), sizeof(header));
      if (header.token != options_.task_token) continue;  // stale traffic of an earlier task
      if (header.sequence != recv_sequence_ || header.chunk != chunk || frames[1].size() != count * sizeof(float)) {
        return Internal("communicator: out-of-order chunk from rank " + std::to_string(from) + " (sequence " +
                        std::to_string(header.sequence) + ", expected " + std::to_string(recv_sequence_) +
                        "); ranks called collectives in different orders");
      }
      ++recv_sequence_;
      out->resize(count);
      std::memcpy(out->data(), frames[1].data(), frames[1].size());
      return Status::Ok();
    }
  }

  ZmqCommunicatorOptions options_;
  uint32_t world_;
  // Destroyed in reverse: sockets, then the ZAP handler, then our own context (if any).
  std::unique_ptr<zmq::context_t> own_context_;  // with CURVE: this task's context (see communicator.h)
  zmq::context_t* context_;
  std::unique_ptr<curve::ZapHandler> zap_;
  zmq::socket_t inbound_;
  zmq::socket_t outbound_;
  uint64_t send_sequence_ = 0;
  uint64_t recv_sequence_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateZmqCommunicator(zmq::context_t& context, const ZmqCommunicatorOptions& options) {
  auto comm = std::make_unique<ZmqCommunicator>(context, options);
  STRATA_RETURN_IF_ERROR(comm->Init());
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace strata::worker
