// ShardStore: one RocksDB per process (a worker's shard store, or the coordinator's metadata
// store), speaking bytes + dtype + shape - never torch::Tensor.
//
// Layout. Three column families:
//   checkpoints  tensor records (small tensors inline, large ones as references into STORE/checkpoints/ data files) and
//   manifests activations  the index of captured activations (bytes in STORE/activations/ chunk files) and per-chunk
//   cursors metadata     small records (runs, events, manifests of the coordinator) under caller keys
// Keys are order-preserving: strings are length-prefixed, numbers big-endian, so all of one run's
// checkpoint at one step is one contiguous range and steps sort numerically.
//
// Records. Every tensor value is [u32 header length][TensorHeader (Cap'n Proto)][raw bytes]; the
// header holds dtype, shape, byte order, codec and an XXH3-64 checksum of the raw bytes. A read
// whose bytes fail the checksum returns Corruption, never the data.
//
// Checkpoints. PutCheckpointTensor stages tensors of (run, step); they are invisible until
// CommitCheckpoint syncs their data and writes the manifest (synced to disk). The bytes of large
// tensors are in STORE/checkpoints/ data files, indexed by RocksDB, like activations. Listing and reading go through
// the manifest only, so a writer killed mid-checkpoint leaves no partial checkpoint visible.
//
// Thread safety: all methods may be called from several threads (RocksDB is thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace strata::storage {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3, kI64 = 4, kI32 = 5, kU16 = 6, kU8 = 7 };
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "f32", "bf16", ...

// A borrowed tensor to write.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;  // numel(shape) * DTypeSize(dtype) bytes, little-endian
};

// An owned tensor read back (checksum already verified).
struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  uint64_t checksum = 0;  // XXH3-64 of bytes
};

// XXH3-64 of a byte range: the checksum stored in every record.
uint64_t Checksum(std::span<const uint8_t> bytes);

struct CheckpointTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t checksum = 0;
  uint64_t size_bytes = 0;
};

struct CheckpointInfo {
  std::string run;
  int64_t step = 0;
  std::vector<CheckpointTensorInfo> tensors;  // sorted by name
};

// Extract runs: one chunk of captured rows, all of its (layer, site) records.
struct ActivationChunkInfo {
  uint64_t chunk = 0;
  uint64_t row_begin = 0;
  uint64_t row_count = 0;
  uint64_t bytes = 0;  // raw bytes of all its records
};

struct ActivationRecordView {
  int64_t layer = 0;
  std::string site;   // "resid_post", "attn_out", "mlp_out"
  TensorView tensor;  // [row_count, hidden]
};

// Extract runs: what a store keeps of the run beside its chunks, so that it can be read without a
// coordinator (`strata activations get --store`, Python `stores=`): every worker of the run writes
// the same record before its first chunk.
struct ActivationRunInfo {
  std::vector<int64_t> layers;                   // ascending
  std::vector<std::string> sites;                // storage order
  std::vector<std::vector<int64_t>> row_shapes;  // per site: the shape of one row (ExtractSiteRowShape)
  DType dtype = DType::kF32;
  uint64_t total_rows = 0;  // rows of the whole capture (all workers)
  uint64_t sequence = 0;    // tokens per sequence
  bool operator==(const ActivationRunInfo&) const = default;
};

// Where one activation record's bytes lie in its store.
struct ActivationLocation {
  std::string file;  // its chunk file (STORE/activations/RUN/CHUNK.bin)
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes
};

// How a read of a record that is not in the page cache goes to the disk (ReadActivationInto).
enum class ColdRead { kDirect, kThroughPageCache };

