// RocksDbShardStore, the ShardStore that ShardStore::Open returns (internal to storage/: nothing
// outside it includes this header; shard_store.h is the library's interface). Its definitions are
// split by what they serve:
//   rocksdb_shard_store.cc  opening and recovery, metadata, the shared helpers (and why the store has this shape)
//   rocksdb_checkpoints.cc  checkpoint tensors: staging, commit, reads, deletion, collecting what dead attempts left
//   rocksdb_activations.cc  activation chunks of extract runs: their files, index and cursors
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/slice.h>
#include <rocksdb/status.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "storage/data_files.h"
#include "storage/metadata_batch.h"
#include "storage/shard_store.h"

namespace strata::storage::internal {

inline std::string_view View(const rocksdb::Slice& s) { return {s.data(), s.size()}; }

// Turns a RocksDB status into ours; `action` says what failed ("committing checkpoint ...").
Status FromRocks(const rocksdb::Status& s, const std::string& path, const std::string& action);

class RocksDbShardStore final : public ShardStore {
 public:
  RocksDbShardStore(std::string path, rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*> handles,
                    bool read_only, uint64_t file_threshold);
  ~RocksDbShardStore() override;

  // ---- checkpoints (rocksdb_checkpoints.cc)
  Status PutCheckpointTensor(const std::string& run, int64_t step, const std::string& name,
                             const TensorView& tensor) override;
  Status CommitCheckpoint(const std::string& run, int64_t step) override;
  Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& run) override;
  Result<std::optional<CheckpointInfo>> GetCheckpoint(const std::string& run, int64_t step) override;
  Result<std::vector<StoredCheckpoint>> ListAllCheckpoints() override;
  Status DeleteCheckpoint(const std::string& run, int64_t step) override;
  void CollectOrphans();  // at open, before any write (ShardStore::Open)
  Result<Tensor> ReadCheckpointTensor(const std::string& run, int64_t step, const std::string& name) override;
  Status ReadCheckpointTensorInto(const std::string& run, int64_t step, const std::string& name, DType dtype,
                                  std::span<uint8_t> out) override;
  Status ReadCheckpointBytes(const std::string& run, int64_t step, const std::string& name,
                             const std::function<Result<std::span<uint8_t>>(const CheckpointTensorInfo&)>& into);

  // ---- activations (rocksdb_activations.cc)
  Status PutActivationChunk(const std::string& run, const ActivationChunkInfo& chunk,
                            std::span<const ActivationRecordView> records) override;
  Status PutActivationRun(const std::string& run, const ActivationRunInfo& info) override;
  Result<std::optional<ActivationRunInfo>> GetActivationRun(const std::string& run) override;
  Result<std::optional<ActivationChunkInfo>> GetActivationChunk(const std::string& run, uint64_t chunk) override;
  Result<std::vector<ActivationChunkInfo>> ListActivationChunks(const std::string& run) override;
  Result<Tensor> ReadActivation(const std::string& run, int64_t layer, const std::string& site,
                                uint64_t row_begin) override;
  Result<std::span<const uint8_t>> ReadActivationInto(const std::string& run, int64_t layer, const std::string& site,
                                                      uint64_t row_begin, RecordBuffer& buffer, ColdRead cold) override;
  Result<ActivationLocation> LocateActivation(const std::string& run, int64_t layer, const std::string& site,
                                              uint64_t row_begin) override;

  // ---- metadata (rocksdb_shard_store.cc)
  Status PutMetadata(const std::string& key, std::span<const uint8_t> value, bool sync) override;
  Result<std::optional<std::vector<uint8_t>>> GetMetadata(const std::string& key) override;
  Result<std::vector<std::pair<std::string, std::vector<uint8_t>>>> ScanMetadata(const std::string& prefix) override;
  Status PutMetadataBatch(std::span<const MetadataPut> puts);  // metadata_batch.h's, for this store
  Status DeleteMetadata(const std::string& key) override;

