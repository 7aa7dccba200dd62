// RocksDbShardStore's activations (extract runs): each chunk's records in a file of its own, their
// index and the chunk cursors in RocksDB, and reads of single records.
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "common/hex.h"
#include "storage/keys.h"
#include "storage/records.h"
#include "storage/rocksdb_shard_store.h"

namespace strata::storage::internal {
namespace {

// Threads writing one chunk file's records (ChunkFileWriter::WriteAt takes disjoint ranges at once).
constexpr size_t kChunkWriteThreads = 4;

}  // namespace

// Why not RocksDB values: a chunk is hundreds of MB written once and read whole, and every
// RocksDB path copies it several times (write batch, memtable, blob file at flush) - measured
// at 0.4 GB/s on an H200 node whose disk takes 1.6 GB/s. So a chunk's bytes go to one file of
// their own (written once from the caller's buffers, fdatasync'ed, renamed into place), and
// RocksDB keeps the small index: per record its file offset, size, dtype, shape and checksum,
// plus the chunk's cursor, in one synced write batch after the file is durable. A crash before
// that batch leaves at most an unreferenced file that the rewrite replaces.
Status RocksDbShardStore::PutActivationChunk(const std::string& run, const ActivationChunkInfo& chunk,
                                             std::span<const ActivationRecordView> records) {
  if (run.empty()) return InvalidArgument("activation chunk: run name is empty");
  if (records.empty())
    return InvalidArgument("activation chunk " + std::to_string(chunk.chunk) + " of run " + run + " has no records");
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
        batch.Put(activations_, keys::ActivationRecordKey(run, record.site, record.layer, chunk.row_begin), ref), path_,
        action));
  }
  std::filesystem::rename(file + ".tmp", file, ec);
  if (ec) return IoError(action + ": cannot rename " + file + ".tmp (" + ec.message() + ")");
  STRATA_RETURN_IF_ERROR(SyncDirectory(dir));
  STRATA_RETURN_IF_ERROR(FromRocks(
      batch.Put(activations_, keys::ActivationCursorKey(run, chunk.chunk), EncodeCursor(chunk)), path_, action));
  rocksdb::WriteOptions durable;
  durable.sync = true;
  return FromRocks(db_->Write(durable, &batch), path_, action + " (index)");
}

Status RocksDbShardStore::PutActivationRun(const std::string& run, const ActivationRunInfo& info) {
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

Result<std::optional<ActivationRunInfo>> RocksDbShardStore::GetActivationRun(const std::string& run) {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), activations_, keys::ActivationRunKey(run), &value);
  if (s.IsNotFound()) return std::optional<ActivationRunInfo>();
  STRATA_RETURN_IF_ERROR(FromRocks(s, path_, "reading the activation run record of run " + run));
  ActivationRunInfo info;
  if (!DecodeRunInfo(View(value), &info)) return Damaged("the activation run record of run " + run, "is malformed");
  return std::optional<ActivationRunInfo>(std::move(info));
}

Result<std::optional<ActivationChunkInfo>> RocksDbShardStore::GetActivationChunk(const std::string& run,
                                                                                 uint64_t chunk) {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), activations_, keys::ActivationCursorKey(run, chunk), &value);
  if (s.IsNotFound()) return std::optional<ActivationChunkInfo>();
  STRATA_RETURN_IF_ERROR(
      FromRocks(s, path_, "reading the cursor of chunk " + std::to_string(chunk) + " of run " + run));
  STRATA_ASSIGN_OR_RETURN(ActivationChunkInfo info, DecodeCursor(run, View(value)));
  return std::optional<ActivationChunkInfo>(info);
}

Result<std::vector<ActivationChunkInfo>> RocksDbShardStore::ListActivationChunks(const std::string& run) {
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

Result<Tensor> RocksDbShardStore::ReadActivation(const std::string& run, int64_t layer, const std::string& site,
                                                 uint64_t row_begin) {
  const std::string what = ActivationWhat(run, layer, site, row_begin);
  STRATA_ASSIGN_OR_RETURN(RecordRef ref, FindRecord(run, layer, site, row_begin, what));
  Tensor tensor{ref.dtype, ref.shape, std::vector<uint8_t>(ref.size), ref.checksum};
  const std::string file = ChunkFile(run, ref.chunk);
  STRATA_RETURN_IF_ERROR(ReadFileRange(file, "activation", ref.offset, tensor.bytes));
  if (Checksum(tensor.bytes) != ref.checksum)
    return Damaged("activations " + what + " in " + file, "fail their checksum");
  return tensor;
}

Result<std::span<const uint8_t>> RocksDbShardStore::ReadActivationInto(const std::string& run, int64_t layer,
                                                                       const std::string& site, uint64_t row_begin,
                                                                       RecordBuffer& buffer, ColdRead cold) {
  const std::string what = ActivationWhat(run, layer, site, row_begin);
  STRATA_ASSIGN_OR_RETURN(RecordRef ref, FindRecord(run, layer, site, row_begin, what));
  const std::string file = ChunkFile(run, ref.chunk);
  STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes,
                          ReadFileRecord(file, "activation", ref.offset, ref.size, buffer, cold));
  if (Checksum(bytes) != ref.checksum) return Damaged("activations " + what + " in " + file, "fail their checksum");
  return bytes;
}

