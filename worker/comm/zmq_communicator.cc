// ZeroMQ collectives for CPU workers, over one socket mesh per task shared by every group split
// from it.
//
// Transport: each rank binds one PULL socket and opens a PUSH socket to a peer the first time it
// sends there. A frame is [header: token, group, sequence, source][payload]. A receive waits for
// the next sequence number of (group, source); frames of other groups or sources that arrive
// first wait in a mailbox. So groups interleave freely (a tensor-parallel all-reduce between two
// pipeline sends) as long as each group's ranks call the same operations in the same order.
//
// Ring collectives within a group of n: the buffer is cut into n chunks, chunk c =
// ShardRange(count, n, c). Reduce-scatter: in step s (0..n-2) group rank r sends chunk
// (r - s - 1) mod n to r+1 and adds the chunk (r - s - 2) mod n received from r-1; after n-1
// steps rank r holds the full sum of its own chunk r. All-gather: rank r starts with chunk r; in
// step s it sends chunk (r - s) mod n and copies in chunk (r - s - 1) mod n. All-reduce is the two
// in a row: each rank sends 2(n-1)/n of the buffer, the optimum for a ring. Summation order
// differs per chunk but the all-gather copies bytes, so every rank ends bit-identical. Broadcast
// passes the whole buffer around the ring from the root (n-1 hops).
//
// Start-up handshake: before its first transfer a rank says hello to every peer and resends it
// every 100 ms until each peer has acknowledged it, and waits until it has heard every peer's
// hello. A peer restarting its task (after a lost worker, or an out-of-memory stop) still has
// its previous task's socket bound at the same address for a moment; frames pushed into that
// socket are lost with it, so nothing is sent before the acknowledgement proves the new socket
// is the one connected. Hellos are answered at any time, also after this rank's handshake.
//
// Authentication: on tcp:// the inbound socket is a CURVE server and every outbound socket a
// CURVE client (see communicator.h); a ZAP handler admits only authorized peers, so a stranger on
// the network cannot inject a chunk (the token alone is no defence: it travels in clear text
// without CURVE).
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <type_traits>

#include "common/net.h"
#include "kernels/bf16.h"
#include "worker/comm/communicator.h"

namespace strata::worker {
namespace {

struct FrameHeader {
  uint64_t token;
  uint64_t group;
  uint64_t sequence;
  uint64_t source;  // world rank of the sender
};

// The task's sockets and mailbox, shared by the world communicator and its groups; used by the
// task thread only (Abort aside).
class Mesh {
 public:
  explicit Mesh(ZmqCommunicatorOptions options) : options_(std::move(options)) {}

  Status Init(zmq::context_t* context) {
    const uint32_t world = static_cast<uint32_t>(options_.peer_addresses.size());
    if (world == 0 || options_.rank >= world) return InvalidArgument("communicator: rank outside the world");
    context_ = context;
    if (world == 1) return Status::Ok();
    bool use_curve = false;
    for (uint32_t r = 0; r < world; ++r) {
      const auto [endpoint, key] = curve::SplitAddressKey(options_.peer_addresses[r]);
      if (!curve::RequiresCurve(endpoint)) continue;
      use_curve = true;
      if (!options_.curve) {
        return InvalidArgument(
            "communicator: tcp:// data-plane addresses need CURVE keys (anyone could inject "
            "gradients otherwise); start the workers with --keys DIR from `strata keygen`");
      }
      if (key.empty()) {
        return InvalidArgument("communicator: rank " + std::to_string(r) + "'s address " + endpoint +
                               " carries no CURVE key; start every worker with --keys DIR");
      }
    }
    use_curve_ = use_curve;
    if (use_curve_) {
      own_context_ = std::make_unique<zmq::context_t>(1);
      context_ = own_context_.get();
      STRATA_ASSIGN_OR_RETURN(zap_, curve::ZapHandler::Bind(*context_, options_.curve->authorized,
                                                            "data plane of rank " + std::to_string(options_.rank)));
    }
    inbound_ = zmq::socket_t(*context_, zmq::socket_type::pull);
    try {
      inbound_.set(zmq::sockopt::linger, 0);
      inbound_.set(zmq::sockopt::rcvhwm, 0);
      if (use_curve_) curve::ConfigureServer(inbound_, options_.curve->own);
      inbound_.bind(curve::SplitAddressKey(options_.peer_addresses[options_.rank]).first);
    } catch (const zmq::error_t& e) {
      return Unavailable("communicator: cannot bind " + options_.peer_addresses[options_.rank] + ": " + e.what());
    }
    outbound_.resize(world);
    return Status::Ok();
  }