 private:
  // ---- shared (rocksdb_shard_store.cc)
  Status Damaged(const std::string& what, const std::string& reason) const;
  // `metadata`: a small control-plane write (run records, events, a checkpoint's manifest), which
  // may use the bulk writes' reserve down to its last quarter (StoreDisk::metadata_reserve).
  Status EnsureSpace(uint64_t bytes, const std::string& action, bool metadata = false) const;

  // ---- checkpoint data files (rocksdb_checkpoints.cc)
  // One per (run, step) and staging attempt of this process, appended to at reserved offsets.
  struct StagingFile {
    std::string name;  // within CheckpointDir(run)
    ChunkFileWriter writer;
    std::atomic<uint64_t> end{0};
    std::shared_mutex mu;  // writes hold it shared; the commit that closes the file, exclusive
    bool closed = false;
  };

  std::string CheckpointDir(const std::string& run) const;
  static int64_t StepOfDataFile(const std::string& name);
  std::set<std::string> FilesReferenced(const std::string& run, int64_t step);
  Status DeleteTensorRecords(const std::string& run, int64_t step, const std::string& action);
  void RemoveStepFiles(const std::string& run, int64_t step, const std::set<std::string>& keep);
  Result<std::shared_ptr<StagingFile>> StagingFileFor(const std::string& run, int64_t step);
  Status SyncDataFile(const std::string& path, uint64_t end, const std::string& what);

  // ---- activation chunk files and their index (rocksdb_activations.cc)
  static std::string ActivationWhat(const std::string& run, int64_t layer, const std::string& site, uint64_t row_begin);
  std::string ChunkDir(const std::string& run) const;
  std::string ChunkFile(const std::string& run, uint64_t chunk) const;

  // Index entry of one record: chunk, offset and size in its chunk file, checksum, dtype, shape.
  struct RecordRef {
    uint64_t chunk = 0, offset = 0, size = 0, checksum = 0;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
  };
  static std::string EncodeRecordRef(uint64_t chunk, uint64_t offset, uint64_t checksum, const TensorView& t);
  static bool DecodeRecordRef(std::string_view v, RecordRef* ref);
  Result<RecordRef> FindRecord(const std::string& run, int64_t layer, const std::string& site, uint64_t row_begin,
                               const std::string& what);
  static std::string EncodeRunInfo(const ActivationRunInfo& info);
  static bool DecodeRunInfo(std::string_view v, ActivationRunInfo* info);
  static std::string EncodeCursor(const ActivationChunkInfo& c);
  Result<ActivationChunkInfo> DecodeCursor(const std::string& run, std::string_view v) const;

  // ---- checkpoint manifests (rocksdb_checkpoints.cc)
  Result<bool> ManifestExists(const std::string& run, int64_t step);
  Result<std::shared_ptr<const CheckpointInfo>> CommittedManifest(const std::string& run, int64_t step);
  Result<CheckpointInfo> DecodeManifestAt(const std::string& run, int64_t step, const rocksdb::Slice& value) const;

  const std::string path_;
  rocksdb::DB* const db_;  // owned; closed in the destructor after its column family handles
  const std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // default, checkpoints, activations, metadata
  rocksdb::ColumnFamilyHandle* checkpoints_ = nullptr;
  rocksdb::ColumnFamilyHandle* activations_ = nullptr;
  const bool read_only_;
  rocksdb::ColumnFamilyHandle* metadata_ = nullptr;
  const uint64_t file_threshold_;
  Mutex commit_mu_;
  Mutex staging_mu_;
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<StagingFile>> staging_ STRATA_GUARDED_BY(staging_mu_);
  Mutex manifest_mu_;
  std::shared_ptr<const CheckpointInfo> last_manifest_ STRATA_GUARDED_BY(manifest_mu_);
};

}  // namespace strata::storage::internal
