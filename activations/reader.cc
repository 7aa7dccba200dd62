#include "activations/reader.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <zmq.hpp>

#include "client/coordinator_client.h"
#include "client/request.h"
#include "common/net.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"

namespace strata::activations {
namespace {

// Requests kept in flight, so the store servers read the next records while we take this one.
constexpr size_t kWindow = 4;

storage::DType FromWire(::DType d) { return static_cast<storage::DType>(static_cast<uint8_t>(d)); }

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string RangeText(uint64_t begin, uint64_t end) { return std::to_string(begin) + ":" + std::to_string(end); }

// What both sources share: checking a request against the index, and cutting the asked rows out
// of whole chunk records. A source fetches the records of the chunks a read needs, in order.
class ReaderBase : public ActivationReader {
 public:
  Status ReadRows(const ActivationIndex& index, int64_t layer, const std::string& site, uint64_t begin, uint64_t end,
                  const std::function<Status(std::span<const uint8_t>)>& sink) override {
    STRATA_RETURN_IF_ERROR(index.CheckSite(layer, site));
    STRATA_RETURN_IF_ERROR(ValidateRows(index, begin, end));
    return Read(index, layer, site, index.RowBytes(site), begin, end, sink);
  }

  Status ReadTokens(const ActivationIndex& index, uint64_t begin, uint64_t end,
                    const std::function<Status(std::span<const uint8_t>)>& sink) override {
    STRATA_RETURN_IF_ERROR(ValidateRows(index, begin, end));
    Status st = Read(index, 0, storage::kActivationTokensSite, storage::kActivationTokenColumns * sizeof(int64_t),
                     begin, end, sink);
    if (st.code() == StatusCode::kNotFound) {
      return NotFound(
          "run " + index.run + " keeps no tokens beside its rows (" + st.message() +
          "); it was captured by a Strata before chunks stored their tokens: capture it again to have them");
    }
    return st;
  }

 protected:
  // Delivers the whole record (layer, site) of each of `chunks`, in order, to `take`.
  virtual Status Fetch(const ActivationIndex& index, int64_t layer, const std::string& site,
                       const std::vector<const StoredChunk*>& chunks,
                       const std::function<Status(const StoredChunk&, std::span<const uint8_t>)>& take) = 0;

 private:
  Status Read(const ActivationIndex& index, int64_t layer, const std::string& site, uint64_t row_bytes, uint64_t begin,
              uint64_t end, const std::function<Status(std::span<const uint8_t>)>& sink) {
    std::vector<const StoredChunk*> needed;
    for (const StoredChunk& c : index.chunks) {
      if (c.row_begin < end && c.row_begin + c.row_count > begin) needed.push_back(&c);
    }
    return Fetch(index, layer, site, needed, [&](const StoredChunk& c, std::span<const uint8_t> bytes) {
      if (bytes.size() != c.row_count * row_bytes) {
        return Corruption(c.worker + " gave " + std::to_string(bytes.size()) + " bytes of " + site + " for rows " +
                          RangeText(c.row_begin, c.row_begin + c.row_count) + ", expected " +
                          std::to_string(c.row_count * row_bytes) + " (" + std::to_string(row_bytes) + " per row)");
      }
      const uint64_t from = std::max(begin, c.row_begin) - c.row_begin;
      const uint64_t to = std::min(end, c.row_begin + c.row_count) - c.row_begin;
      return sink(bytes.subspan(from * row_bytes, (to - from) * row_bytes));
    });
  }

  static Status ValidateRows(const ActivationIndex& index, uint64_t begin, uint64_t end) {
    if (begin >= end) {
      return InvalidArgument("rows " + RangeText(begin, end) + " is empty; give A:B with A < B");
    }
    if (end > index.total_rows) {
      return InvalidArgument("rows " + RangeText(begin, end) + " goes beyond the " + std::to_string(index.total_rows) +
                             " rows run " + index.run + " captures");
    }
    const uint64_t covered = index.stored_until(begin);
    if (covered >= end) return Status::Ok();
    if (index.offline) {
      std::vector<std::string> missing;
      for (auto [a, b] : index.MissingRows()) {
        if (a < end && b > begin) missing.push_back(RangeText(std::max(a, begin), std::min(b, end)));
      }
      return NotFound("rows " + Join(missing) + " of run " + index.run + " are in none of the given " + index.source +
                      "; pass the store of every worker that captured it (`strata activations RUN` lists them while "
                      "the cluster is up), or ask for other rows");
    }
    return Unavailable("rows " + std::to_string(covered) + " and on are not stored yet (run " + index.run + " is " +
                       index.state + ", " + std::to_string(index.contiguous_rows()) + " of " +
                       std::to_string(index.total_rows) + " rows complete from row 0); ask for fewer rows or wait");
  }
};

class ReaderImpl final : public ReaderBase {
 public:
  ReaderImpl(std::string coordinator, int timeout_ms, std::optional<curve::ClientKeys> keys)
      : client_(coordinator, timeout_ms, keys), timeout_ms_(timeout_ms), keys_(std::move(keys)) {}

