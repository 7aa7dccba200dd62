// Reading one record's byte range of a data file into a reusable buffer, at the disk's sequential
// bandwidth when it is cold and at page-cache speed when it is warm (private to storage/).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::storage {

// Reads [offset, offset + size) of the data file `path` into `buffer` and returns those bytes (a
// span inside `buffer`, which may start past its beginning: O_DIRECT reads whole aligned blocks).
// `what` ("activation", "checkpoint") names the file in messages. Corruption when the file cannot
// be opened or is shorter than the range (the store's index names a range it does not hold).
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
