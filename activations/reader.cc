#include "activations/reader.h"

#include <algorithm>
#include <deque>
#include <map>

#include <zmq.hpp>

#include "common/net.h"
#include "client/coordinator_client.h"
#include "client/request.h"
#include "schema/envelope.h"

namespace strata::activations {
namespace {

// Requests kept in flight, so the store servers read the next records while we take this one.
constexpr size_t kWindow = 4;

storage::DType FromWire(::DType d) { return static_cast<storage::DType>(static_cast<uint8_t>(d)); }

class ReaderImpl final : public ActivationReader {
 public:
  ReaderImpl(std::string coordinator, int timeout_ms, std::optional<curve::ClientKeys> keys)
      : client_(coordinator, timeout_ms, keys), timeout_ms_(timeout_ms), keys_(std::move(keys)) {}

  Result<ActivationIndex> Index(const std::string& run) override {
    schema::EnvelopeBuilder request;
    request.root().initActivationsRequest().setRunId(run);
    STRATA_ASSIGN_OR_RETURN(auto reply, client_.Call(request));
    auto root = reply->root();
    if (root.which() != Envelope::ACTIVATIONS_REPLY) return Internal("the coordinator answered with another message kind");
    auto r = root.getActivationsReply();
    ActivationIndex index;
    index.run = r.getRunId().cStr();
    index.state = schema::RunStateName(r.getState());
    for (auto l : r.getLayers()) index.layers.push_back(l);
    for (auto s : r.getSites()) index.sites.push_back(s.cStr());
    index.dtype = FromWire(r.getDtype());
    index.hidden = static_cast<int64_t>(r.getHidden());
    index.total_rows = r.getTotalRows();
    for (auto c : r.getChunks()) {
      index.chunks.push_back({c.getChunk(), c.getRowBegin(), c.getRowCount(), c.getBytes(), c.getWorker().cStr(),
                              c.getServeAddress().cStr()});
    }
    std::sort(index.chunks.begin(), index.chunks.end(), [](auto& a, auto& b) { return a.row_begin < b.row_begin; });
    return index;
  }

  Status ReadRows(const ActivationIndex& index, int64_t layer, const std::string& site, uint64_t begin, uint64_t end,
                  const std::function<Status(std::span<const uint8_t>)>& sink) override {
    STRATA_RETURN_IF_ERROR(Validate(index, layer, site, begin, end));
    std::vector<const StoredChunk*> needed;
    for (const StoredChunk& c : index.chunks) {
      if (c.row_begin < end && c.row_begin + c.row_count > begin) needed.push_back(&c);
    }
    const uint64_t row_bytes = static_cast<uint64_t>(index.hidden) * storage::DTypeSize(index.dtype);
    struct InFlight {
      const StoredChunk* chunk;
      zmq::socket_t* socket;
      uint64_t request_id;
    };
    std::deque<InFlight> in_flight;
    size_t next = 0;
    while (next < needed.size() || !in_flight.empty()) {
      while (next < needed.size() && in_flight.size() < kWindow) {
        const StoredChunk* c = needed[next++];
        STRATA_ASSIGN_OR_RETURN(zmq::socket_t * socket, SocketFor(*c));
        const uint64_t id = next_request_id_++;
        schema::EnvelopeBuilder request(id);
        auto r = request.root().initReadActivation();
        r.setRunId(index.run);
        r.setLayer(static_cast<uint32_t>(layer));
        r.setSite(site);
        r.setRowBegin(c->row_begin);
        const std::string bytes = request.Serialize();
        socket->send(net::Buffer(bytes), zmq::send_flags::none);
        in_flight.push_back({c, socket, id});
      }
      InFlight f = in_flight.front();
      in_flight.pop_front();
      STRATA_ASSIGN_OR_RETURN(zmq::message_t data, Receive(f.socket, f.request_id, *f.chunk, row_bytes));
      const uint64_t from = std::max(begin, f.chunk->row_begin) - f.chunk->row_begin;
      const uint64_t to = std::min(end, f.chunk->row_begin + f.chunk->row_count) - f.chunk->row_begin;
      const auto* p = static_cast<const uint8_t*>(data.data());
      STRATA_RETURN_IF_ERROR(sink({p + from * row_bytes, (to - from) * row_bytes}));
    }
    return Status::Ok();
  }

