#include <unistd.h>

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

}  // namespace

MemorySnapshot ReadCpuMemory() {
  MemorySnapshot m;
  m.device = "cpu";
  const uint64_t mem_total = MeminfoKb("MemTotal") * 1024;
  const uint64_t limit = CgroupLimit();
  m.total_bytes = (limit > 0 && limit < mem_total) ? limit : mem_total;
  m.free_bytes = MeminfoKb("MemAvailable") * 1024;
  if (m.free_bytes > m.total_bytes) m.free_bytes = m.total_bytes;
  m.allocated_bytes = StatusKb("VmRSS") * 1024;
  m.reserved_bytes = m.allocated_bytes;
  m.peak_bytes = ReadCpuPeakBytes();
  return m;
}

uint64_t ReadCpuPeakBytes() { return StatusKb("VmHWM") * 1024; }

}  // namespace strata::worker
