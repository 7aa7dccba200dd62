// RocksDbShardStore's checkpoints: staging tensors (inline records or data files), the commit that
// makes them visible, reads, deletion, and collecting what dead attempts left behind. Why data
// files and a manifest as the commit point: rocksdb_shard_store.cc.
#include <fcntl.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "common/hex.h"
#include "common/log.h"
#include "storage/keys.h"
#include "storage/records.h"
#include "storage/rocksdb_shard_store.h"

namespace strata::storage::internal {
namespace {

std::string Describe(const std::string& run, int64_t step) {
  return "checkpoint of run " + run + " at step " + std::to_string(step);
}
std::string Describe(const std::string& run, int64_t step, const std::string& name) {
  return "checkpoint tensor '" + name + "' of run " + run + " step " + std::to_string(step);
}

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

}  // namespace

Status RocksDbShardStore::PutCheckpointTensor(const std::string& run, int64_t step, const std::string& name,
                                              const TensorView& tensor) {
  STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
  if (name.empty()) return InvalidArgument("a tensor of " + Describe(run, step) + " has an empty name");
  STRATA_RETURN_IF_ERROR(records::ValidateTensor(name, tensor));
  // Committed checkpoints are immutable: a new record would no longer match the manifest.
  STRATA_ASSIGN_OR_RETURN(bool committed, ManifestExists(run, step));
  if (committed) {
    return Status(StatusCode::kAlreadyExists, "cannot stage tensor '" + name + "': the " + Describe(run, step) +
                                                  " is already committed; write a new step instead");
  }
  if (read_only_)
    return InvalidArgument("staging " + Describe(run, step, name) + ": the store at " + path_ + " is open read-only");
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
      return FromRocks(db_->Put(rocksdb::WriteOptions(), checkpoints_, key, records::EncodeFileRef(ref)), path_,
                       action);
    }
  }
  // Header and raw bytes go into the batch as two parts: the tensor is copied once, not twice.
  const std::string prefix = records::EncodeTensorPrefix(tensor, checksum);
  rocksdb::Slice key_part(key);
  rocksdb::Slice value_parts[2] = {
      rocksdb::Slice(prefix), rocksdb::Slice(reinterpret_cast<const char*>(tensor.bytes.data()), tensor.bytes.size())};
  rocksdb::WriteBatch batch;
  STRATA_RETURN_IF_ERROR(FromRocks(
      batch.Put(checkpoints_, rocksdb::SliceParts(&key_part, 1), rocksdb::SliceParts(value_parts, 2)), path_, action));
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), path_, action);
}

Status RocksDbShardStore::CommitCheckpoint(const std::string& run, int64_t step) {
  STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
  // Serializes commits so that two racing commits of one step cannot both succeed.
  MutexLock lock(commit_mu_);
  STRATA_ASSIGN_OR_RETURN(bool committed, ManifestExists(run, step));
  if (committed) {
    return Status(StatusCode::kAlreadyExists, "the " + Describe(run, step) + " is already committed");
  }
  STRATA_RETURN_IF_ERROR(
      EnsureSpace(1 << 20, "committing the " + Describe(run, step), /*metadata=*/true));  // the manifest

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
      if (!decoded_ref.ok())
        return Damaged("the reference of " + Describe(run, step, name), decoded_ref.status().message());
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
  std::sort(info.tensors.begin(), info.tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });

  rocksdb::WriteOptions durable;
  durable.sync = true;  // the commit point: the WAL sync also covers the staged tensors before it
  STRATA_RETURN_IF_ERROR(
      FromRocks(db_->Put(durable, checkpoints_, keys::ManifestKey(run, step), records::EncodeManifest(info)), path_,
                "committing the " + Describe(run, step)));
  STRATA_LOG(kInfo) << "committed checkpoint run " << run << " step " << step << " (" << info.tensors.size()
                    << " tensors, " << total_bytes << " bytes) in " << path_;
  return Status::Ok();
}