 private:
  static Status Validate(const ActivationIndex& index, int64_t layer, const std::string& site, uint64_t begin, uint64_t end) {
    if (std::find(index.layers.begin(), index.layers.end(), layer) == index.layers.end()) {
      std::string list;
      for (int64_t l : index.layers) list += (list.empty() ? "" : ", ") + std::to_string(l);
      return InvalidArgument("--layer " + std::to_string(layer) + " was not captured by run " + index.run + "; its layers are " + list);
    }
    if (std::find(index.sites.begin(), index.sites.end(), site) == index.sites.end()) {
      std::string list;
      for (const auto& s : index.sites) list += (list.empty() ? "" : ", ") + s;
      return InvalidArgument("--site " + site + " was not captured by run " + index.run + "; its sites are " + list);
    }
    if (begin >= end) {
      return InvalidArgument("--rows " + std::to_string(begin) + ":" + std::to_string(end) + " is empty; give A:B with A < B");
    }
    if (end > index.total_rows) {
      return InvalidArgument("--rows " + std::to_string(begin) + ":" + std::to_string(end) + " goes beyond the " +
                             std::to_string(index.total_rows) + " rows run " + index.run + " captures");
    }
    const uint64_t covered = index.stored_until(begin);
    if (covered >= end) return Status::Ok();
    return Unavailable("rows " + std::to_string(covered) + " and on are not stored yet (run " + index.run + " is " +
                       index.state + ", " + std::to_string(index.contiguous_rows()) + " of " +
                       std::to_string(index.total_rows) + " rows complete from row 0); ask for fewer rows or wait");
  }

  Result<zmq::socket_t*> SocketFor(const StoredChunk& c) {
    if (c.serve_address.empty()) {
      return Unavailable("worker " + c.worker + " holds rows " + std::to_string(c.row_begin) +
                         " and on but serves no store (start it with --serve-address)");
    }
    auto it = sockets_.find(c.serve_address);
    if (it != sockets_.end()) return &it->second;
    const std::string endpoint = curve::SplitAddressKey(c.serve_address).first;
    STRATA_ASSIGN_OR_RETURN(zmq::socket_t socket,
                            client::ConnectDealer(context_, c.serve_address, keys_,
                                                  "worker " + c.worker + " serves over tcp:// with CURVE: pass --keys DIR",
                                                  "worker " + c.worker + " at " + endpoint));
    return &sockets_.emplace(c.serve_address, std::move(socket)).first->second;
  }

  Result<zmq::message_t> Receive(zmq::socket_t* socket, uint64_t request_id, const StoredChunk& c, uint64_t row_bytes) {
    STRATA_ASSIGN_OR_RETURN(client::Reply reply, client::AwaitReply(*socket, request_id, timeout_ms_, "worker " + c.worker + ": ", [&] {
      return "worker " + c.worker + " (" + c.serve_address + ") did not answer within " + std::to_string(timeout_ms_) +
             " ms; is it running? (`strata workers`; `strata up` restarts it)";
    }));
    auto root = reply.envelope->root();
    if (root.which() != Envelope::ACTIVATION_DATA || reply.frames.size() != 2) {
      return Internal("worker " + c.worker + " answered a read with something else");
    }
    auto data = root.getActivationData();
    zmq::message_t& bytes = reply.frames[1];
    if (bytes.size() != c.row_count * row_bytes) {
      return Corruption("worker " + c.worker + " sent " + std::to_string(bytes.size()) + " bytes for rows " +
                        std::to_string(c.row_begin) + ".." + std::to_string(c.row_begin + c.row_count) + ", expected " +
                        std::to_string(c.row_count * row_bytes));
    }
    if (storage::Checksum(net::Bytes(bytes)) != data.getChecksum()) {
      return Corruption("rows " + std::to_string(c.row_begin) + ".. from worker " + c.worker +
                        " fail their checksum; the transfer or its store is damaged");
    }
    return std::move(bytes);
  }

  client::CoordinatorClient client_;
  int timeout_ms_;
  std::optional<curve::ClientKeys> keys_;
  zmq::context_t context_{1};
  std::map<std::string, zmq::socket_t> sockets_;  // by serve address
  uint64_t next_request_id_ = 1;
};

}  // namespace

uint64_t ActivationIndex::stored_rows() const {
  uint64_t n = 0;
  for (const auto& c : chunks) n += c.row_count;
  return n;
}

uint64_t ActivationIndex::stored_until(uint64_t row) const {
  uint64_t covered = row;  // chunks are sorted by row_begin and never overlap
  for (const auto& c : chunks) {
    if (c.row_begin + c.row_count <= covered) continue;
    if (c.row_begin > covered) break;
    covered = c.row_begin + c.row_count;
  }
  return covered;
}

Result<std::unique_ptr<ActivationReader>> ActivationReader::Connect(const std::string& coordinator, int timeout_ms,
                                                                    std::optional<curve::ClientKeys> keys) {
  return std::unique_ptr<ActivationReader>(std::make_unique<ReaderImpl>(coordinator, timeout_ms, std::move(keys)));
}

}  // namespace strata::activations
