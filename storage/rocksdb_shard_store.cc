// RocksDbShardStore: the ShardStore behind ShardStore::Open, one RocksDB with column families
//   checkpoints  tensor records or data-file references + checkpoint manifests (keys in keys.h, values in records.h)
//   activations  captured activations of extract runs: records + per-chunk cursors (keys.h)
//   metadata     caller-keyed small records
// Why this shape: tensors are big and written once. RocksDB copies a value four times on its way
// to disk (write batch, WAL, memtable, blob file at flush) - a 1B model's 5 GB shard took 30 s on
// an H100 node. So the bytes of checkpoint tensors of file_threshold or more, like activations,
// go to data files of their own (STORE/checkpoints/<hex run>/<step>-<attempt>.bin, one per
// staging attempt, each byte written once from the caller's buffer and read straight into the
// reader's), and RocksDB keeps a small reference under the tensor's key; smaller tensors are
// inline records. A checkpoint becomes visible through a single synced manifest write, which is
// the commit point, after its data files are synced: a writer that dies mid-checkpoint leaves
// only unreferenced records and files, never a half-visible checkpoint. Every read re-verifies
// the XXH3 checksum and the manifest's view of the tensor, so damaged bytes surface as Corruption.
// Stores written before the data files keep their tensors as inline records (some in blob files),
// which read as before.
#include "storage/rocksdb_shard_store.h"

#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "storage/metadata_batch.h"
#include "storage/wal_tail.h"

namespace strata::storage::internal {

Status FromRocks(const rocksdb::Status& s, const std::string& path, const std::string& action) {
  if (s.ok()) return Status::Ok();
  const std::string detail = s.ToString();
  if (s.IsCorruption()) {
    return Corruption(action + " failed: the store at " + path + " is damaged (" + detail +
                      "); restore it from a replica or an older checkpoint");
  }
  if (s.IsNoSpace()) {
    return Status(StatusCode::kResourceExhausted, action + " failed: the disk holding the store at " + path +
                                                      " is full (" + detail +
                                                      "); free space or choose another --store");
  }
  if (s.IsIOError() && detail.find("lock") != std::string::npos) {
    return IoError(action + " failed: another process (or this one) holds the store at " + path + " open (" + detail +
                   "); stop it (strata down) or choose another --store");
  }
  if (s.IsInvalidArgument() || s.IsNotSupported()) {
    return InvalidArgument(action + " failed for the store at " + path + ": " + detail);
  }
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) {
    return Unavailable(action + " failed: the store at " + path + " is busy (" + detail + "); retry");
  }
  return IoError(action + " failed for the store at " + path + " (" + detail +
                 "); check that the directory is writable and its disk is healthy");
}

RocksDbShardStore::RocksDbShardStore(std::string path, rocksdb::DB* db,
                                     std::vector<rocksdb::ColumnFamilyHandle*> handles, bool read_only,
                                     uint64_t file_threshold)
    : path_(std::move(path)),
      db_(db),
      handles_(std::move(handles)),
      read_only_(read_only),
      file_threshold_(file_threshold) {
  checkpoints_ = handles_[1];
  activations_ = handles_[2];
  metadata_ = handles_[3];
}

RocksDbShardStore::~RocksDbShardStore() {
  for (rocksdb::ColumnFamilyHandle* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
  rocksdb::Status s = db_->Close();
  if (!s.ok()) STRATA_LOG(kWarn) << "closing the store at " << path_ << ": " << s.ToString();
  delete db_;
}

Status RocksDbShardStore::PutMetadata(const std::string& key, std::span<const uint8_t> value, bool sync) {
  const std::string action = "writing metadata key '" + PrintableKey(key) + "'";
  STRATA_RETURN_IF_ERROR(EnsureSpace(key.size() + value.size(), action, /*metadata=*/true));
  rocksdb::WriteOptions options;
  options.sync = sync;
  rocksdb::Slice slice(reinterpret_cast<const char*>(value.data()), value.size());
  return FromRocks(db_->Put(options, metadata_, key, slice), path_, action);
}

Result<std::optional<std::vector<uint8_t>>> RocksDbShardStore::GetMetadata(const std::string& key) {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), metadata_, key, &value);
  if (s.IsNotFound()) return std::optional<std::vector<uint8_t>>();
  STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading metadata key '" + key + "'"));
  return std::optional<std::vector<uint8_t>>(std::in_place, value.data(), value.data() + value.size());
}