  Result<ActivationIndex> Index(const std::string& run) override {
    schema::EnvelopeBuilder request;
    request.root().initActivationsRequest().setRunId(run);
    STRATA_ASSIGN_OR_RETURN(auto reply, client_.Call(request));
    auto root = reply->root();
    if (root.which() != Envelope::ACTIVATIONS_REPLY)
      return Internal("the coordinator answered with another message kind");
    auto r = root.getActivationsReply();
    ActivationIndex index;
    index.run = r.getRunId().cStr();
    index.state = schema::RunStateName(r.getState());
    index.source = "coordinator " + client_.endpoint();
    for (auto l : r.getLayers()) index.layers.push_back(l);
    for (auto s : r.getSites()) index.sites.push_back(s.cStr());
    index.dtype = FromWire(r.getDtype());
    index.hidden = static_cast<int64_t>(r.getHidden());
    for (auto shape : r.getRowShapes()) {
      index.row_shapes.emplace_back();
      for (int64_t d : shape) index.row_shapes.back().push_back(d);
    }
    // A coordinator from before row shapes: every site was [hidden].
    if (index.row_shapes.size() != index.sites.size()) index.row_shapes.assign(index.sites.size(), {index.hidden});
    index.sequence = r.getSequence();
    index.total_rows = r.getTotalRows();
    for (auto c : r.getChunks()) {
      index.chunks.push_back({c.getChunk(), c.getRowBegin(), c.getRowCount(), c.getBytes(), c.getWorker().cStr(),
                              c.getServeAddress().cStr()});
    }
    std::sort(index.chunks.begin(), index.chunks.end(), [](auto& a, auto& b) { return a.row_begin < b.row_begin; });
    return index;
  }

 protected:
  Status Fetch(const ActivationIndex& index, int64_t layer, const std::string& site,
               const std::vector<const StoredChunk*>& needed,
               const std::function<Status(const StoredChunk&, std::span<const uint8_t>)>& take) override {
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
      Result<zmq::message_t> data = Receive(f.socket, f.request_id, *f.chunk);
      if (!data.ok()) {
        // Answers to the requests still in flight would be taken for the next read's: drop the
        // sockets (a later read connects afresh).
        sockets_.clear();
        return data.status();
      }
      if (Status st = take(*f.chunk, net::Bytes(*data)); !st.ok()) {
        sockets_.clear();
        return st;
      }
    }
    return Status::Ok();
  }

 private:
  Result<zmq::socket_t*> SocketFor(const StoredChunk& c) {
    if (c.serve_address.empty()) {
      return Unavailable("worker " + c.worker + " holds rows " + std::to_string(c.row_begin) +
                         " and on but serves no store (start it with --serve-address)");
    }
    auto it = sockets_.find(c.serve_address);
    if (it != sockets_.end()) return &it->second;
    const std::string endpoint = curve::SplitAddressKey(c.serve_address).first;
    STRATA_ASSIGN_OR_RETURN(
        zmq::socket_t socket,
        client::ConnectDealer(context_, c.serve_address, keys_,
                              "worker " + c.worker + " serves over tcp:// with CURVE: pass --keys DIR",
                              "worker " + c.worker + " at " + endpoint));
    return &sockets_.emplace(c.serve_address, std::move(socket)).first->second;
  }