// A buffer that record reads reuse (ShardStore::ReadActivationInto): 4 KiB-aligned, as reads that
// bypass the page cache (O_DIRECT) need, and never zero-filled; from 2 MiB on, 2 MiB-aligned and
// asked to be on huge pages (MADV_HUGEPAGE). Move-only; not thread-safe.
class RecordBuffer {
 public:
  static constexpr size_t kAlignment = 4096;
  RecordBuffer() = default;
  RecordBuffer(RecordBuffer&& other) noexcept;
  RecordBuffer& operator=(RecordBuffer&& other) noexcept;
  RecordBuffer(const RecordBuffer&) = delete;
  RecordBuffer& operator=(const RecordBuffer&) = delete;
  ~RecordBuffer();
  // At least `size` bytes, aligned; what the buffer held is lost when it grows.
  uint8_t* Reserve(size_t size);
  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

// The pseudo-site of a chunk's token record, stored beside its activations at layer 0: int64
// [row_count, 3], per row (token id, document, position) - docs/python.md, "Tokens". No real
// site starts with '#'.
inline constexpr const char* kActivationTokensSite = "#tokens";
inline constexpr int64_t kActivationTokenColumns = 3;

struct StoreOptions {
  bool create_if_missing = true;
  // Opens a store that another process may hold open for writing (no lock taken): reads see what
  // was committed when it was opened; every write returns an error.
  bool read_only = false;
  // Checkpoint tensors at least this big go to data files beside the RocksDB (written once,
  // read straight into the reader's buffer); smaller ones are inline records.
  uint64_t file_threshold = 64 * 1024;
  // A store whose write-ahead log or table files are damaged does not open (Corruption naming the
  // store and what to do): RocksDB's default would replay the log up to the damage and silently
  // drop every commit after it. With salvage, the damaged files are first copied to
  // STORE/damaged-<unix time>/, then the store opens with what is intact (the log replayed up to
  // the damage; RocksDB's repair when table files are damaged). Whoever salvages must treat what
  // the store no longer lists as lost (the coordinator reconciles at registration).
  bool salvage = false;
};

// A committed checkpoint of some run held in a store (its manifest exists).
struct StoredCheckpoint {
  std::string run;  // the key it is stored under (the run id, or a recut key: see Trainer)
  int64_t step = 0;
  bool operator==(const StoredCheckpoint&) const = default;
  auto operator<=>(const StoredCheckpoint&) const = default;
};

class ShardStore {
 public:
  // Opens (creating if asked) the store at `path`.
  static Result<std::unique_ptr<ShardStore>> Open(const std::string& path, const StoreOptions& options = {});
  virtual ~ShardStore() = default;

  // ---- checkpoints ----
  // Stages one tensor of checkpoint (run, step). Invisible until CommitCheckpoint.
  virtual Status PutCheckpointTensor(const std::string& run, int64_t step, const std::string& name,
                                     const TensorView& tensor) = 0;
  // Makes checkpoint (run, step) visible: verifies every staged tensor is present and writes the
  // manifest durably (WAL synced). Committing twice is an error (AlreadyExists).
  virtual Status CommitCheckpoint(const std::string& run, int64_t step) = 0;
  // Committed checkpoints of `run`, ascending by step.
  virtual Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& run) = 0;
  // Every committed checkpoint of every run in this store, ordered by (run, step).
  virtual Result<std::vector<StoredCheckpoint>> ListAllCheckpoints() = 0;
  // Deletes committed checkpoint (run, step): its manifest first (synced: from then on it is not
  // listed and cannot be read), then its tensor records and the data files only it referenced.
  // NotFound when it is not committed. A crash midway leaves unreferenced bytes that the next
  // open collects, never a listed checkpoint with missing bytes.
  virtual Status DeleteCheckpoint(const std::string& run, int64_t step) = 0;
  // Committed checkpoint (run, step), or nullopt when there is none: one lookup, not a listing.
  virtual Result<std::optional<CheckpointInfo>> GetCheckpoint(const std::string& run, int64_t step) = 0;
  // A tensor of a committed checkpoint. NotFound if the checkpoint is not committed or lacks
  // `name`; Corruption if the stored bytes fail their checksum.
  virtual Result<Tensor> ReadCheckpointTensor(const std::string& run, int64_t step, const std::string& name) = 0;
  // The same, into `out`, which must be exactly the tensor's size (else InvalidArgument): a large
  // restore places bytes where they belong instead of through a copy of its own.
  virtual Status ReadCheckpointTensorInto(const std::string& run, int64_t step, const std::string& name, DType dtype,
                                          std::span<uint8_t> out) = 0;

