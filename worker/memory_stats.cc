#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <string>

#include "worker/task.h"

namespace strata::worker {
namespace {

uint64_t MeminfoKb(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == field + ":") return value;
  }
  return 0;
}

uint64_t StatusKb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream ss(line.substr(field.size() + 1));
      uint64_t kb = 0;
      ss >> kb;
      return kb;
    }
  }
  return 0;
}

// cgroup v2 limit, if one is set; 0 otherwise.
uint64_t CgroupLimit() {
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string value;
  if (!(in >> value) || value == "max") return 0;
  try {
    return std::stoull(value);
  } catch (...) {
    return 0;
  }
}

// --memory-limit on a CPU worker: the address space the process had when the limit was set, and
// the limit (0 = none).
std::atomic<uint64_t> g_limit_baseline{0};
std::atomic<uint64_t> g_limit_bytes{0};

}  // namespace

Status LimitCpuMemory(uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  // One malloc arena: each extra arena reserves 64 MiB of address space per thread that touches
  // it, which would count against the limit without holding any data.
  mallopt(M_ARENA_MAX, 1);
  // A fixed mmap threshold: blocks of 1 MiB and more are mapped and unmapped with each tensor.
  // The default threshold rises after the first large free, so later tensors come from the heap,
  // which keeps its address space after they are freed, and a finished step's peak would stay
  // counted against the limit (a new task could not even start its threads).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const uint64_t baseline = StatusKb("VmSize") * 1024;
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = baseline + bytes;
  if (setrlimit(RLIMIT_AS, &limit) != 0) {
    return Internal(
        "--memory-limit: setrlimit(RLIMIT_AS) failed; run without --memory-limit or limit the process from outside "
        "(systemd MemoryMax=, docker --memory)");
  }
  g_limit_baseline.store(baseline);
  g_limit_bytes.store(bytes);
  return Status::Ok();
}

MemorySnapshot ReadCpuMemory() {
  MemorySnapshot m;
  m.device = "cpu";
  const uint64_t mem_total = MeminfoKb("MemTotal") * 1024;
  const uint64_t limit = CgroupLimit();
  m.total_bytes = (limit > 0 && limit < mem_total) ? limit : mem_total;
  m.free_bytes = MeminfoKb("MemAvailable") * 1024;
  if (const uint64_t own = g_limit_bytes.load(); own > 0) {  // what the OS lets this process still map
    const uint64_t size = StatusKb("VmSize") * 1024,
                   grown = size > g_limit_baseline.load() ? size - g_limit_baseline.load() : 0;
    m.total_bytes = std::min(m.total_bytes, own);
    m.free_bytes = std::min<uint64_t>(m.free_bytes, own > grown ? own - grown : 0);
  }
  if (m.free_bytes > m.total_bytes) m.free_bytes = m.total_bytes;
  m.allocated_bytes = StatusKb("VmRSS") * 1024;
  m.reserved_bytes = m.allocated_bytes;
  m.peak_bytes = ReadCpuPeakBytes();
  m.host_total_bytes = m.total_bytes;  // a CPU worker's device is its host
  m.host_free_bytes = m.free_bytes;
  return m;
}

uint64_t ReadCpuPeakBytes() { return StatusKb("VmHWM") * 1024; }

}  // namespace strata::worker