Result<std::vector<std::pair<std::string, std::vector<uint8_t>>>> RocksDbShardStore::ScanMetadata(
    const std::string& prefix) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), metadata_));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const rocksdb::Slice value = it->value();
    out.emplace_back(it->key().ToString(), std::vector<uint8_t>(value.data(), value.data() + value.size()));
  }
  STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, "scanning metadata under '" + prefix + "'"));
  return out;
}

Status RocksDbShardStore::PutMetadataBatch(std::span<const MetadataPut> puts) {
  size_t bytes = 0;
  rocksdb::WriteBatch batch;
  for (const MetadataPut& put : puts) {
    bytes += put.key.size() + put.value.size();
    rocksdb::Status s = batch.Put(metadata_, put.key, put.value);
    if (!s.ok()) return FromRocks(s, path_, "batching metadata key '" + PrintableKey(put.key) + "'");
  }
  const std::string action = "writing " + std::to_string(puts.size()) + " metadata keys";
  STRATA_RETURN_IF_ERROR(EnsureSpace(bytes, action, /*metadata=*/true));
  rocksdb::WriteOptions options;
  options.sync = true;
  return FromRocks(db_->Write(options, &batch), path_, action);
}

Status RocksDbShardStore::DeleteMetadata(const std::string& key) {
  rocksdb::WriteOptions options;
  options.sync = true;
  return FromRocks(db_->Delete(options, metadata_, key), path_, "deleting metadata key '" + PrintableKey(key) + "'");
}

Status RocksDbShardStore::Damaged(const std::string& what, const std::string& reason) const {
  return Corruption(what + " " + reason + ": the store at " + path_ +
                    " is damaged; restore it from a replica or an older checkpoint");
}

// A write that would leave less free space than the reserve is refused before RocksDB meets
// ENOSPC: Debian's librocksdb keeps its assertions, and its log writer's error path aborts the
// process on the next write after a failed one (WritableFileWriter::AssertFalseAndGetStatusForPrevError,
// measured on a full tmpfs), and a flush or compaction needs room of its own (StoreDiskOf).
// Small control-plane writes may go further into the reserve than bulk data (checkpoint tensors,
// activation chunks): a checkpoint that fills a disk shared with the coordinator (a local cluster)
// must not stop the coordinator's records, which say what is going on.
Status RocksDbShardStore::EnsureSpace(uint64_t bytes, const std::string& action, bool metadata) const {
  auto disk = StoreDiskOf(path_);
  if (!disk.ok()) return Status::Ok();  // cannot tell: let the write say
  const uint64_t reserve = metadata ? disk->metadata_reserve() : disk->reserve;
  if (disk->free >= bytes + reserve) return Status::Ok();
  return Status(StatusCode::kResourceExhausted,
                action + " failed: the disk holding the store at " + path_ + " is full (" +
                    std::to_string(disk->free >> 20) + " MiB free; this write needs " +
                    std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB and " + std::to_string(reserve >> 20) +
                    " MiB stay free for the store's own upkeep); free space, lower "
                    "train.keep_checkpoints, or choose another --store");
}

}  // namespace strata::storage::internal