  // ---- activations (extract runs) ----
  // Stores every record of one chunk, then its cursor entry. The chunk exists (for Get/List and
  // reads) only once the cursor is durable, so a writer killed midway leaves no visible part of it
  // and a resumed run simply writes it again. The bytes go to one file per chunk under
  // STORE/activations/ (each byte written once, fdatasync'ed); RocksDB holds the index.
  virtual Status PutActivationChunk(const std::string& run, const ActivationChunkInfo& chunk,
                                    std::span<const ActivationRecordView> records) = 0;
  // The run record of an extract run (ActivationRunInfo), replaced if present; synced.
  virtual Status PutActivationRun(const std::string& run, const ActivationRunInfo& info) = 0;
  // nullopt when this store holds no record of `run` (another run, or a capture of a version
  // before the record existed).
  virtual Result<std::optional<ActivationRunInfo>> GetActivationRun(const std::string& run) = 0;
  virtual Result<std::optional<ActivationChunkInfo>> GetActivationChunk(const std::string& run, uint64_t chunk) = 0;
  virtual Result<std::vector<ActivationChunkInfo>> ListActivationChunks(const std::string& run) = 0;
  // The record of (run, layer, site) of the stored chunk starting at row_begin. NotFound if no
  // stored chunk starts there or it lacks that layer/site; Corruption if its bytes are damaged.
  virtual Result<Tensor> ReadActivation(const std::string& run, int64_t layer, const std::string& site,
                                        uint64_t row_begin) = 0;
  // The same record read into `buffer` (grown as needed, reused across calls: no allocation and no
  // zero-fill per record); the span of its bytes in `buffer`, valid until the buffer's next use,
  // checksum verified. A record the page cache holds whole is copied from it. One it does not is
  // read as `cold` says: kDirect (O_DIRECT, one request for the whole record: the disk's
  // sequential bandwidth, and nothing else the page cache holds is pushed out, but the next read
  // of it is cold again) or kThroughPageCache (a buffered read: the kernel's read-ahead paces it,
  // and the record stays cached for the next read while memory lasts).
  virtual Result<std::span<const uint8_t>> ReadActivationInto(const std::string& run, int64_t layer,
                                                              const std::string& site, uint64_t row_begin,
                                                              RecordBuffer& buffer, ColdRead cold) = 0;
  // Where that record's bytes lie, for readers that schedule their own I/O (bench/read_pattern_bench).
  virtual Result<ActivationLocation> LocateActivation(const std::string& run, int64_t layer, const std::string& site,
                                                      uint64_t row_begin) = 0;

  // ---- metadata (small records under caller-chosen keys, ordered bytewise) ----
  virtual Status PutMetadata(const std::string& key, std::span<const uint8_t> value, bool sync = true) = 0;
  virtual Result<std::optional<std::vector<uint8_t>>> GetMetadata(const std::string& key) = 0;
  // All (key, value) pairs whose key starts with `prefix`, in key order.
  virtual Result<std::vector<std::pair<std::string, std::vector<uint8_t>>>> ScanMetadata(const std::string& prefix) = 0;
  virtual Status DeleteMetadata(const std::string& key) = 0;
};

// Order-preserving key pieces, exposed for other components' metadata keys.
std::string EncodeKeyString(const std::string& s);  // u32 BE length + bytes
std::string EncodeKeyU64(uint64_t v);               // 8 bytes big-endian
// Parse one such piece off the front of `in`; false if malformed.
bool ConsumeKeyString(std::string_view* in, std::string* out);
bool ConsumeKeyU64(std::string_view* in, uint64_t* out);
// A key (or any stored bytes) as text for a message: printable ASCII as is, every other byte as
// \xNN. Keys hold binary length prefixes and user text: a NUL must not cut a message short, nor an
// escape sequence reach a terminal.
std::string PrintableKey(std::string_view key);

// The disk a store at `path` writes to. `reserve`: what bulk writes (checkpoint tensors,
// activation chunks) leave free for the store's own upkeep (5% of the filesystem, at least 16 MiB
// and at most 256 MiB); a write of N bytes fits when free >= N + reserve. IoError when statvfs
// cannot tell.
struct StoreDisk {
  uint64_t total = 0;
  uint64_t free = 0;  // for unprivileged writers (f_bavail)
  uint64_t reserve = 0;
  uint64_t fs_id = 0;
  uint64_t writable() const { return free > reserve ? free - reserve : 0; }
  // Small control-plane writes (records, events, manifests) may use all but a quarter of it.
  uint64_t metadata_reserve() const { return reserve / 4; }
};
Result<StoreDisk> StoreDiskOf(const std::string& path);

}  // namespace strata::storage
