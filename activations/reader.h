// Reading captured activations of extract runs. Two sources:
//   Connect(coordinator)  the coordinator holds the index (which worker's store holds which rows),
//                         the workers' store servers hold the bytes: any machine that reaches it.
//   OpenStores(dirs)      the worker stores' directories themselves, opened read-only: every store
//                         keeps the run's record (layers, sites, row shapes, rows) beside its
//                         chunks, so this works with the cluster down (`strata down`).
// Used by `strata activations`, the Python package (python/) and programs.
//
//   auto reader = ActivationReader::Connect("ipc:///.../coordinator.sock");
//   auto index = (*reader)->Index("run-id");                       // layers, sites, rows, dtype
//   (*reader)->ReadRows(*index, /*layer=*/3, "resid_post", 0, 4096, sink);  // [rows, row shape...]
//   (*reader)->ReadTokens(*index, 0, 4096, sink);  // int64 [rows, 3]: token id, document, position
//
// A reader is used by one thread at a time; open one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/curve.h"
#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::activations {

struct StoredChunk {
  uint64_t chunk = 0;
  uint64_t row_begin = 0;
  uint64_t row_count = 0;
  uint64_t bytes = 0;
  std::string worker;         // the worker's name, or the store directory (OpenStores)
  std::string serve_address;  // its store server (Connect)
  size_t store = 0;           // OpenStores: which of the given stores holds it
};

struct ActivationIndex {
  std::string run;
  std::string state;  // "running", "finished", ...
  std::vector<int64_t> layers;
  std::vector<std::string> sites;
  storage::DType dtype = storage::DType::kF32;
  int64_t hidden = 0;
  std::vector<std::vector<int64_t>> row_shapes;  // per site, in the order of sites
  uint64_t sequence = 0;                         // tokens per sequence; 0 when the source does not say
  uint64_t total_rows = 0;                       // when the capture is complete
  std::vector<StoredChunk> chunks;               // stored so far, ascending by row_begin
  // Where the index came from, for messages: "coordinator ADDR" or "stores DIR, DIR".
  std::string source;
  bool offline = false;  // OpenStores: rows not in the given stores are missing, not pending

  // The shape of one row of `site` ([hidden] for a site not listed), and its size in bytes.
  std::vector<int64_t> RowShape(const std::string& site) const;
  uint64_t RowBytes(const std::string& site) const;
  // The dtype of a site's records: `dtype`, except token-id sites (logits_ids: int32).
  storage::DType SiteDType(const std::string& site) const;
  // InvalidArgument naming `layer` or `site` and listing the captured ones, when not captured (a
  // model-level site - final_norm, logits, logits_ids - is stored at the last layer only).
  Status CheckSite(int64_t layer, const std::string& site) const;
  // Whether the run stores (layer, site): a captured layer and site, model-level sites at the last layer.
  bool Holds(int64_t layer, const std::string& site) const;
  // The bytes of every record of one row: each (layer, site) the run stores.
  uint64_t StoredBytesPerRow() const;
  // [begin, end) ranges of rows of [0, total_rows) that no stored chunk holds, ascending.
  std::vector<std::pair<uint64_t, uint64_t>> MissingRows() const;

  uint64_t stored_rows() const;
  bool complete() const { return stored_rows() == total_rows; }
  // The end of the stored run of rows that starts at `row` (== row if `row` is not stored).
  uint64_t stored_until(uint64_t row) const;
  // Rows [0, n) are all stored: the prefix a query may read during a running capture.
  uint64_t contiguous_rows() const { return stored_until(0); }
};

class ActivationReader {
 public:
  // `keys`: CURVE client keys for tcp:// coordinators and store servers.
  static Result<std::unique_ptr<ActivationReader>> Connect(const std::string& coordinator, int timeout_ms = 10000,
                                                           std::optional<curve::ClientKeys> keys = std::nullopt);
  // The stores at `dirs` (a worker's --store directory each), opened read-only: a running worker
  // may hold them, and nothing is written. Index() says which rows none of them holds.
  static Result<std::unique_ptr<ActivationReader>> OpenStores(const std::vector<std::string>& dirs);
  virtual ~ActivationReader() = default;

  // NotFound for an unknown run, InvalidArgument for a run that is not an extract run.
  virtual Result<ActivationIndex> Index(const std::string& run) = 0;

  // Streams rows [begin, end) of (layer, site), in row order, to `sink` as raw little-endian bytes
  // of index.dtype, row-major [rows, row shape...]. Every byte is checked against its record's XXH3
  // checksum. Errors (checked before any byte is sent): layer or site not captured, rows beyond
  // what is stored (during a running capture: beyond the stored prefix; offline: rows in none of
  // the given stores, named).
  virtual Status ReadRows(const ActivationIndex& index, int64_t layer, const std::string& site, uint64_t begin,
                          uint64_t end, const std::function<Status(std::span<const uint8_t>)>& sink) = 0;
  // The whole record (layer, site) of one stored chunk of `index`, into `buffer` (reused across
  // calls: nothing allocated or zero-filled per chunk); the span of its bytes there (row_count rows),
  // valid until the buffer's next use, every byte checked against the record's checksum. From
  // stores (OpenStores) a record not in the page cache is read as `cold` says
  // (ShardStore::ReadActivationInto: kDirect is one O_DIRECT request); from the cluster it is
  // copied out of what ReadRows streams (the store servers' reads are theirs).
  virtual Result<std::span<const uint8_t>> ReadChunk(const ActivationIndex& index, const StoredChunk& chunk,
                                                     int64_t layer, const std::string& site,
                                                     storage::RecordBuffer& buffer, storage::ColdRead cold);
  // The same for the rows' tokens: int64 [rows, 3], per row (token id, document, position).
  // NotFound for a capture stored before chunks kept their tokens.
  virtual Status ReadTokens(const ActivationIndex& index, uint64_t begin, uint64_t end,
                            const std::function<Status(std::span<const uint8_t>)>& sink) = 0;
};

}  // namespace strata::activations