namespace strata::storage {

Result<StoreDisk> StoreDiskOf(const std::string& path) {
  struct statvfs fs {};
  if (::statvfs(path.c_str(), &fs) != 0) {
    return IoError("cannot read the free space of " + path + ": " + std::strerror(errno));
  }
  StoreDisk disk;
  disk.total = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  disk.free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  disk.reserve = std::clamp<uint64_t>(disk.total / 20, uint64_t{16} << 20, uint64_t{256} << 20);
  disk.fs_id = static_cast<uint64_t>(fs.f_fsid);
  return disk;
}

namespace {

constexpr const char* kCheckpointsCf = "checkpoints";
constexpr const char* kActivationsCf = "activations";
constexpr const char* kMetadataCf = "metadata";

// RocksDB's two reports, under kAbsoluteConsistency, of a record running past the end of the
// log (log_reader.cc: a bad record length at EOF, a fragmented record at EOF). A flipped length
// field in the last block reads the same, so the log itself decides (storage/wal_tail.h).
bool LogIsCut(const std::string& store_path) {
  Result<bool> cut = LogEndsInCutRecord(NewestLog(store_path));
  return cut.ok() && *cut;
}

bool IsTornLogTail(const rocksdb::Status& status) {
  const std::string what = status.ToString();
  return what.find("truncated record body") != std::string::npos ||
         what.find("error reading trailing data") != std::string::npos;
}

}  // namespace

using internal::FromRocks;
using internal::RocksDbShardStore;

// Copies the store's log and descriptor files to STORE/damaged-<unix time>/ before a salvage
// changes them: what the salvage drops stays on disk for a person to look at.
static Result<std::string> KeepDamagedFiles(const std::string& path) {
  const auto now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string kept = path + "/damaged-" + std::to_string(now);
  std::error_code ec;
  std::filesystem::create_directories(kept, ec);
  if (ec)
    return IoError("cannot create " + kept + " to keep the damaged files before salvaging (" + ec.message() + ")");
  for (const auto& file : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = file.path().filename().string();
    const bool log = file.path().extension() == ".log", table = file.path().extension() == ".sst";
    if (!file.is_regular_file() || !(log || table || name.rfind("MANIFEST-", 0) == 0 || name == "CURRENT")) continue;
    std::filesystem::copy_file(file.path(), kept + "/" + name, ec);
    if (ec)
      return IoError("cannot copy " + file.path().string() + " to " + kept + " before salvaging (" + ec.message() +
                     ")");
  }
  return kept;
}

Result<std::unique_ptr<ShardStore>> ShardStore::Open(const std::string& path, const StoreOptions& options) {
  std::error_code ec;
  if (!options.create_if_missing && !std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec)) {
    return NotFound("there is no store at " + path + "; check --store, or open it with create_if_missing");
  }
  if (options.create_if_missing && !options.read_only && !std::filesystem::create_directories(path, ec) && ec) {
    return IoError("cannot create the store directory " + path + " (" + ec.message() +
                   "); check the path and its permissions, or choose another --store");
  }

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options.create_if_missing;
  // Damage is an error, never a silent loss: paranoid checks, and a log replay that stops the open
  // at any damage. RocksDB's default (point-in-time recovery) drops every record after the damage
  // without a word, and "tolerate corrupted tail records" treats all of the log's last 32 KiB
  // block as the tail: 8 flipped bytes there dropped two of four commits silently (measured,
  // storage_test). A process killed mid-write can cut the log's last record short (a write(2) of
  // more than a page stops at a fatal signal): that, and only that, opens up to the cut (below).
  // A power loss can tear the unsynced end of the log, which then needs --salvage (it loses only
  // what came after the last synced commit).
  db_options.paranoid_checks = true;
  db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
  // A read-only open reads the log of a writer that may be mid-write: its last record can be
  // incomplete there, which is not damage. (It changes nothing on disk, and what it cannot see it
  // reports as missing, so a resume falls back instead of using less.)
  if (options.read_only) db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  db_options.create_missing_column_families = true;
  db_options.keep_log_file_num = 10;
  // Table files are opened on the calling thread: a reader of another worker's store (resume under
  // another mesh) starts no pool of 16 threads per open, which under a worker's --memory-limit
  // could fail to start and abort the process.
  db_options.max_file_opening_threads = 1;

