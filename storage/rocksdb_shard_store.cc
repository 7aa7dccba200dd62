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
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#include "common/hex.h"
#include "common/thread_annotations.h"
#include "common/log.h"
#include "storage/keys.h"
#include "storage/data_files.h"
#include "storage/records.h"
#include "storage/shard_store.h"
#include "storage/metadata_batch.h"
#include "storage/wal_tail.h"

namespace strata::storage {
namespace {

constexpr const char* kCheckpointsCf = "checkpoints";
constexpr const char* kActivationsCf = "activations";
constexpr const char* kMetadataCf = "metadata";

std::string_view View(const rocksdb::Slice& s) { return {s.data(), s.size()}; }

std::string Describe(const std::string& run, int64_t step) {
  return "checkpoint of run " + run + " at step " + std::to_string(step);
}
std::string Describe(const std::string& run, int64_t step, const std::string& name) {
  return "checkpoint tensor '" + name + "' of run " + run + " step " + std::to_string(step);
}

// Turns a RocksDB status into ours; `action` says what failed ("committing checkpoint ...").
Status FromRocks(const rocksdb::Status& s, const std::string& path, const std::string& action) {
  if (s.ok()) return Status::Ok();
  const std::string detail = s.ToString();
  if (s.IsCorruption()) {
    return Corruption(action + " failed: the store at " + path + " is damaged (" + detail +
                      "); restore it from a replica or an older checkpoint");
  }
  if (s.IsNoSpace()) {
    return Status(StatusCode::kResourceExhausted, action + " failed: the disk holding the store at " + path +
                                                      " is full (" + detail + "); free space or choose another --store");
  }
  if (s.IsIOError() && detail.find("lock") != std::string::npos) {
    return IoError(action + " failed: another process (or this one) holds the store at " + path + " open (" +
                   detail + "); stop it (strata down) or choose another --store");
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

// Threads writing one chunk file's records (ChunkFileWriter::WriteAt takes disjoint ranges at once).
constexpr size_t kChunkWriteThreads = 4;

bool UnhexOf(const std::string& hex, std::string* run) {
  if (hex.empty() || hex.size() % 2 != 0) return false;
  auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  run->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    run->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

Status ValidateCheckpointId(const std::string& run, int64_t step) {
  if (run.empty()) return InvalidArgument("checkpoint run name is empty; name the run");
  if (step < 0) return InvalidArgument("checkpoint step " + std::to_string(step) + " of run " + run + " is negative");
  return Status::Ok();
}

class RocksDbShardStore final : public ShardStore {
 public:
  RocksDbShardStore(std::string path, rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*> handles, bool read_only,
                    uint64_t file_threshold)
      : path_(std::move(path)), db_(db), handles_(std::move(handles)), read_only_(read_only), file_threshold_(file_threshold) {
    checkpoints_ = handles_[1];
    activations_ = handles_[2];
    metadata_ = handles_[3];
  }

  ~RocksDbShardStore() override {
    for (rocksdb::ColumnFamilyHandle* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
    rocksdb::Status s = db_->Close();
    if (!s.ok()) STRATA_LOG(kWarn) << "closing the store at " << path_ << ": " << s.ToString();
    delete db_;
  }

  Status PutCheckpointTensor(const std::string& run, int64_t step, const std::string& name,
                             const TensorView& tensor) override {
    STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
    if (name.empty()) return InvalidArgument("a tensor of " + Describe(run, step) + " has an empty name");
    STRATA_RETURN_IF_ERROR(records::ValidateTensor(name, tensor));
    // Committed checkpoints are immutable: a new record would no longer match the manifest.
    STRATA_ASSIGN_OR_RETURN(bool committed, ManifestExists(run, step));
    if (committed) {
      return Status(StatusCode::kAlreadyExists, "cannot stage tensor '" + name + "': the " + Describe(run, step) +
                                                    " is already committed; write a new step instead");
    }
    if (read_only_) return InvalidArgument("staging " + Describe(run, step, name) + ": the store at " + path_ + " is open read-only");
    const std::string key = keys::TensorKey(run, step, name);
    const std::string action = "staging " + Describe(run, step, name);
    STRATA_RETURN_IF_ERROR(EnsureSpace(tensor.bytes.size() + key.size(), action));
    const uint64_t checksum = Checksum(tensor.bytes);
    if (tensor.bytes.size() >= file_threshold_) {
      // Into this attempt's data file at an offset reserved for it; several tensors may be written
      // at once. A file a commit has closed meanwhile is not written: the next attempt's is.
      for (;;) {
        STRATA_ASSIGN_OR_RETURN(std::shared_ptr<StagingFile> file, StagingFileFor(run, step));
        std::shared_lock<std::shared_mutex> writing(file->mu);
        if (file->closed) continue;
        const uint64_t offset = file->end.fetch_add(tensor.bytes.size());
        STRATA_RETURN_IF_ERROR(file->writer.WriteAt(offset, tensor.bytes));
        const records::FileRef ref{file->name, offset, tensor.bytes.size(), checksum, tensor.dtype, tensor.shape};
        return FromRocks(db_->Put(rocksdb::WriteOptions(), checkpoints_, key, records::EncodeFileRef(ref)),
                         path_, action);
      }
    }
    // Header and raw bytes go into the batch as two parts: the tensor is copied once, not twice.
    const std::string prefix = records::EncodeTensorPrefix(tensor, checksum);
    rocksdb::Slice key_part(key);
    rocksdb::Slice value_parts[2] = {
        rocksdb::Slice(prefix),
        rocksdb::Slice(reinterpret_cast<const char*>(tensor.bytes.data()), tensor.bytes.size())};
    rocksdb::WriteBatch batch;
    STRATA_RETURN_IF_ERROR(FromRocks(
        batch.Put(checkpoints_, rocksdb::SliceParts(&key_part, 1), rocksdb::SliceParts(value_parts, 2)), path_,
        action));
    return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), path_, action);
  }

  Status CommitCheckpoint(const std::string& run, int64_t step) override {
    STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
    // Serializes commits so that two racing commits of one step cannot both succeed.
    MutexLock lock(commit_mu_);
    STRATA_ASSIGN_OR_RETURN(bool committed, ManifestExists(run, step));
    if (committed) {
      return Status(StatusCode::kAlreadyExists, "the " + Describe(run, step) + " is already committed");
    }
    STRATA_RETURN_IF_ERROR(EnsureSpace(1 << 20, "committing the " + Describe(run, step)));  // the manifest

    // This process's data file of the step is closed (no more writes) and synced below.
    std::shared_ptr<StagingFile> staged;
    {
      MutexLock staging(staging_mu_);
      auto found = staging_.find({run, step});
      if (found != staging_.end()) {
        staged = found->second;
        staging_.erase(found);
      }
    }
    if (staged) {
      std::unique_lock<std::shared_mutex> no_writers(staged->mu);
      staged->closed = true;
      STRATA_RETURN_IF_ERROR(staged->writer.SyncAndClose());
    }

    // Every staged record must decode (inline ones pass their checksum) and every data file must
    // hold the bytes its references name, durably, before the manifest names them.
    CheckpointInfo info{run, step, {}};
    uint64_t total_bytes = 0;
    std::map<std::string, uint64_t> file_ends;  // data file -> the end of the last byte referenced in it
    const std::string prefix = keys::TensorPrefix(run, step);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      std::string_view rest = View(it->key()).substr(prefix.size());
      std::string name;
      if (!ConsumeKeyString(&rest, &name) || !rest.empty()) {
        return Damaged("a tensor key of the " + Describe(run, step), "is malformed");
      }
      if (records::IsFileRef(View(it->value()))) {
        Result<records::FileRef> decoded_ref = records::DecodeFileRef(View(it->value()));
        if (!decoded_ref.ok()) return Damaged("the reference of " + Describe(run, step, name), decoded_ref.status().message());
        const records::FileRef& ref = *decoded_ref;
        file_ends[ref.file] = std::max(file_ends[ref.file], ref.offset + ref.size);
        total_bytes += ref.size;
        info.tensors.push_back({name, ref.dtype, ref.shape, ref.checksum, ref.size});
        continue;
      }
      Result<records::DecodedTensor> decoded = records::DecodeTensorValue(View(it->value()));
      if (!decoded.ok()) return Damaged(Describe(run, step, name), decoded.status().message());
      total_bytes += decoded->bytes.size();
      info.tensors.push_back({name, decoded->dtype, decoded->shape, decoded->checksum, decoded->bytes.size()});
    }
    STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, "committing the " + Describe(run, step)));
    if (info.tensors.empty()) {
      return InvalidArgument("cannot commit the " + Describe(run, step) +
                             ": no tensors are staged; call PutCheckpointTensor first");
    }
    // Every file referenced, this process's (synced above: again costs nothing) or an earlier
    // attempt's that died before committing, is durable and long enough.
    for (const auto& [file, end] : file_ends) {
      STRATA_RETURN_IF_ERROR(SyncDataFile(CheckpointDir(run) + "/" + file, end, Describe(run, step)));
    }
    if (!file_ends.empty()) STRATA_RETURN_IF_ERROR(SyncDirectory(CheckpointDir(run)));
    std::sort(info.tensors.begin(), info.tensors.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });

    rocksdb::WriteOptions durable;
    durable.sync = true;  // the commit point: the WAL sync also covers the staged tensors before it
    STRATA_RETURN_IF_ERROR(FromRocks(
        db_->Put(durable, checkpoints_, keys::ManifestKey(run, step), records::EncodeManifest(info)), path_,
        "committing the " + Describe(run, step)));
    STRATA_LOG(kInfo) << "committed checkpoint run " << run << " step " << step << " (" << info.tensors.size()
                      << " tensors, " << total_bytes << " bytes) in " << path_;
    return Status::Ok();
  }

  Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& run) override {
    std::vector<CheckpointInfo> out;
    const std::string prefix = keys::ManifestPrefix(run);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      std::string_view rest = View(it->key()).substr(prefix.size());
      uint64_t step = 0;
      if (!ConsumeKeyU64(&rest, &step) || !rest.empty()) {
        return Damaged("a checkpoint manifest key of run " + run, "is malformed");
      }
      STRATA_ASSIGN_OR_RETURN(CheckpointInfo info, DecodeManifestAt(run, static_cast<int64_t>(step), it->value()));
      out.push_back(std::move(info));
    }
    STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, "listing the checkpoints of run " + run));
    return out;
  }

  Result<std::optional<CheckpointInfo>> GetCheckpoint(const std::string& run, int64_t step) override {
    STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
    Result<std::shared_ptr<const CheckpointInfo>> manifest = CommittedManifest(run, step);
    if (manifest.status().code() == StatusCode::kNotFound) return std::optional<CheckpointInfo>();
    if (!manifest.ok()) return manifest.status();
    return std::optional<CheckpointInfo>(**manifest);
  }

  Result<std::vector<StoredCheckpoint>> ListAllCheckpoints() override {
    std::vector<StoredCheckpoint> out;
    const std::string prefix = keys::AllManifestsPrefix();
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      std::string_view rest = View(it->key()).substr(prefix.size());
      StoredCheckpoint id;
      uint64_t step = 0;
      if (!ConsumeKeyString(&rest, &id.run) || !ConsumeKeyU64(&rest, &step) || !rest.empty()) {
        return Damaged("a checkpoint manifest key", "is malformed");
      }
      id.step = static_cast<int64_t>(step);
      out.push_back(std::move(id));
    }
    STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, "listing the store's checkpoints"));
    return out;
  }

  Status DeleteCheckpoint(const std::string& run, int64_t step) override {
    STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
    if (read_only_) return InvalidArgument("deleting the " + Describe(run, step) + ": the store at " + path_ + " is open read-only");
    MutexLock lock(commit_mu_);
    STRATA_ASSIGN_OR_RETURN(bool committed, ManifestExists(run, step));
    if (!committed) return NotFound("run " + run + " has no committed checkpoint at step " + std::to_string(step));
    const std::string action = "deleting the " + Describe(run, step);
    rocksdb::WriteOptions durable;
    durable.sync = true;
    // The manifest goes first: from then on the checkpoint is neither listed nor read.
    STRATA_RETURN_IF_ERROR(FromRocks(db_->Delete(durable, checkpoints_, keys::ManifestKey(run, step)), path_, action));
    {
      MutexLock cache(manifest_mu_);
      if (last_manifest_ && last_manifest_->run == run && last_manifest_->step == step) last_manifest_.reset();
    }
    STRATA_RETURN_IF_ERROR(DeleteTensorRecords(run, step, action));
    RemoveStepFiles(run, step, {});
    return Status::Ok();
  }

  // Collects what dead checkpoint attempts left: data files no committed manifest references and
  // staged records, where they can no longer commit (the run has a committed checkpoint at a later
  // step, or the step is committed without them). A step newer than the run's last commit keeps
  // its staged bytes: a new attempt of that step commits them (CommitCheckpoint). Activation
  // chunk files that never got renamed into place (.tmp) go too. Runs at open, before any write.
  void CollectOrphans() {
    auto committed = ListAllCheckpoints();
    if (!committed.ok()) {
      STRATA_LOG(kWarn) << "not collecting orphan checkpoint files in " << path_ << ": " << committed.status().message();
      return;
    }
    std::map<std::string, std::set<int64_t>> steps;  // run -> committed steps
    for (const StoredCheckpoint& c : *committed) steps[c.run].insert(c.step);
    auto dead = [&](const std::string& run, int64_t step) {
      auto found = steps.find(run);
      if (found == steps.end()) return false;
      return !found->second.count(step) && *found->second.rbegin() > step;
    };
    uint64_t files = 0, bytes = 0, records = 0;
    // Staged records of dead attempts.
    {
      rocksdb::WriteBatch batch;
      const std::string prefix = keys::AllTensorsPrefix();
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
      for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
        std::string_view rest = View(it->key()).substr(prefix.size());
        std::string run;
        uint64_t step = 0;
        if (!ConsumeKeyString(&rest, &run) || !ConsumeKeyU64(&rest, &step)) continue;
        if (!dead(run, static_cast<int64_t>(step))) continue;
        batch.Delete(checkpoints_, it->key());
        ++records;
      }
      if (records > 0) {
        rocksdb::Status s = db_->Write(rocksdb::WriteOptions(), &batch);
        if (!s.ok()) STRATA_LOG(kWarn) << "collecting staged records of dead checkpoint attempts in " << path_ << ": " << s.ToString();
      }
    }
    // Data files.
    std::error_code ec;
    for (const auto& run_dir : std::filesystem::directory_iterator(path_ + "/checkpoints", ec)) {
      std::string run;
      if (!UnhexOf(run_dir.path().filename().string(), &run)) continue;
      std::map<int64_t, std::set<std::string>> referenced;  // committed step -> its files
      for (const auto& file : std::filesystem::directory_iterator(run_dir.path(), ec)) {
        const std::string name = file.path().filename().string();
        const int64_t step = StepOfDataFile(name);
        if (step < 0) continue;
        const auto found = steps.find(run);
        const bool step_committed = found != steps.end() && found->second.count(step);
        if (step_committed) {
          if (!referenced.count(step)) referenced[step] = FilesReferenced(run, step);
          if (referenced[step].count(name)) continue;
        } else if (!dead(run, step)) {
          continue;
        }
        const uint64_t size = file.file_size(ec);
        if (std::filesystem::remove(file.path(), ec)) {
          ++files;
          bytes += ec ? 0 : size;
        }
      }
    }
    for (const auto& run_dir : std::filesystem::directory_iterator(path_ + "/activations", ec)) {
      for (const auto& file : std::filesystem::directory_iterator(run_dir.path(), ec)) {
        if (file.path().extension() != ".tmp") continue;
        const uint64_t size = file.file_size(ec);
        if (std::filesystem::remove(file.path(), ec)) {
          ++files;
          bytes += ec ? 0 : size;
        }
      }
    }
    if (files > 0 || records > 0) {
      STRATA_LOG(kInfo) << "collected what dead checkpoint attempts left in " << path_ << ": " << files << " data files ("
                        << bytes << " bytes), " << records << " staged records";
    }
  }

  Result<Tensor> ReadCheckpointTensor(const std::string& run, int64_t step, const std::string& name) override {
    Tensor out;
    STRATA_RETURN_IF_ERROR(ReadCheckpointBytes(run, step, name, [&](const CheckpointTensorInfo& entry) -> Result<std::span<uint8_t>> {
      out = Tensor{entry.dtype, entry.shape, std::vector<uint8_t>(entry.size_bytes), entry.checksum};
      return std::span<uint8_t>(out.bytes);
    }));
    return out;
  }

  Status ReadCheckpointTensorInto(const std::string& run, int64_t step, const std::string& name, DType dtype,
                                  std::span<uint8_t> out) override {
    return ReadCheckpointBytes(run, step, name, [&](const CheckpointTensorInfo& entry) -> Result<std::span<uint8_t>> {
      if (entry.dtype != dtype || entry.size_bytes != out.size()) {
        return InvalidArgument("the " + Describe(run, step, name) + " holds " + std::to_string(entry.size_bytes) + " bytes of " +
                               std::string(DTypeName(entry.dtype)) + ", not the " + std::to_string(out.size()) + " bytes of " +
                               std::string(DTypeName(dtype)) + " asked for");
      }
      return out;
    });
  }

  // Reads tensor `name` of committed checkpoint (run, step) into the buffer `into` gives for its
  // manifest entry - from its data file straight there, or from its inline record - and verifies
  // it against the manifest (dtype, shape, checksum).
  Status ReadCheckpointBytes(const std::string& run, int64_t step, const std::string& name,
                             const std::function<Result<std::span<uint8_t>>(const CheckpointTensorInfo&)>& into) {
    STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
    const std::string action = "reading " + Describe(run, step, name);
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<const CheckpointInfo> manifest, CommittedManifest(run, step));
    auto entry = std::find_if(manifest->tensors.begin(), manifest->tensors.end(),
                              [&](const CheckpointTensorInfo& t) { return t.name == name; });
    if (entry == manifest->tensors.end()) {
      return NotFound("the " + Describe(run, step) + " has no tensor '" + name + "' (it has " +
                      std::to_string(manifest->tensors.size()) + ")");
    }

    rocksdb::PinnableSlice value;
    // RocksDB's own CRC of an old blob is skipped: the record's XXH3 covers the same bytes (a
    // resume's profile spent 18% of its samples in the second check).
    rocksdb::ReadOptions tensor_read;
    tensor_read.verify_checksums = false;
    tensor_read.fill_cache = false;  // read once, whole
    rocksdb::Status s = db_->Get(tensor_read, checkpoints_, keys::TensorKey(run, step, name), &value);
    if (s.IsNotFound()) return Damaged(Describe(run, step, name), "is in the manifest but its record is missing");
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, action));
    auto matches = [&](DType dtype, const std::vector<int64_t>& shape, uint64_t checksum) {
      return checksum == entry->checksum && dtype == entry->dtype && shape == entry->shape;
    };
    if (records::IsFileRef(View(value))) {
      Result<records::FileRef> decoded_ref = records::DecodeFileRef(View(value));
      if (!decoded_ref.ok()) return Damaged("the reference of " + Describe(run, step, name), decoded_ref.status().message());
      const records::FileRef& ref = *decoded_ref;
      if (!matches(ref.dtype, ref.shape, ref.checksum)) {
        return Damaged(Describe(run, step, name), "does not match its manifest entry (checksum, dtype or shape)");
      }
      STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> out, into(*entry));
      const std::string file = CheckpointDir(run) + "/" + ref.file;
      STRATA_RETURN_IF_ERROR(ReadFileRange(file, "checkpoint", ref.offset, out));
      if (Checksum(out) != ref.checksum) return Damaged(Describe(run, step, name) + " in " + file, "fails its checksum");
      return Status::Ok();
    }
    Result<records::DecodedTensor> decoded = records::DecodeTensorValue(View(value));
    if (!decoded.ok()) return Damaged(Describe(run, step, name), decoded.status().message());
    if (!matches(decoded->dtype, decoded->shape, decoded->checksum)) {
      return Damaged(Describe(run, step, name), "does not match its manifest entry (checksum, dtype or shape)");
    }
    STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> out, into(*entry));
    std::memcpy(out.data(), decoded->bytes.data(), out.size());
    return Status::Ok();
  }

  // ---- activations
  // Why not RocksDB values: a chunk is hundreds of MB written once and read whole, and every
  // RocksDB path copies it several times (write batch, memtable, blob file at flush) - measured
  // at 0.4 GB/s on an H200 node whose disk takes 1.6 GB/s. So a chunk's bytes go to one file of
  // their own (written once from the caller's buffers, fdatasync'ed, renamed into place), and
  // RocksDB keeps the small index: per record its file offset, size, dtype, shape and checksum,
  // plus the chunk's cursor, in one synced write batch after the file is durable. A crash before
  // that batch leaves at most an unreferenced file that the rewrite replaces.
  Status PutActivationChunk(const std::string& run, const ActivationChunkInfo& chunk,
                            std::span<const ActivationRecordView> records) override {
    if (run.empty()) return InvalidArgument("activation chunk: run name is empty");
    if (records.empty()) return InvalidArgument("activation chunk " + std::to_string(chunk.chunk) + " of run " + run + " has no records");
    const std::string action = "storing activation chunk " + std::to_string(chunk.chunk) + " of run " + run;
    for (const ActivationRecordView& record : records) {
      const std::string name = record.site + " of layer " + std::to_string(record.layer);
      STRATA_RETURN_IF_ERROR(records::ValidateTensor(name, record.tensor));
      if (record.tensor.shape.empty() || static_cast<uint64_t>(record.tensor.shape[0]) != chunk.row_count) {
        return InvalidArgument("activation record " + name + " of chunk " + std::to_string(chunk.chunk) + " has shape " +
                               records::ShapeString(record.tensor.shape) + "; its first dimension must be the chunk's " +
                               std::to_string(chunk.row_count) + " rows");
      }
    }
    if (read_only_) return InvalidArgument(action + ": the store at " + path_ + " is open read-only");
    uint64_t chunk_bytes = 0;
    for (const ActivationRecordView& record : records) chunk_bytes += record.tensor.bytes.size();
    STRATA_RETURN_IF_ERROR(EnsureSpace(chunk_bytes, action));
    const std::string dir = ChunkDir(run);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError(action + ": cannot create " + dir + " (" + ec.message() + ")");
    const std::string file = ChunkFile(run, chunk.chunk);
    // Copying hundreds of MB into the page cache is CPU-bound on one thread (~1.5-2 GB/s), below
    // a fast disk: the records are written (and checksummed) by several threads at their offsets.
    std::vector<uint64_t> offsets(records.size()), checksums(records.size());
    for (size_t i = 1; i < records.size(); ++i) offsets[i] = offsets[i - 1] + records[i - 1].tensor.bytes.size();
    {
      ChunkFileWriter writer;
      STRATA_RETURN_IF_ERROR(writer.Open(file + ".tmp"));
      const size_t threads = std::min<size_t>(kChunkWriteThreads, records.size());
      std::vector<Status> results(threads);
      auto work = [&](size_t t) {
        for (size_t i = t; i < records.size(); i += threads) {
          checksums[i] = Checksum(records[i].tensor.bytes);
          results[t] = writer.WriteAt(offsets[i], records[i].tensor.bytes);
          if (!results[t].ok()) return;
        }
      };
      std::vector<std::thread> pool;
      for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
      work(0);
      for (auto& thread : pool) thread.join();
      for (const Status& st : results) STRATA_RETURN_IF_ERROR(st);
      STRATA_RETURN_IF_ERROR(writer.SyncAndClose());
    }
    rocksdb::WriteBatch batch;
    for (size_t i = 0; i < records.size(); ++i) {
      const ActivationRecordView& record = records[i];
      const std::string ref = EncodeRecordRef(chunk.chunk, offsets[i], checksums[i], record.tensor);
      STRATA_RETURN_IF_ERROR(FromRocks(
          batch.Put(activations_, keys::ActivationRecordKey(run, record.site, record.layer, chunk.row_begin), ref), path_, action));
    }
    std::filesystem::rename(file + ".tmp", file, ec);
    if (ec) return IoError(action + ": cannot rename " + file + ".tmp (" + ec.message() + ")");
    STRATA_RETURN_IF_ERROR(SyncDirectory(dir));
    STRATA_RETURN_IF_ERROR(FromRocks(batch.Put(activations_, keys::ActivationCursorKey(run, chunk.chunk), EncodeCursor(chunk)), path_, action));
    rocksdb::WriteOptions durable;
    durable.sync = true;
    return FromRocks(db_->Write(durable, &batch), path_, action + " (index)");
  }

  Status PutActivationRun(const std::string& run, const ActivationRunInfo& info) override {
    const std::string action = "storing the activation run record of run " + run;
    if (run.empty()) return InvalidArgument("activation run record: run name is empty");
    if (info.row_shapes.size() != info.sites.size()) {
      return InvalidArgument(action + ": " + std::to_string(info.row_shapes.size()) + " row shapes for " +
                             std::to_string(info.sites.size()) + " sites; give one per site");
    }
    if (read_only_) return InvalidArgument(action + ": the store at " + path_ + " is open read-only");
    rocksdb::WriteOptions durable;
    durable.sync = true;
    return FromRocks(db_->Put(durable, activations_, keys::ActivationRunKey(run), EncodeRunInfo(info)), path_, action);
  }

  Result<std::optional<ActivationRunInfo>> GetActivationRun(const std::string& run) override {
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), activations_, keys::ActivationRunKey(run), &value);
    if (s.IsNotFound()) return std::optional<ActivationRunInfo>();
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading the activation run record of run " + run));
    ActivationRunInfo info;
    if (!DecodeRunInfo(View(value), &info)) return Damaged("the activation run record of run " + run, "is malformed");
    return std::optional<ActivationRunInfo>(std::move(info));
  }

  Result<std::optional<ActivationChunkInfo>> GetActivationChunk(const std::string& run, uint64_t chunk) override {
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), activations_, keys::ActivationCursorKey(run, chunk), &value);
    if (s.IsNotFound()) return std::optional<ActivationChunkInfo>();
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading the cursor of chunk " + std::to_string(chunk) + " of run " + run));
    STRATA_ASSIGN_OR_RETURN(ActivationChunkInfo info, DecodeCursor(run, View(value)));
    return std::optional<ActivationChunkInfo>(info);
  }

  Result<std::vector<ActivationChunkInfo>> ListActivationChunks(const std::string& run) override {
    std::vector<ActivationChunkInfo> out;
    const std::string prefix = keys::ActivationCursorPrefix(run);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), activations_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      STRATA_ASSIGN_OR_RETURN(ActivationChunkInfo info, DecodeCursor(run, View(it->value())));
      out.push_back(info);
    }
    STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, "listing the activation chunks of run " + run));
    return out;
  }

  Result<Tensor> ReadActivation(const std::string& run, int64_t layer, const std::string& site,
                                uint64_t row_begin) override {
    const std::string what = ActivationWhat(run, layer, site, row_begin);
    STRATA_ASSIGN_OR_RETURN(RecordRef ref, FindRecord(run, layer, site, row_begin, what));
    Tensor tensor{ref.dtype, ref.shape, std::vector<uint8_t>(ref.size), ref.checksum};
    const std::string file = ChunkFile(run, ref.chunk);
    STRATA_RETURN_IF_ERROR(ReadFileRange(file, "activation", ref.offset, tensor.bytes));
    if (Checksum(tensor.bytes) != ref.checksum) return Damaged("activations " + what + " in " + file, "fail their checksum");
    return tensor;
  }

  Result<std::span<const uint8_t>> ReadActivationInto(const std::string& run, int64_t layer, const std::string& site,
                                                      uint64_t row_begin, RecordBuffer& buffer, ColdRead cold) override {
    const std::string what = ActivationWhat(run, layer, site, row_begin);
    STRATA_ASSIGN_OR_RETURN(RecordRef ref, FindRecord(run, layer, site, row_begin, what));
    const std::string file = ChunkFile(run, ref.chunk);
    STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, ReadFileRecord(file, "activation", ref.offset, ref.size, buffer, cold));
    if (Checksum(bytes) != ref.checksum) return Damaged("activations " + what + " in " + file, "fail their checksum");
    return bytes;
  }

  Result<ActivationLocation> LocateActivation(const std::string& run, int64_t layer, const std::string& site,
                                              uint64_t row_begin) override {
    STRATA_ASSIGN_OR_RETURN(RecordRef ref, FindRecord(run, layer, site, row_begin, ActivationWhat(run, layer, site, row_begin)));
    return ActivationLocation{ChunkFile(run, ref.chunk), ref.offset, ref.size, ref.checksum};
  }

  Status PutMetadata(const std::string& key, std::span<const uint8_t> value, bool sync) override {
    const std::string action = "writing metadata key '" + PrintableKey(key) + "'";
    STRATA_RETURN_IF_ERROR(EnsureSpace(key.size() + value.size(), action));
    rocksdb::WriteOptions options;
    options.sync = sync;
    rocksdb::Slice slice(reinterpret_cast<const char*>(value.data()), value.size());
    return FromRocks(db_->Put(options, metadata_, key, slice), path_, action);
  }

  Result<std::optional<std::vector<uint8_t>>> GetMetadata(const std::string& key) override {
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), metadata_, key, &value);
    if (s.IsNotFound()) return std::optional<std::vector<uint8_t>>();
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading metadata key '" + key + "'"));
    return std::optional<std::vector<uint8_t>>(std::in_place, value.data(), value.data() + value.size());
  }

  Result<std::vector<std::pair<std::string, std::vector<uint8_t>>>> ScanMetadata(const std::string& prefix) override {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), metadata_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      const rocksdb::Slice value = it->value();
      out.emplace_back(it->key().ToString(), std::vector<uint8_t>(value.data(), value.data() + value.size()));
    }
    STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, "scanning metadata under '" + prefix + "'"));
    return out;
  }

  Status PutMetadataBatch(std::span<const MetadataPut> puts) {
    size_t bytes = 0;
    rocksdb::WriteBatch batch;
    for (const MetadataPut& put : puts) {
      bytes += put.key.size() + put.value.size();
      rocksdb::Status s = batch.Put(metadata_, put.key, put.value);
      if (!s.ok()) return FromRocks(s, path_, "batching metadata key '" + PrintableKey(put.key) + "'");
    }
    const std::string action = "writing " + std::to_string(puts.size()) + " metadata keys";
    STRATA_RETURN_IF_ERROR(EnsureSpace(bytes, action));
    rocksdb::WriteOptions options;
    options.sync = true;
    return FromRocks(db_->Write(options, &batch), path_, action);
  }

  Status DeleteMetadata(const std::string& key) override {
    rocksdb::WriteOptions options;
    options.sync = true;
    return FromRocks(db_->Delete(options, metadata_, key), path_, "deleting metadata key '" + PrintableKey(key) + "'");
  }

 private:
  Status Damaged(const std::string& what, const std::string& reason) const {
    return Corruption(what + " " + reason + ": the store at " + path_ +
                      " is damaged; restore it from a replica or an older checkpoint");
  }

  // A write that would leave less free space than the reserve is refused before RocksDB meets
  // ENOSPC: Debian's librocksdb keeps its assertions, and its log writer's error path aborts the
  // process on the next write after a failed one (WritableFileWriter::AssertFalseAndGetStatusForPrevError,
  // measured on a full tmpfs), and a flush or compaction needs room of its own. The reserve is 5%
  // of the filesystem, at least 16 MiB and at most 256 MiB.
  Status EnsureSpace(uint64_t bytes, const std::string& action) const {
    struct statvfs fs {};
    if (::statvfs(path_.c_str(), &fs) != 0) return Status::Ok();  // cannot tell: let the write say
    const uint64_t total = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    const uint64_t reserve = std::clamp<uint64_t>(total / 20, uint64_t{16} << 20, uint64_t{256} << 20);
    if (free >= bytes + reserve) return Status::Ok();
    return Status(StatusCode::kResourceExhausted,
                  action + " failed: the disk holding the store at " + path_ + " is full (" + std::to_string(free >> 20) +
                      " MiB free; this write needs " + std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB and " +
                      std::to_string(reserve >> 20) + " MiB stay free for the store's own upkeep); free space, lower "
                      "train.keep_checkpoints, or choose another --store");
  }

  // ---- checkpoint data files
  // One per (run, step) and staging attempt of this process, appended to at reserved offsets.
  struct StagingFile {
    std::string name;  // within CheckpointDir(run)
    ChunkFileWriter writer;
    std::atomic<uint64_t> end{0};
    std::shared_mutex mu;  // writes hold it shared; the commit that closes the file, exclusive
    bool closed = false;
  };

  std::string CheckpointDir(const std::string& run) const { return path_ + "/checkpoints/" + HexOf(run); }

  // "<step>-<pid>-<time>-<n>.bin" -> step; -1 for any other name.
  static int64_t StepOfDataFile(const std::string& name) {
    const size_t dash = name.find('-');
    if (dash == 0 || dash == std::string::npos || name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0) return -1;
    int64_t step = 0;
    for (size_t i = 0; i < dash; ++i) {
      if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 55)) return -1;
      step = step * 10 + (name[i] - '0');
    }
    return step;
  }

  // The data files the tensor records of (run, step) reference.
  std::set<std::string> FilesReferenced(const std::string& run, int64_t step) {
    std::set<std::string> files;
    const std::string prefix = keys::TensorPrefix(run, step);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (!records::IsFileRef(View(it->value()))) continue;
      Result<records::FileRef> ref = records::DecodeFileRef(View(it->value()));
      if (ref.ok()) files.insert(ref->file);
    }
    return files;
  }

  Status DeleteTensorRecords(const std::string& run, int64_t step, const std::string& action) {
    rocksdb::WriteBatch batch;
    const std::string prefix = keys::TensorPrefix(run, step);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) batch.Delete(checkpoints_, it->key());
    STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, action));
    return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), path_, action);
  }

  // Removes the data files of (run, step) except `keep`.
  void RemoveStepFiles(const std::string& run, int64_t step, const std::set<std::string>& keep) {
    std::error_code ec;
    for (const auto& file : std::filesystem::directory_iterator(CheckpointDir(run), ec)) {
      const std::string name = file.path().filename().string();
      if (StepOfDataFile(name) == step && !keep.count(name)) std::filesystem::remove(file.path(), ec);
    }
  }

  Result<std::shared_ptr<StagingFile>> StagingFileFor(const std::string& run, int64_t step) {
    MutexLock lock(staging_mu_);
    std::shared_ptr<StagingFile>& file = staging_[{run, step}];
    if (file) return file;  // a commit closes a file only after taking it out of staging_
    const std::string dir = CheckpointDir(run);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError("cannot create " + dir + " for a checkpoint's data (" + ec.message() + "); check the disk and its permissions");
    // A new name per attempt: a file of a writer that died mid-checkpoint is never appended to.
    static std::atomic<uint64_t> attempts{0};
    const auto now = std::chrono::system_clock::now().time_since_epoch().count();
    auto fresh = std::make_shared<StagingFile>();
    fresh->name = std::to_string(step) + "-" + std::to_string(::getpid()) + "-" + std::to_string(now) + "-" +
                  std::to_string(attempts.fetch_add(1)) + ".bin";
    STRATA_RETURN_IF_ERROR(fresh->writer.Open(dir + "/" + fresh->name));
    file = fresh;
    return file;
  }

  // Makes a data file durable and checks it holds `end` bytes.
  Status SyncDataFile(const std::string& path, uint64_t end, const std::string& what) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Damaged("the " + what, "names the data file " + path + ", which cannot be opened (" + std::strerror(errno) + ")");
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0 && ::fdatasync(fd) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok) return IoError("syncing " + path + " failed: " + std::strerror(err));
    if (static_cast<uint64_t>(st.st_size) < end) {
      return Damaged("the " + what, "references bytes past the end of its data file " + path);
    }
    return Status::Ok();
  }

  // Chunk files live under STORE/activations/<hex of run id>/<chunk>.bin (hex: run ids are user
  // text and must not become paths).
  static std::string ActivationWhat(const std::string& run, int64_t layer, const std::string& site, uint64_t row_begin) {
    return site + " of layer " + std::to_string(layer) + " at row " + std::to_string(row_begin) + " of run " + run;
  }

  std::string ChunkDir(const std::string& run) const { return path_ + "/activations/" + HexOf(run); }
  std::string ChunkFile(const std::string& run, uint64_t chunk) const { return ChunkDir(run) + "/" + std::to_string(chunk) + ".bin"; }

  // Index entry of one record: chunk, offset and size in its chunk file, checksum, dtype, shape.
  struct RecordRef {
    uint64_t chunk = 0, offset = 0, size = 0, checksum = 0;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
  };
  static std::string EncodeRecordRef(uint64_t chunk, uint64_t offset, uint64_t checksum, const TensorView& t) {
    std::string out = EncodeKeyU64(chunk) + EncodeKeyU64(offset) + EncodeKeyU64(t.bytes.size()) + EncodeKeyU64(checksum) +
                      EncodeKeyU64(static_cast<uint64_t>(t.dtype)) + EncodeKeyU64(t.shape.size());
    for (int64_t d : t.shape) out += EncodeKeyU64(static_cast<uint64_t>(d));
    return out;
  }
  static bool DecodeRecordRef(std::string_view v, RecordRef* ref) {
    uint64_t dtype = 0, rank = 0;
    if (!ConsumeKeyU64(&v, &ref->chunk) || !ConsumeKeyU64(&v, &ref->offset) || !ConsumeKeyU64(&v, &ref->size) ||
        !ConsumeKeyU64(&v, &ref->checksum) || !ConsumeKeyU64(&v, &dtype) || !ConsumeKeyU64(&v, &rank) || dtype > 7 || rank > 8) {
      return false;
    }
    ref->dtype = static_cast<DType>(dtype);
    for (uint64_t i = 0; i < rank; ++i) {
      uint64_t d = 0;
      if (!ConsumeKeyU64(&v, &d)) return false;
      ref->shape.push_back(static_cast<int64_t>(d));
    }
    const auto expected = records::ByteSize(ref->dtype, ref->shape);
    return v.empty() && expected && *expected == ref->size;
  }

  // The index entry of one activation record (`what` names it in messages).
  Result<RecordRef> FindRecord(const std::string& run, int64_t layer, const std::string& site, uint64_t row_begin,
                               const std::string& what) {
    rocksdb::PinnableSlice value;
    rocksdb::Status s =
        db_->Get(rocksdb::ReadOptions(), activations_, keys::ActivationRecordKey(run, site, layer, row_begin), &value);
    if (s.IsNotFound()) return NotFound("this store holds no activations for " + what);
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading activations " + what));
    RecordRef ref;
    if (!DecodeRecordRef(View(value), &ref)) return Damaged("the index entry of activations " + what, "is malformed");
    return ref;
  }

  // [dtype u64][total_rows][sequence][layer count][layers...][site count]([site][rank][dims...])...
  // in key pieces (order-preserving encodings reused as a plain serialization).
  static std::string EncodeRunInfo(const ActivationRunInfo& info) {
    std::string out = EncodeKeyU64(static_cast<uint64_t>(info.dtype)) + EncodeKeyU64(info.total_rows) +
                      EncodeKeyU64(info.sequence) + EncodeKeyU64(info.layers.size());
    for (int64_t l : info.layers) out += EncodeKeyU64(static_cast<uint64_t>(l));
    out += EncodeKeyU64(info.sites.size());
    for (size_t i = 0; i < info.sites.size(); ++i) {
      out += EncodeKeyString(info.sites[i]) + EncodeKeyU64(info.row_shapes[i].size());
      for (int64_t d : info.row_shapes[i]) out += EncodeKeyU64(static_cast<uint64_t>(d));
    }
    return out;
  }
  static bool DecodeRunInfo(std::string_view v, ActivationRunInfo* info) {
    uint64_t dtype = 0, layers = 0, sites = 0;
    if (!ConsumeKeyU64(&v, &dtype) || dtype > static_cast<uint64_t>(DType::kU8) || !ConsumeKeyU64(&v, &info->total_rows) ||
        !ConsumeKeyU64(&v, &info->sequence) || !ConsumeKeyU64(&v, &layers) || layers > v.size() / 8) {
      return false;
    }
    info->dtype = static_cast<DType>(dtype);
    for (uint64_t i = 0; i < layers; ++i) {
      uint64_t l = 0;
      if (!ConsumeKeyU64(&v, &l)) return false;
      info->layers.push_back(static_cast<int64_t>(l));
    }
    if (!ConsumeKeyU64(&v, &sites) || sites > v.size() / 12) return false;
    for (uint64_t i = 0; i < sites; ++i) {
      std::string site;
      uint64_t rank = 0;
      if (!ConsumeKeyString(&v, &site) || !ConsumeKeyU64(&v, &rank) || rank > v.size() / 8) return false;
      std::vector<int64_t> shape;
      for (uint64_t d = 0; d < rank; ++d) {
        uint64_t dim = 0;
        if (!ConsumeKeyU64(&v, &dim)) return false;
        shape.push_back(static_cast<int64_t>(dim));
      }
      info->sites.push_back(std::move(site));
      info->row_shapes.push_back(std::move(shape));
    }
    return v.empty();
  }

  static std::string EncodeCursor(const ActivationChunkInfo& c) {
    return EncodeKeyU64(c.chunk) + EncodeKeyU64(c.row_begin) + EncodeKeyU64(c.row_count) + EncodeKeyU64(c.bytes);
  }
  Result<ActivationChunkInfo> DecodeCursor(const std::string& run, std::string_view v) const {
    ActivationChunkInfo c;
    if (!ConsumeKeyU64(&v, &c.chunk) || !ConsumeKeyU64(&v, &c.row_begin) ||
        !ConsumeKeyU64(&v, &c.row_count) || !ConsumeKeyU64(&v, &c.bytes) || !v.empty()) {
      return Damaged("an activation chunk cursor of run " + run, "is malformed");
    }
    return c;
  }

  Result<bool> ManifestExists(const std::string& run, int64_t step) {
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), checkpoints_, keys::ManifestKey(run, step), &value);
    if (s.IsNotFound()) return false;
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "looking up the " + Describe(run, step)));
    return true;
  }

  // The manifest of committed checkpoint (run, step), decoded once for a restore's many tensor
  // reads (the last one asked for is kept: a committed manifest never changes).
  Result<std::shared_ptr<const CheckpointInfo>> CommittedManifest(const std::string& run, int64_t step) {
    {
      MutexLock lock(manifest_mu_);
      if (last_manifest_ && last_manifest_->run == run && last_manifest_->step == step) return last_manifest_;
    }
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), checkpoints_, keys::ManifestKey(run, step), &value);
    if (s.IsNotFound()) return NotFound("run " + run + " has no committed checkpoint at step " + std::to_string(step));
    STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading the manifest of the " + Describe(run, step)));
    STRATA_ASSIGN_OR_RETURN(CheckpointInfo info, DecodeManifestAt(run, step, value));
    auto decoded = std::make_shared<const CheckpointInfo>(std::move(info));
    MutexLock lock(manifest_mu_);
    last_manifest_ = decoded;
    return decoded;
  }

  // Decodes the manifest stored under (run, step) and checks it names that checkpoint.
  Result<CheckpointInfo> DecodeManifestAt(const std::string& run, int64_t step, const rocksdb::Slice& value) const {
    Result<CheckpointInfo> info = records::DecodeManifest(View(value));
    if (!info.ok()) return Damaged("the " + Describe(run, step), info.status().message());
    if (info->run != run || info->step != step) {
      return Damaged("the " + Describe(run, step), "has a manifest naming run " + info->run + " step " +
                                                       std::to_string(info->step));
    }
    return info;
  }

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

