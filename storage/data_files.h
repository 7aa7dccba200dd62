// The data files beside the store's RocksDB (private to storage/): checkpoint tensors and
// activation chunks, each byte written once from the caller's buffers and read straight into the
// reader's (rocksdb_shard_store.cc says why they are not RocksDB values).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::storage {

// Writes one data file with pwrite(2) straight from the caller's buffers, starting writeback of
// each piece as it goes; WriteAt may be called from several threads at once (disjoint ranges).
class ChunkFileWriter {
 public:
  ChunkFileWriter() = default;
  ChunkFileWriter(const ChunkFileWriter&) = delete;
  ChunkFileWriter& operator=(const ChunkFileWriter&) = delete;
  ~ChunkFileWriter();
  Status Open(const std::string& path);
  // A full disk is kResourceExhausted, other failures kIoError, both naming the file.
  Status WriteAt(uint64_t offset, std::span<const uint8_t> bytes);
  Status SyncAndClose();

 private:
  std::string path_;
  int fd_ = -1;
};

// Makes a rename in `dir` durable.
Status SyncDirectory(const std::string& dir);

// Reads out.size() bytes at `offset` of the data file `path` straight into `out`. `what`
// ("activation", "checkpoint") names the file in messages; Corruption when the file cannot be
// opened or is shorter than the range (the store's index names a range it does not hold).
Status ReadFileRange(const std::string& path, const char* what, uint64_t offset, std::span<uint8_t> out);

// Reads [offset, offset + size) of the data file `path` into `buffer` and returns those bytes (a
// span inside `buffer`, which may start past its beginning: O_DIRECT reads whole aligned blocks).
// `what` and the errors as ReadFileRange's.
//
// How (kDirect): when every page of the range is in the page cache (mincore over a mapping of it), one
// buffered pread copies it from there. Otherwise one O_DIRECT pread of the range's 4 KiB-aligned
// cover: a single request of the whole record lets the block layer queue it all at once (in pieces
// of max_sectors_kb, or of max_segments pages: RecordBuffer's huge pages keep those pieces large),
// where a buffered read keeps only about one read-ahead window (read_ahead_kb, 128 KiB by default)
// in flight per reader. The bytes do not enter the page cache.
// Where O_DIRECT is refused (tmpfs, some network file systems) the read is buffered.
// With kThroughPageCache a cold range is read buffered, like a warm one.
Result<std::span<const uint8_t>> ReadFileRecord(const std::string& path, const char* what, uint64_t offset,
                                                uint64_t size, RecordBuffer& buffer, ColdRead cold);

// Whether every page of [offset, offset + size) of the open file `fd` is in the page cache.
bool RangeInPageCache(int fd, uint64_t offset, uint64_t size);

}  // namespace strata::storage