  uint32_t rank() const { return options_.rank; }
  uint32_t world() const { return static_cast<uint32_t>(options_.peer_addresses.size()); }
  void Abort() { aborted_.store(true); }
  bool aborted() const { return aborted_.load(); }
  uint64_t NextGroupId() { return ++groups_made_; }

  int64_t missing_peer() const { return missing_peer_.load(); }

  // See the top of this file. Called before the first transfer.
  Status Handshake() {
    if (handshaken_ || world() == 1) return Status::Ok();
    std::set<uint32_t> unacked;
    for (uint32_t p = 0; p < world(); ++p) {
      if (p != rank()) unacked.insert(p);
    }
    const int64_t deadline = net::SteadyMs() + options_.peer_timeout_ms;
    int64_t last_hello = 0;
    std::vector<zmq::message_t> frames;
    while (!unacked.empty() || heard_.size() + 1 < world()) {
      if (aborted_.load()) return Aborted("communicator aborted while starting");
      const int64_t now = net::SteadyMs();
      if (now > deadline) {
        uint32_t missing = *unacked.begin();
        for (uint32_t p = 0; p < world(); ++p) {
          if (p != rank() && !heard_.count(p)) missing = p;
        }
        missing_peer_.store(missing);
        return DeadlineExceeded("rank " + std::to_string(rank()) + " waited " +
                                std::to_string(options_.peer_timeout_ms / 1000) + " s for rank " +
                                std::to_string(missing) + " to start the task; it may have died or stalled");
      }
      if (now - last_hello >= 100) {
        for (uint32_t p : unacked) STRATA_RETURN_IF_ERROR(SendControl(p, kHello));
        last_hello = now;
      }
      if (!curve::PollWithZap(inbound_, zap_.get(), 20) || !net::RecvMultipart(inbound_, &frames, 0)) continue;
      FrameHeader header;
      if (!Ours(frames, &header)) continue;
      if (header.group == kControlGroup) {
        STRATA_ASSIGN_OR_RETURN(const char what, OnControl(header, frames[1]));
        if (what == kAck) unacked.erase(static_cast<uint32_t>(header.source));
        continue;
      }
      Keep(header, frames[1]);  // a peer already past its handshake sent data: keep it for Recv
    }
    handshaken_ = true;
    return Status::Ok();
  }