  Result<zmq::message_t> Receive(zmq::socket_t* socket, uint64_t request_id, const StoredChunk& c) {
    STRATA_ASSIGN_OR_RETURN(client::Reply reply,
                            client::AwaitReply(*socket, request_id, timeout_ms_, "worker " + c.worker + ": ", [&] {
                              return "worker " + c.worker + " (" + c.serve_address + ") did not answer within " +
                                     std::to_string(timeout_ms_) +
                                     " ms; is it running? (`strata workers`; `strata up` restarts it; with the cluster "
                                     "down, read its store "
                                     "directly: --store DIR)";
                            }));
    auto root = reply.envelope->root();
    if (root.which() != Envelope::ACTIVATION_DATA || reply.frames.size() != 2) {
      return Internal("worker " + c.worker + " answered a read with something else");
    }
    auto data = root.getActivationData();
    zmq::message_t& bytes = reply.frames[1];
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

// Offline: the stores' own run records and chunk lists are the index; reads go to their files.
class StoreReaderImpl final : public ReaderBase {
 public:
  StoreReaderImpl(std::vector<std::string> dirs, std::vector<std::unique_ptr<storage::ShardStore>> stores)
      : dirs_(std::move(dirs)), stores_(std::move(stores)) {}

  Result<ActivationIndex> Index(const std::string& run) override {
    ActivationIndex index;
    index.run = run;
    index.state = "offline";
    index.offline = true;
    index.source = (dirs_.size() == 1 ? "store " : "stores ") + Join(dirs_);
    std::optional<storage::ActivationRunInfo> info;
    size_t info_from = 0;
    std::set<uint64_t> seen;  // a chunk stored twice (a task resumed elsewhere) is read once
    for (size_t i = 0; i < stores_.size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(auto record, stores_[i]->GetActivationRun(run));
      STRATA_ASSIGN_OR_RETURN(auto chunks, stores_[i]->ListActivationChunks(run));
      if (record && !info) {
        info = record;
        info_from = i;
      } else if (record && !(*record == *info)) {
        return InvalidArgument("stores " + dirs_[info_from] + " and " + dirs_[i] + " hold different records of run " +
                               run +
                               " (layers, sites, dtype or rows differ): they are not of the same capture; pass the "
                               "stores of one cluster");
      }
      for (const auto& c : chunks) {
        if (!seen.insert(c.chunk).second) continue;
        index.chunks.push_back({c.chunk, c.row_begin, c.row_count, c.bytes, dirs_[i], "", i});
      }
    }
    if (!info) {
      if (!index.chunks.empty()) {
        return NotFound(
            "run " + run + " has chunks in " + index.source +
            " but no run record: it was captured by a "
            "Strata before stores kept one; read it through the cluster (`strata up`), or capture it again");
      }
      return NotFound("unknown run " + run + ": none of " + index.source +
                      " holds activations of it (give the run id: "
                      "`strata status` lists them while the cluster is up)");
    }
    index.layers = info->layers;
    index.sites = info->sites;
    index.row_shapes = info->row_shapes;
    index.dtype = info->dtype;
    index.hidden = info->row_shapes.empty() || info->row_shapes[0].empty() ? 0 : info->row_shapes[0].back();
    index.total_rows = info->total_rows;
    index.sequence = info->sequence;
    std::sort(index.chunks.begin(), index.chunks.end(), [](auto& a, auto& b) { return a.row_begin < b.row_begin; });
    return index;
  }

 protected:
  Status Fetch(const ActivationIndex& index, int64_t layer, const std::string& site,
               const std::vector<const StoredChunk*>& needed,
               const std::function<Status(const StoredChunk&, std::span<const uint8_t>)>& take) override {
    for (const StoredChunk* c : needed) {
      // The store checks the bytes against the checksum in its index. Through the page cache: reads
      // of rows come back to the same records (a notebook's slices), unlike an epoch of batches.
      STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes,
                              stores_[c->store]->ReadActivationInto(index.run, layer, site, c->row_begin, buffer_,
                                                                    storage::ColdRead::kThroughPageCache));
      STRATA_RETURN_IF_ERROR(take(*c, bytes));
    }
    return Status::Ok();
  }

 public:
  Result<std::span<const uint8_t>> ReadChunk(const ActivationIndex& index, const StoredChunk& chunk, int64_t layer,
                                             const std::string& site, storage::RecordBuffer& buffer,
                                             storage::ColdRead cold) override {
    STRATA_RETURN_IF_ERROR(index.CheckSite(layer, site));
    if (chunk.store >= stores_.size()) {
      return InvalidArgument("chunk at row " + std::to_string(chunk.row_begin) + " names store " +
                             std::to_string(chunk.store) + " of " + std::to_string(stores_.size()) +
                             "; pass a chunk of the index this reader made");
    }
    // The store reads the record straight into `buffer` and checks it against its checksum.
    STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, stores_[chunk.store]->ReadActivationInto(
                                                                index.run, layer, site, chunk.row_begin, buffer, cold));
    const uint64_t expected = chunk.row_count * index.RowBytes(site);
    if (bytes.size() != expected) {
      return Corruption(chunk.worker + " holds " + std::to_string(bytes.size()) + " bytes of " + site + " for rows " +
                        RangeText(chunk.row_begin, chunk.row_begin + chunk.row_count) + ", expected " +
                        std::to_string(expected));
    }
    return bytes;
  }

 private:
  std::vector<std::string> dirs_;
  std::vector<std::unique_ptr<storage::ShardStore>> stores_;
  storage::RecordBuffer buffer_;  // Fetch's, reused (a reader serves one thread at a time)
};

}  // namespace

std::vector<int64_t> ActivationIndex::RowShape(const std::string& site) const {
  for (size_t i = 0; i < sites.size() && i < row_shapes.size(); ++i) {
    if (sites[i] == site) return row_shapes[i];
  }
  return {hidden};
}