// RocksDB's two reports, under kAbsoluteConsistency, of a record running past the end of the
// log (log_reader.cc: a bad record length at EOF, a fragmented record at EOF). A flipped length
// field in the last block reads the same, so the log itself decides (storage/wal_tail.h).
bool LogIsCut(const std::string& store_path) {
  Result<bool> cut = LogEndsInCutRecord(NewestLog(store_path));
  return cut.ok() && *cut;
}

bool IsTornLogTail(const rocksdb::Status& status) {
  const std::string what = status.ToString();
  return what.find("truncated record body") != std::string::npos || what.find("error reading trailing data") != std::string::npos;
}

}  // namespace

// Copies the store's log and descriptor files to STORE/damaged-<unix time>/ before a salvage
// changes them: what the salvage drops stays on disk for a person to look at.
Result<std::string> KeepDamagedFiles(const std::string& path) {
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string kept = path + "/damaged-" + std::to_string(now);
  std::error_code ec;
  std::filesystem::create_directories(kept, ec);
  if (ec) return IoError("cannot create " + kept + " to keep the damaged files before salvaging (" + ec.message() + ")");
  for (const auto& file : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = file.path().filename().string();
    const bool log = file.path().extension() == ".log", table = file.path().extension() == ".sst";
    if (!file.is_regular_file() || !(log || table || name.rfind("MANIFEST-", 0) == 0 || name == "CURRENT")) continue;
    std::filesystem::copy_file(file.path(), kept + "/" + name, ec);
    if (ec) return IoError("cannot copy " + file.path().string() + " to " + kept + " before salvaging (" + ec.message() + ")");
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
      STRATA_LOG(kWarn) << "the store at " << path << " is damaged (" << opened.ToString() << "); salvaging what is intact (the damaged "
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
      return Corruption("the store at " + path + " is damaged (" + opened.ToString() +
                        "); it was not opened, so nothing in it is lost yet. Restore it from a replica, or start with "
                        "--salvage to keep what is intact (the damaged files are kept beside it, and the coordinator marks "
                        "the checkpoints it no longer holds unreadable)");
    }
    STRATA_RETURN_IF_ERROR(FromRocks(opened, path, "opening the store"));
    STRATA_LOG(kInfo) << "opened store at " << path;
  }
  auto store = std::make_unique<RocksDbShardStore>(path, db, std::move(handles), options.read_only, options.file_threshold);
  if (!options.read_only) store->CollectOrphans();
  return std::unique_ptr<ShardStore>(std::move(store));
}

Status PutMetadataBatch(ShardStore& store, std::span<const MetadataPut> puts) {
  if (auto* rocks = dynamic_cast<RocksDbShardStore*>(&store)) return rocks->PutMetadataBatch(puts);
  for (const MetadataPut& put : puts) {
    STRATA_RETURN_IF_ERROR(store.PutMetadata(put.key, {reinterpret_cast<const uint8_t*>(put.value.data()), put.value.size()}, true));
  }
  return Status::Ok();
}

}  // namespace strata::storage