  rocksdb::ColumnFamilyOptions small_records;
  rocksdb::ColumnFamilyOptions tensors;
  // Blob files hold the large inline records of stores written before checkpoint data files;
  // they stay readable. No blob garbage collection: it relocated live blobs - gigabytes rewritten
  // in the background while the worker trained or resumed (46% of a resume's profile).
  tensors.enable_blob_files = true;
  tensors.min_blob_size = options.file_threshold;
  tensors.enable_blob_garbage_collection = false;

  // Activations keep only their index here (the bytes are in chunk files, PutActivationChunk).
  rocksdb::ColumnFamilyOptions activations = small_records;

  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, small_records},
      {kCheckpointsCf, tensors},
      {kActivationsCf, activations},
      {kMetadataCf, small_records},
  };
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (options.read_only) {
    if (!std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec)) {
      return NotFound("there is no store at " + path);
    }
    STRATA_RETURN_IF_ERROR(FromRocks(rocksdb::DB::OpenForReadOnly(db_options, path, families, &handles, &db), path,
                                     "opening the store read-only"));
  } else {
    rocksdb::Status opened = rocksdb::DB::Open(db_options, path, families, &handles, &db);
    if (opened.IsCorruption() && IsTornLogTail(opened) && LogIsCut(path)) {
      // A writer killed mid-write (SIGKILL, OOM killer): a write(2) of more than a page can stop
      // part-way, so the log's last record runs past its end. Every record before it replayed
      // intact (the log is read in order and this was the first error), and the cut record's
      // write never returned, so nothing acknowledged is in it: replay up to it.
      STRATA_LOG(kWarn) << "the store at " << path << " ends in a log record cut short (" << opened.ToString()
                        << "): its writer stopped mid-write; opening it with what was written before";
      db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
      opened = rocksdb::DB::Open(db_options, path, families, &handles, &db);
    }
    if (opened.IsCorruption() && options.salvage) {
      STRATA_ASSIGN_OR_RETURN(std::string kept, KeepDamagedFiles(path));
      STRATA_LOG(kWarn) << "the store at " << path << " is damaged (" << opened.ToString()
                        << "); salvaging what is intact (the damaged "
                        << "files are kept in " << kept << ")";
      // First the log up to the damage; if table files are damaged too, RocksDB's repair.
      db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
      opened = rocksdb::DB::Open(db_options, path, families, &handles, &db);
      if (opened.IsCorruption()) {
        STRATA_RETURN_IF_ERROR(FromRocks(rocksdb::RepairDB(path, db_options, families), path, "repairing the store"));
        opened = rocksdb::DB::Open(db_options, path, families, &handles, &db);
      }
    }
    if (opened.IsCorruption()) {
      return Corruption(
          "the store at " + path + " is damaged (" + opened.ToString() +
          "); it was not opened, so nothing in it is lost yet. Restore it from a replica, or start with "
          "--salvage to keep what is intact (the damaged files are kept beside it, and the coordinator marks "
          "the checkpoints it no longer holds unreadable)");
    }
    STRATA_RETURN_IF_ERROR(FromRocks(opened, path, "opening the store"));
    STRATA_LOG(kInfo) << "opened store at " << path;
  }
  auto store =
      std::make_unique<RocksDbShardStore>(path, db, std::move(handles), options.read_only, options.file_threshold);
  if (!options.read_only) store->CollectOrphans();
  return std::unique_ptr<ShardStore>(std::move(store));
}

Status PutMetadataBatch(ShardStore& store, std::span<const MetadataPut> puts) {
  if (auto* rocks = dynamic_cast<RocksDbShardStore*>(&store)) return rocks->PutMetadataBatch(puts);
  for (const MetadataPut& put : puts) {
    STRATA_RETURN_IF_ERROR(
        store.PutMetadata(put.key, {reinterpret_cast<const uint8_t*>(put.value.data()), put.value.size()}, true));
  }
  return Status::Ok();
}

}  // namespace strata::storage