  Status Send(uint64_t group, uint32_t to, const void* data, size_t bytes) {
    if (aborted_.load()) return Aborted("communicator aborted");
    STRATA_RETURN_IF_ERROR(Handshake());
    STRATA_ASSIGN_OR_RETURN(zmq::socket_t * socket, Outbound(to));
    FrameHeader header{options_.task_token, group, send_sequence_[{group, to}]++, options_.rank};
    try {
      socket->send(zmq::buffer(&header, sizeof(header)), zmq::send_flags::sndmore);
      socket->send(zmq::buffer(data, bytes), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      return Unavailable(std::string("communicator: send to rank ") + std::to_string(to) + " failed: " + e.what());
    }
    return Status::Ok();
  }

  // The next payload of `group` from world rank `from`, which must be `bytes` long.
  Status Recv(uint64_t group, uint32_t from, void* out, size_t bytes) {
    const Key key{group, from, recv_sequence_[{group, from}]};
    auto deliver = [&](zmq::message_t& payload) -> Status {
      if (payload.size() != bytes) {
        return Internal("communicator: rank " + std::to_string(from) + " sent " + std::to_string(payload.size()) +
                        " bytes where " + std::to_string(bytes) +
                        " were expected; ranks called collectives in "
                        "different orders or with different sizes");
      }
      std::memcpy(out, payload.data(), bytes);
      ++recv_sequence_[{group, from}];
      return Status::Ok();
    };
    STRATA_RETURN_IF_ERROR(Handshake());
    if (auto it = mailbox_.find(key); it != mailbox_.end()) {
      Status st = deliver(it->second);
      mailbox_.erase(it);
      return st;
    }
    const int64_t deadline = net::SteadyMs() + options_.peer_timeout_ms;
    std::vector<zmq::message_t> frames;
    while (true) {
      if (aborted_.load()) return Aborted("communicator aborted while waiting for rank " + std::to_string(from));
      if (net::SteadyMs() > deadline) {
        missing_peer_.store(from);
        return DeadlineExceeded("rank " + std::to_string(options_.rank) + " waited " +
                                std::to_string(options_.peer_timeout_ms / 1000) + " s for rank " +
                                std::to_string(from) + "; it may have died or stalled");
      }
      // Waiting is also when this rank admits its peers: ZAP requests are answered here.
      if (!curve::PollWithZap(inbound_, zap_.get(), 50) || !net::RecvMultipart(inbound_, &frames, 0)) continue;
      FrameHeader header;
      if (!Ours(frames, &header)) continue;
      if (header.group == kControlGroup) {
        STRATA_RETURN_IF_ERROR(OnControl(header, frames[1]).status());
        continue;
      }
      if (Key{header.group, static_cast<uint32_t>(header.source), header.sequence} == key) return deliver(frames[1]);
      Keep(header, frames[1]);
    }
  }

 private:
  struct Key {
    uint64_t group;
    uint32_t source;
    uint64_t sequence;
    bool operator==(const Key& o) const { return group == o.group && source == o.source && sequence == o.sequence; }
    bool operator<(const Key& o) const {
      return std::tie(group, source, sequence) < std::tie(o.group, o.source, o.sequence);
    }
  };

  static constexpr uint64_t kControlGroup = ~uint64_t{0};  // handshake frames; groups count up from 0
  static constexpr char kHello = 'H', kAck = 'A';

  // A frame of this task from a rank of this world (else stale or foreign: dropped).
  bool Ours(const std::vector<zmq::message_t>& frames, FrameHeader* header) const {
    if (frames.size() != 2 || frames[0].size() != sizeof(FrameHeader)) return false;
    std::memcpy(header, frames[0].data(), sizeof(*header));
    return header->token == options_.task_token && header->source < world() && header->source != rank();
  }

  // A data frame that is not the one awaited now: into the mailbox, unless already delivered.
  void Keep(const FrameHeader& header, zmq::message_t& payload) {
    const Key got{header.group, static_cast<uint32_t>(header.source), header.sequence};
    if (header.sequence < recv_sequence_[{header.group, got.source}]) return;  // a duplicate
    mailbox_[got] = std::move(payload);
  }

  // A control frame's kind (0 if malformed). A hello is acknowledged whenever it comes (the peer
  // resends until it hears the ack).
  Result<char> OnControl(const FrameHeader& header, const zmq::message_t& payload) {
    const char what = payload.size() == 1 ? *static_cast<const char*>(payload.data()) : 0;
    if (what != kHello) return what;
    heard_.insert(static_cast<uint32_t>(header.source));
    STRATA_RETURN_IF_ERROR(SendControl(static_cast<uint32_t>(header.source), kAck));
    return what;
  }

  Status SendControl(uint32_t to, char what) {
    STRATA_ASSIGN_OR_RETURN(zmq::socket_t * socket, Outbound(to));
    FrameHeader header{options_.task_token, kControlGroup, 0, options_.rank};
    try {
      socket->send(zmq::buffer(&header, sizeof(header)), zmq::send_flags::sndmore);
      socket->send(zmq::buffer(&what, 1), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      return Unavailable(std::string("communicator: send to rank ") + std::to_string(to) + " failed: " + e.what());
    }
    return Status::Ok();
  }

  Result<zmq::socket_t*> Outbound(uint32_t to) {
    if (to >= world()) return InvalidArgument("communicator: no rank " + std::to_string(to));
    if (!outbound_[to]) {
      const auto [endpoint, key] = curve::SplitAddressKey(options_.peer_addresses[to]);
      auto socket = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::push);
      try {
        socket->set(zmq::sockopt::linger, 2000);  // let the last chunks out before closing
        socket->set(zmq::sockopt::sndhwm, 0);
        if (use_curve_) curve::ConfigureClient(*socket, options_.curve->own, key);
        socket->connect(endpoint);
      } catch (const zmq::error_t& e) {
        return Unavailable("communicator: cannot reach rank " + std::to_string(to) + " at " + endpoint + ": " +
                           e.what());
      }
      outbound_[to] = std::move(socket);
    }
    return outbound_[to].get();
  }

  ZmqCommunicatorOptions options_;
  bool use_curve_ = false;
  // Destroyed in reverse: sockets, then the ZAP handler, then our own context (if any).
  std::unique_ptr<zmq::context_t> own_context_;  // with CURVE: this task's context (see communicator.h)
  zmq::context_t* context_ = nullptr;
  std::unique_ptr<curve::ZapHandler> zap_;
  zmq::socket_t inbound_;
  std::vector<std::unique_ptr<zmq::socket_t>> outbound_;
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> send_sequence_, recv_sequence_;
  std::map<Key, zmq::message_t> mailbox_;
  uint64_t groups_made_ = 0;
  bool handshaken_ = false;
  std::set<uint32_t> heard_;  // peers whose hello arrived
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> missing_peer_{-1};
};

// The world (group 0, members 0..n-1) or a group split from it.
class ZmqCommunicator final : public Communicator {
 public:
  ZmqCommunicator(std::shared_ptr<Mesh> mesh, uint64_t group, std::vector<uint32_t> members, uint32_t rank)
      : mesh_(std::move(mesh)), group_(group), members_(std::move(members)), rank_(rank) {}

  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return static_cast<uint32_t>(members_.size()); }
  void Abort() override { mesh_->Abort(); }
  int64_t missing_peer() const override { return mesh_->missing_peer(); }

