#include "storage/wal_tail.h"

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

namespace strata::storage {
namespace {

constexpr size_t kBlockSize = 32768;
constexpr size_t kHeaderSize = 7;
constexpr size_t kRecyclableHeaderSize = 11;  // types 5..8 carry the log number too

// CRC32C (Castagnoli, reflected 0x82F63B78), as RocksDB's crc32c::Value / Extend.
uint32_t Crc32c(uint32_t crc, const uint8_t* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t Unmask(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

uint32_t Fixed32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }

size_t HeaderSizeOf(uint8_t type) { return type >= 5 && type <= 8 ? kRecyclableHeaderSize : kHeaderSize; }

// A whole record at `pos` (within its block and the file) whose checksum holds.
bool ValidRecordAt(const std::vector<uint8_t>& log, size_t pos) {
  const size_t block_left = kBlockSize - pos % kBlockSize;
  if (block_left < kHeaderSize || pos + kHeaderSize > log.size()) return false;
  const uint8_t type = log[pos + 6];
  const size_t length = log[pos + 4] | (log[pos + 5] << 8);
  const size_t header = HeaderSizeOf(type);
  if (type == 0 || type > 10 || header + length > block_left || pos + header + length > log.size()) return false;
  // The checksum covers the type byte, the log number of a recyclable record, and the payload.
  const uint32_t crc = Crc32c(0, &log[pos + 6], header - 6 + length);
  return crc == Unmask(Fixed32(&log[pos]));
}

}  // namespace

Result<bool> LogEndsInCutRecord(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot read " + path);
  const std::vector<uint8_t> log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  uint8_t last_type = 0;
  while (pos < log.size()) {
    const size_t block_left = kBlockSize - pos % kBlockSize;
    if (block_left < kHeaderSize) {  // a block's trailer: zeros up to the next block
      pos += block_left;
      continue;
    }
    if (pos + kHeaderSize > log.size()) return true;  // even the header was cut
    const uint8_t type = log[pos + 6];
    const size_t length = log[pos + 4] | (log[pos + 5] << 8);
    if (type == 0 && length == 0) {  // preallocated zeros: the rest of the block is unused
      pos += block_left;
      continue;
    }
    const size_t header = HeaderSizeOf(type);
    if (pos + header + length > log.size()) {
      // The record runs past the end. Cut, unless a whole record starts after its header.
      for (size_t next = pos + 1; next + kHeaderSize <= log.size(); ++next) {
        if (ValidRecordAt(log, next)) return false;
      }
      return true;
    }
    if (!ValidRecordAt(log, pos)) return false;  // damage before the end
    last_type = type;
    pos += header + length;
  }
  // Every fragment whole: cut only if the last one began a record that never finished (a first
  // or middle fragment: types 2, 3 and their recyclable 6, 7), the cut falling between fragments.
  return last_type == 2 || last_type == 3 || last_type == 6 || last_type == 7;
}

std::string NewestLog(const std::string& dir) {
  std::string newest;
  uint64_t highest = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".log") continue;
    const std::string stem = entry.path().stem().string();
    if (stem.empty() || stem.find_first_not_of("0123456789") != std::string::npos) continue;
    const uint64_t number = std::stoull(stem);
    if (newest.empty() || number > highest) newest = entry.path().string(), highest = number;
  }
  return newest;
}

}  // namespace strata::storage
