// Reading captured activations of extract runs, from any machine that reaches the coordinator:
// the coordinator holds the index (which worker's store holds which rows), the workers' store
// servers hold the bytes. Used by `strata activations` and by programs.
//
//   auto reader = ActivationReader::Connect("ipc:///.../coordinator.sock");
//   auto index = (*reader)->Index("run-id");                       // layers, sites, rows, dtype
//   (*reader)->ReadRows(*index, /*layer=*/3, "resid_post", 0, 4096, sink);  // [rows, hidden]
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
  std::string worker;
  std::string serve_address;
};

struct ActivationIndex {
  std::string run;
  std::string state;  // "running", "finished", ...
  std::vector<int64_t> layers;
  std::vector<std::string> sites;
  storage::DType dtype = storage::DType::kF32;
  int64_t hidden = 0;
  uint64_t total_rows = 0;          // when the capture is complete
  std::vector<StoredChunk> chunks;  // stored so far, ascending by row_begin

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
  virtual ~ActivationReader() = default;

  // NotFound for an unknown run, InvalidArgument for a run that is not an extract run.
  virtual Result<ActivationIndex> Index(const std::string& run) = 0;

  // Streams rows [begin, end) of (layer, site), in row order, to `sink` as raw little-endian bytes
  // of index.dtype, row-major [rows, hidden]. Every byte is checked against its record's XXH3
  // checksum. Errors (checked before any byte is sent): layer or site not captured, rows beyond
  // what is stored (during a running capture: beyond the stored prefix).
  virtual Status ReadRows(const ActivationIndex& index, int64_t layer, const std::string& site, uint64_t begin,
                          uint64_t end, const std::function<Status(std::span<const uint8_t>)>& sink) = 0;
};

}  // namespace strata::activations
