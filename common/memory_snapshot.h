// One device's memory as a worker measures it and the coordinator keeps it (heartbeats carry it
// as schema MemoryStats; schema/envelope.h converts).
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct MemorySnapshot {
  std::string device = "cpu";  // "cpu" or "cuda:N"
  uint64_t total_bytes = 0;    // CPU: cgroup limit or MemTotal; GPU: device memory
  uint64_t free_bytes = 0;
  uint64_t allocated_bytes = 0;  // CPU: resident set; GPU: the caching allocator's allocated bytes
  uint64_t reserved_bytes = 0;
  uint64_t peak_bytes = 0;
  // The worker's host (its cgroup limit or MemTotal, and MemAvailable within it), which an
  // offloaded optimizer's state takes; 0: not reported (an older worker).
  uint64_t host_total_bytes = 0;
  uint64_t host_free_bytes = 0;
  // The disk of the worker's shard store: its size, what a checkpoint may still use there (free
  // space less the reserve the store keeps for its own upkeep) and the filesystem's id (stores of
  // one host on one filesystem share its space); 0: not reported.
  uint64_t store_total_bytes = 0;
  uint64_t store_free_bytes = 0;
  uint64_t store_fs_id = 0;
};

}  // namespace strata