Result<ActivationLocation> RocksDbShardStore::LocateActivation(const std::string& run, int64_t layer,
                                                               const std::string& site, uint64_t row_begin) {
  STRATA_ASSIGN_OR_RETURN(RecordRef ref,
                          FindRecord(run, layer, site, row_begin, ActivationWhat(run, layer, site, row_begin)));
  return ActivationLocation{ChunkFile(run, ref.chunk), ref.offset, ref.size, ref.checksum};
}

// Chunk files live under STORE/activations/<hex of run id>/<chunk>.bin (hex: run ids are user
// text and must not become paths).
std::string RocksDbShardStore::ActivationWhat(const std::string& run, int64_t layer, const std::string& site,
                                              uint64_t row_begin) {
  return site + " of layer " + std::to_string(layer) + " at row " + std::to_string(row_begin) + " of run " + run;
}

std::string RocksDbShardStore::ChunkDir(const std::string& run) const { return path_ + "/activations/" + HexOf(run); }
std::string RocksDbShardStore::ChunkFile(const std::string& run, uint64_t chunk) const {
  return ChunkDir(run) + "/" + std::to_string(chunk) + ".bin";
}

std::string RocksDbShardStore::EncodeRecordRef(uint64_t chunk, uint64_t offset, uint64_t checksum,
                                               const TensorView& t) {
  std::string out = EncodeKeyU64(chunk) + EncodeKeyU64(offset) + EncodeKeyU64(t.bytes.size()) + EncodeKeyU64(checksum) +
                    EncodeKeyU64(static_cast<uint64_t>(t.dtype)) + EncodeKeyU64(t.shape.size());
  for (int64_t d : t.shape) out += EncodeKeyU64(static_cast<uint64_t>(d));
  return out;
}

bool RocksDbShardStore::DecodeRecordRef(std::string_view v, RecordRef* ref) {
  uint64_t dtype = 0, rank = 0;
  if (!ConsumeKeyU64(&v, &ref->chunk) || !ConsumeKeyU64(&v, &ref->offset) || !ConsumeKeyU64(&v, &ref->size) ||
      !ConsumeKeyU64(&v, &ref->checksum) || !ConsumeKeyU64(&v, &dtype) || !ConsumeKeyU64(&v, &rank) ||
      dtype > static_cast<uint64_t>(DType::kU8) || rank > 8) {
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
Result<RocksDbShardStore::RecordRef> RocksDbShardStore::FindRecord(const std::string& run, int64_t layer,
                                                                   const std::string& site, uint64_t row_begin,
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
std::string RocksDbShardStore::EncodeRunInfo(const ActivationRunInfo& info) {
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

bool RocksDbShardStore::DecodeRunInfo(std::string_view v, ActivationRunInfo* info) {
  uint64_t dtype = 0, layers = 0, sites = 0;
  if (!ConsumeKeyU64(&v, &dtype) || dtype > static_cast<uint64_t>(DType::kU8) ||
      !ConsumeKeyU64(&v, &info->total_rows) || !ConsumeKeyU64(&v, &info->sequence) || !ConsumeKeyU64(&v, &layers) ||
      layers > v.size() / 8) {
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

std::string RocksDbShardStore::EncodeCursor(const ActivationChunkInfo& c) {
  return EncodeKeyU64(c.chunk) + EncodeKeyU64(c.row_begin) + EncodeKeyU64(c.row_count) + EncodeKeyU64(c.bytes);
}

Result<ActivationChunkInfo> RocksDbShardStore::DecodeCursor(const std::string& run, std::string_view v) const {
  ActivationChunkInfo c;
  if (!ConsumeKeyU64(&v, &c.chunk) || !ConsumeKeyU64(&v, &c.row_begin) || !ConsumeKeyU64(&v, &c.row_count) ||
      !ConsumeKeyU64(&v, &c.bytes) || !v.empty()) {
    return Damaged("an activation chunk cursor of run " + run, "is malformed");
  }
  return c;
}

}  // namespace strata::storage::internal
