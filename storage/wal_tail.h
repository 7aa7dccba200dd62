// Tells a write-ahead log cut short by a killed writer from a damaged one. RocksDB's log
// (db/log_format.h: 32 KiB blocks of records, each a 7-byte header - masked CRC32C of type and
// payload, 2-byte length, 1-byte type - and its payload) reports both "a record runs past the end
// of the file" cases alike: a writer killed mid-write(2) (a write of more than a page stops at a
// fatal signal), and a flipped length field anywhere in the last block. The difference is what
// lies beyond: after a cut, nothing - the cut record was the last thing written; after a flipped
// length, the records that followed, still whole with valid checksums.
#pragma once

#include <string>

#include "common/status.h"

namespace strata::storage {

// True when the log at `path` holds whole, checksum-valid records up to one final record that
// runs past the end of the file, and no valid record starts after that record's header.
Result<bool> LogEndsInCutRecord(const std::string& path);

// The newest write-ahead log (highest number, *.log) of the store at `dir`; empty when none.
std::string NewestLog(const std::string& dir);

}  // namespace strata::storage