storage::DType ActivationIndex::SiteDType(const std::string& site) const {
  return ExtractSiteHoldsIds(site) ? storage::DType::kI32 : dtype;
}

uint64_t ActivationIndex::RowBytes(const std::string& site) const {
  uint64_t n = storage::DTypeSize(SiteDType(site));
  for (int64_t d : RowShape(site)) n *= static_cast<uint64_t>(d);
  return n;
}

Status ActivationIndex::CheckSite(int64_t layer, const std::string& site) const {
  if (std::find(layers.begin(), layers.end(), layer) == layers.end()) {
    std::vector<std::string> list;
    for (int64_t l : layers) list.push_back(std::to_string(l));
    return InvalidArgument("layer " + std::to_string(layer) + " was not captured by run " + run + "; its layers are " +
                           Join(list));
  }
  if (std::find(sites.begin(), sites.end(), site) == sites.end()) {
    return InvalidArgument("site " + site + " was not captured by run " + run + "; its sites are " + Join(sites));
  }
  if (!Holds(layer, site)) {
    const std::string last = std::to_string(*std::max_element(layers.begin(), layers.end()));
    return InvalidArgument("site " + site + " is the model's, stored once at the last layer (" + last +
                           "), not at layer " + std::to_string(layer) + "; read layer " + last);
  }
  return Status::Ok();
}

bool ActivationIndex::Holds(int64_t layer, const std::string& site) const {
  if (std::find(layers.begin(), layers.end(), layer) == layers.end()) return false;
  if (std::find(sites.begin(), sites.end(), site) == sites.end()) return false;
  return !IsModelLevelSite(site) || layer == *std::max_element(layers.begin(), layers.end());
}

uint64_t ActivationIndex::StoredBytesPerRow() const {
  uint64_t n = 0;
  for (int64_t layer : layers) {
    for (const auto& site : sites) n += Holds(layer, site) ? RowBytes(site) : 0;
  }
  return n;
}

std::vector<std::pair<uint64_t, uint64_t>> ActivationIndex::MissingRows() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t row = 0;
  for (const auto& c : chunks) {
    if (c.row_begin > row) out.emplace_back(row, c.row_begin);
    row = std::max(row, c.row_begin + c.row_count);
  }
  if (row < total_rows) out.emplace_back(row, total_rows);
  return out;
}

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

Result<std::span<const uint8_t>> ActivationReader::ReadChunk(const ActivationIndex& index, const StoredChunk& chunk,
                                                             int64_t layer, const std::string& site,
                                                             storage::RecordBuffer& buffer, storage::ColdRead) {
  const uint64_t size = chunk.row_count * index.RowBytes(site);
  uint8_t* out = buffer.Reserve(size);
  uint64_t at = 0;
  STRATA_RETURN_IF_ERROR(ReadRows(
      index, layer, site, chunk.row_begin, chunk.row_begin + chunk.row_count, [&](std::span<const uint8_t> bytes) {
        if (at + bytes.size() > size) {
          return Internal("the reader gave more bytes than chunk rows " + std::to_string(chunk.row_begin) + "+ hold");
        }
        std::memcpy(out + at, bytes.data(), bytes.size());
        at += bytes.size();
        return Status::Ok();
      }));
  if (at != size) {
    return Internal("the reader gave " + std::to_string(at) + " of the " + std::to_string(size) +
                    " bytes of chunk rows " + std::to_string(chunk.row_begin) + "+");
  }
  return std::span<const uint8_t>(out, size);
}

Result<std::unique_ptr<ActivationReader>> ActivationReader::Connect(const std::string& coordinator, int timeout_ms,
                                                                    std::optional<curve::ClientKeys> keys) {
  return std::unique_ptr<ActivationReader>(std::make_unique<ReaderImpl>(coordinator, timeout_ms, std::move(keys)));
}

Result<std::unique_ptr<ActivationReader>> ActivationReader::OpenStores(const std::vector<std::string>& dirs) {
  if (dirs.empty())
    return InvalidArgument("no store given: pass --store DIR (a worker's store directory), once per worker");
  std::vector<std::unique_ptr<storage::ShardStore>> stores;
  storage::StoreOptions options;
  options.read_only = true;
  options.create_if_missing = false;
  for (const std::string& dir : dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      return NotFound("store " + dir +
                      " does not exist or is not a directory; give a worker's store directory "
                      "(STATE_DIR/workers/NAME/store for a local cluster)");
    }
    auto store = storage::ShardStore::Open(dir, options);
    if (!store.ok()) return Status(store.status().code(), "opening store " + dir + ": " + store.status().message());
    stores.push_back(std::move(*store));
  }
  return std::unique_ptr<ActivationReader>(std::make_unique<StoreReaderImpl>(dirs, std::move(stores)));
}

}  // namespace strata::activations