  Status AllReduceSum(float* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(ReduceScatterSum(data, count));
    return AllGather(data, count);
  }

  Status ReduceScatterSum(float* data, size_t count) override {
    return RingPass(data, count, /*offset=*/world_size() - 1, /*accumulate=*/true);
  }

  Status AllGather(float* data, size_t count) override {
    return RingPass(data, count, /*offset=*/0, /*accumulate=*/false);
  }

  Status AllGather16(uint16_t* data, size_t count) override {
    return RingPass(data, count, /*offset=*/0, /*accumulate=*/false);
  }

  Status AllReduceSumBf16(uint16_t* data, size_t count) override {
    STRATA_RETURN_IF_ERROR(RingPass(data, count, /*offset=*/world_size() - 1, /*accumulate=*/true));
    return AllGather16(data, count);
  }

  Status ReduceScatterSumBf16To(uint16_t* data, uint16_t* block, size_t count) override {
    STRATA_RETURN_IF_ERROR(RingPass(data, count, /*offset=*/world_size() - 1, /*accumulate=*/true));
    const auto [begin, end] = ShardRange(count, world_size(), rank());
    if (end > begin) std::memmove(block, data + begin, (end - begin) * sizeof(uint16_t));
    return Status::Ok();
  }

  Status Broadcast(float* data, size_t count, uint32_t root) override {
    if (mesh_->aborted()) return Aborted("communicator aborted");
    const uint32_t n = world_size();
    if (root >= n) return InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank");
    if (n == 1) return Status::Ok();
    if (rank_ != root) STRATA_RETURN_IF_ERROR(mesh_->Recv(group_, Prev(), data, count * sizeof(float)));
    if ((rank_ + 1) % n != root) STRATA_RETURN_IF_ERROR(mesh_->Send(group_, Next(), data, count * sizeof(float)));
    return Status::Ok();
  }

  Status Send(const void* data, size_t bytes, uint32_t peer) override {
    if (peer >= world_size()) return InvalidArgument("send: no rank " + std::to_string(peer) + " in this group");
    return mesh_->Send(group_, members_[peer], data, bytes);
  }

  Status Recv(void* data, size_t bytes, uint32_t peer) override {
    if (peer >= world_size()) return InvalidArgument("recv: no rank " + std::to_string(peer) + " in this group");
    return mesh_->Recv(group_, members_[peer], data, bytes);
  }