Result<std::vector<CheckpointInfo>> RocksDbShardStore::ListCheckpoints(const std::string& run) {
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

Result<std::optional<CheckpointInfo>> RocksDbShardStore::GetCheckpoint(const std::string& run, int64_t step) {
  STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
  Result<std::shared_ptr<const CheckpointInfo>> manifest = CommittedManifest(run, step);
  if (manifest.status().code() == StatusCode::kNotFound) return std::optional<CheckpointInfo>();
  if (!manifest.ok()) return manifest.status();
  return std::optional<CheckpointInfo>(**manifest);
}

Result<std::vector<StoredCheckpoint>> RocksDbShardStore::ListAllCheckpoints() {
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

Status RocksDbShardStore::DeleteCheckpoint(const std::string& run, int64_t step) {
  STRATA_RETURN_IF_ERROR(ValidateCheckpointId(run, step));
  if (read_only_)
    return InvalidArgument("deleting the " + Describe(run, step) + ": the store at " + path_ + " is open read-only");
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
void RocksDbShardStore::CollectOrphans() {
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
      if (!s.ok())
        STRATA_LOG(kWarn) << "collecting staged records of dead checkpoint attempts in " << path_ << ": "
                          << s.ToString();
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

Result<Tensor> RocksDbShardStore::ReadCheckpointTensor(const std::string& run, int64_t step, const std::string& name) {
  Tensor out;
  STRATA_RETURN_IF_ERROR(
      ReadCheckpointBytes(run, step, name, [&](const CheckpointTensorInfo& entry) -> Result<std::span<uint8_t>> {
        out = Tensor{entry.dtype, entry.shape, std::vector<uint8_t>(entry.size_bytes), entry.checksum};
        return std::span<uint8_t>(out.bytes);
      }));
  return out;
}

Status RocksDbShardStore::ReadCheckpointTensorInto(const std::string& run, int64_t step, const std::string& name,
                                                   DType dtype, std::span<uint8_t> out) {
  return ReadCheckpointBytes(run, step, name, [&](const CheckpointTensorInfo& entry) -> Result<std::span<uint8_t>> {
    if (entry.dtype != dtype || entry.size_bytes != out.size()) {
      return InvalidArgument("the " + Describe(run, step, name) + " holds " + std::to_string(entry.size_bytes) +
                             " bytes of " + std::string(DTypeName(entry.dtype)) + ", not the " +
                             std::to_string(out.size()) + " bytes of " + std::string(DTypeName(dtype)) + " asked for");
    }
    return out;
  });
}

// Reads tensor `name` of committed checkpoint (run, step) into the buffer `into` gives for its
// manifest entry - from its data file straight there, or from its inline record - and verifies
// it against the manifest (dtype, shape, checksum).
Status RocksDbShardStore::ReadCheckpointBytes(
    const std::string& run, int64_t step, const std::string& name,
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
    if (!decoded_ref.ok())
      return Damaged("the reference of " + Describe(run, step, name), decoded_ref.status().message());
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

std::string RocksDbShardStore::CheckpointDir(const std::string& run) const {
  return path_ + "/checkpoints/" + HexOf(run);
}

// "<step>-<pid>-<time>-<n>.bin" -> step; -1 for any other name.
int64_t RocksDbShardStore::StepOfDataFile(const std::string& name) {
  const size_t dash = name.find('-');
  if (dash == 0 || dash == std::string::npos || name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0)
    return -1;
  int64_t step = 0;
  for (size_t i = 0; i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 55)) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// The data files the tensor records of (run, step) reference.
std::set<std::string> RocksDbShardStore::FilesReferenced(const std::string& run, int64_t step) {
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

Status RocksDbShardStore::DeleteTensorRecords(const std::string& run, int64_t step, const std::string& action) {
  rocksdb::WriteBatch batch;
  const std::string prefix = keys::TensorPrefix(run, step);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), checkpoints_));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
    batch.Delete(checkpoints_, it->key());
  STRATA_RETURN_IF_ERROR(FromRocks(it->status(), path_, action));
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), path_, action);
}

// Removes the data files of (run, step) except `keep`.
void RocksDbShardStore::RemoveStepFiles(const std::string& run, int64_t step, const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(CheckpointDir(run), ec)) {
    const std::string name = file.path().filename().string();
    if (StepOfDataFile(name) == step && !keep.count(name)) std::filesystem::remove(file.path(), ec);
  }
}

Result<std::shared_ptr<RocksDbShardStore::StagingFile>> RocksDbShardStore::StagingFileFor(const std::string& run,
                                                                                          int64_t step) {
  MutexLock lock(staging_mu_);
  std::shared_ptr<StagingFile>& file = staging_[{run, step}];
  if (file) return file;  // a commit closes a file only after taking it out of staging_
  const std::string dir = CheckpointDir(run);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return IoError("cannot create " + dir + " for a checkpoint's data (" + ec.message() +
                   "); check the disk and its permissions");
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
Status RocksDbShardStore::SyncDataFile(const std::string& path, uint64_t end, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Damaged("the " + what,
                   "names the data file " + path + ", which cannot be opened (" + std::strerror(errno) + ")");
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

Result<bool> RocksDbShardStore::ManifestExists(const std::string& run, int64_t step) {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), checkpoints_, keys::ManifestKey(run, step), &value);
  if (s.IsNotFound()) return false;
  STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "looking up the " + Describe(run, step)));
  return true;
}

// The manifest of committed checkpoint (run, step), decoded once for a restore's many tensor
// reads (the last one asked for is kept: a committed manifest never changes).
Result<std::shared_ptr<const CheckpointInfo>> RocksDbShardStore::CommittedManifest(const std::string& run,
                                                                                   int64_t step) {
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
Result<CheckpointInfo> RocksDbShardStore::DecodeManifestAt(const std::string& run, int64_t step,
                                                           const rocksdb::Slice& value) const {
  Result<CheckpointInfo> info = records::DecodeManifest(View(value));
  if (!info.ok()) return Damaged("the " + Describe(run, step), info.status().message());
  if (info->run != run || info->step != step) {
    return Damaged("the " + Describe(run, step),
                   "has a manifest naming run " + info->run + " step " + std::to_string(info->step));
  }
  return info;
}

}  // namespace strata::storage::internal