  Result<std::unique_ptr<Communicator>> Split(const std::vector<std::vector<uint32_t>>& groups) override {
    // Group ids agree without a message as long as every rank of the task makes the same Splits
    // in the same order (the mesh makes them once, from the world).
    const uint64_t split = mesh_->NextGroupId();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].size(); ++i) {
        if (groups[g][i] != rank_) continue;
        std::vector<uint32_t> members;
        for (uint32_t r : groups[g]) {
          if (r >= world_size()) return InvalidArgument("split: no rank " + std::to_string(r) + " in this group");
          members.push_back(members_[r]);
        }
        return std::unique_ptr<Communicator>(std::make_unique<ZmqCommunicator>(
            mesh_, (split << 20) | (g + 1), std::move(members), static_cast<uint32_t>(i)));
      }
    }
    return InvalidArgument("split: rank " + std::to_string(rank_) + " is in none of the groups");
  }

 private:
  uint32_t Next() const { return members_[(rank_ + 1) % world_size()]; }
  uint32_t Prev() const { return members_[(rank_ + world_size() - 1) % world_size()]; }

  // n-1 ring steps (T: float, or uint16_t holding bf16 or any 16-bit data; sums read it as bf16);
  // in step s rank r sends chunk (r - s + offset) mod n and receives chunk
  // (r - s - 1 + offset) mod n, adding it (reduce-scatter) or copying it (all-gather).
  template <typename T>
  Status RingPass(T* data, size_t count, uint32_t offset, bool accumulate) {
    if (mesh_->aborted()) return Aborted("communicator aborted");
    const uint32_t n = world_size();
    if (n == 1) return Status::Ok();
    const uint32_t r = rank_;
    std::vector<T> incoming;
    for (uint32_t s = 0; s + 1 < n; ++s) {
      const uint32_t send_c = (r + offset + n - s) % n;
      const uint32_t recv_c = (r + offset + 2 * n - s - 1) % n;
      const auto [send_begin, send_end] = ShardRange(count, n, send_c);
      const auto [recv_begin, recv_end] = ShardRange(count, n, recv_c);
      STRATA_RETURN_IF_ERROR(mesh_->Send(group_, Next(), data + send_begin, (send_end - send_begin) * sizeof(T)));
      incoming.resize(recv_end - recv_begin);
      STRATA_RETURN_IF_ERROR(mesh_->Recv(group_, Prev(), incoming.data(), incoming.size() * sizeof(T)));
      T* dst = data + recv_begin;
      if (accumulate) {
        if constexpr (std::is_same_v<T, uint16_t>) {  // bf16 bits: added in fp32, rounded back (kernels/bf16.h)
          for (size_t i = 0; i < incoming.size(); ++i) {
            dst[i] = kernels::FloatToBf16(kernels::Bf16ToFloat(dst[i]) + kernels::Bf16ToFloat(incoming[i]));
          }
        } else {
          for (size_t i = 0; i < incoming.size(); ++i) dst[i] += incoming[i];
        }
      } else {
        std::memcpy(dst, incoming.data(), incoming.size() * sizeof(T));
      }
    }
    return Status::Ok();
  }

  std::shared_ptr<Mesh> mesh_;
  uint64_t group_;
  std::vector<uint32_t> members_;  // world ranks, by group rank
  uint32_t rank_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateZmqCommunicator(zmq::context_t& context,
                                                            const ZmqCommunicatorOptions& options) {
  auto mesh = std::make_shared<Mesh>(options);
  STRATA_RETURN_IF_ERROR(mesh->Init(&context));
  std::vector<uint32_t> members;
  for (uint32_t r = 0; r < mesh->world(); ++r) members.push_back(r);
  const uint32_t rank = mesh->rank();
  return std::unique_ptr<Communicator>(std::make_unique<ZmqCommunicator>(std::move(mesh), 0, std::move(members), rank));
}

std::unique_ptr<Communicator> CreateSoloCommunicator() {
  ZmqCommunicatorOptions options;
  options.peer_addresses = {"inproc://unused"};  // a world of one never sends
  auto mesh = std::make_shared<Mesh>(options);
  (void)mesh->Init(nullptr);
  return std::make_unique<ZmqCommunicator>(std::move(mesh), 0, std::vector<uint32_t>{0}, 0);
}

}  // namespace strata::worker
