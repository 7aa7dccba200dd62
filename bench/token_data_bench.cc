// Token data: load time and range-scan speed of a large u32 token file (worker/token_data.h), and
// what the loader it replaced cost (the whole file read into each worker's heap).
//
//   token_data_bench [--path FILE] [--gib N] [--vocab V] [--repeat R]
//
// Writes FILE (default /tmp/strata-bench-tokens.u32, N GiB of random ids below V) unless it already
// has that size, then prints, one line each:
//   warm load   TokenData::Load with the file in the page cache: mmap + the vectorized range scan
//               (best of R), so bytes / time is the scan's speed
//   memcpy      the mapping copied piecewise into a cache-resident buffer, from a fresh mapping and
//               from a mapped one: what reading the file costs with no check at all (reference)
//   cold load   the same after evicting the file's pages (posix_fadvise DONTNEED): disk + scan
//   heap        anonymous memory the process gained by loading (a mapping shares the page cache)
//   windows     BatchOffsets + Read of a step's windows (global_batch 512 x (1024 + 1) tokens)
//   old load    the previous loader's way: read the file whole into a vector, widen to int32
// Results: docs/benchmarks.md, "Token data".
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "worker/token_data.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Anonymous resident memory of this process (RssAnon), in bytes.
long long RssAnon() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::atoll(line.c_str() + 8) * 1024;
  }
  return -1;
}

bool Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool ok = ::fdatasync(fd) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/tmp/strata-bench-tokens.u32";
  double gib = 1.0;
  long long vocab = 50257;
  int repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--path")
      path = argv[i + 1];
    else if (flag == "--gib")
      gib = std::atof(argv[i + 1]);
    else if (flag == "--vocab")
      vocab = std::atoll(argv[i + 1]);
    else if (flag == "--repeat")
      repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const uint64_t tokens = static_cast<uint64_t>(gib * (1ull << 30)) / 4;
  const uint64_t bytes = tokens * 4;
  std::ifstream probe(path, std::ios::binary | std::ios::ate);
  if (!probe || static_cast<uint64_t>(probe.tellg()) != bytes) {
    std::fprintf(stderr, "writing %s (%llu ids)...\n", path.c_str(), static_cast<unsigned long long>(tokens));
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    std::vector<uint32_t> chunk(1 << 20);
    uint64_t x = 88172645463325252ull;  // xorshift64: fast, and random enough for a scan
    for (uint64_t done = 0; done < tokens; done += chunk.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), tokens - done));
      for (size_t i = 0; i < n; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        chunk[i] = static_cast<uint32_t>(x % static_cast<uint64_t>(vocab));
      }
      out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n * 4));
    }
  }
  strata::DataSpec spec;
  spec.path = path;
  spec.format = strata::TokenFormat::kU32;
  const double gb = static_cast<double>(bytes) / 1e9;

  double best = 1e30;
  for (int r = 0; r < repeat + 1; ++r) {  // the first pass warms the page cache
    const auto start = std::chrono::steady_clock::now();
    auto data = strata::worker::TokenData::Load(spec, vocab);
    const double s = Seconds(start);
    if (!data.ok()) {
      std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
      return 1;
    }
    if (r > 0) best = std::min(best, s);
  }
  std::printf("warm load   %.3f s for %.2f GB: %.2f GB/s (best of %d; mmap + range scan)\n", best, gb, gb / best,
              repeat);

  {
    // Reference on the same file: glibc's memcpy (AVX2 where the CPU has it) of the mapping in
    // 256 KiB pieces into one cache-resident buffer, i.e. what reading it costs with no check at
    // all: over a fresh mapping (page faults included, as in Load) and again over the same one
    // (memory bandwidth alone).
    const int fd = ::open(path.c_str(), O_RDONLY);
    std::vector<char> buffer(256 << 10);
    double fresh = 1e30, again = 1e30;
    for (int r = 0; r < repeat; ++r) {
      void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      const char* p = static_cast<const char*>(base);
      for (double* best : {&fresh, &again}) {
        const auto start = std::chrono::steady_clock::now();
        for (uint64_t at = 0; at < bytes; at += buffer.size()) {
          std::memcpy(buffer.data(), p + at, std::min<uint64_t>(buffer.size(), bytes - at));
        }
        *best = std::min(*best, Seconds(start));
      }
      ::munmap(base, bytes);
    }
    ::close(fd);
    std::printf(
        "memcpy      %.2f GB/s from a fresh mapping, %.2f GB/s from a mapped one (reference: reading with no check)\n",
        gb / fresh, gb / again);
  }

  if (Evict(path)) {
    const auto start = std::chrono::steady_clock::now();
    auto data = strata::worker::TokenData::Load(spec, vocab);
    const double s = Seconds(start);
    std::printf("cold load   %.3f s: %.2f GB/s (pages evicted with posix_fadvise first; disk-bound)\n", s, gb / s);
  } else {
    std::printf("cold load   skipped: cannot evict %s\n", path.c_str());
  }

  {
    const long long before = RssAnon();
    auto data = strata::worker::TokenData::Load(spec, vocab);
    std::printf("heap        +%.1f MiB anonymous memory after Load (the ids stay in the shared page cache)\n",
                static_cast<double>(RssAnon() - before) / (1 << 20));
    const int64_t batch = 512, sequence = 1024, steps = 200;
    std::vector<int64_t> window(static_cast<size_t>(batch * (sequence + 1)));
    const auto start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < steps; ++step) {
      const auto offsets = data->BatchOffsets(1234, step, batch, sequence);
      for (int64_t row = 0; row < batch; ++row) {
        if (!data->Read(offsets[row], sequence + 1, window.data() + row * (sequence + 1)).ok()) return 1;
      }
    }
    std::printf("windows     %.3f ms per step of %lld x %lld tokens (BatchOffsets + Read into int64)\n",
                Seconds(start) / steps * 1e3, static_cast<long long>(batch), static_cast<long long>(sequence + 1));
  }

  {
    const long long before = RssAnon();
    const auto start = std::chrono::steady_clock::now();
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<int32_t> ids(raw.size() / 4);
    for (size_t i = 0; i < ids.size(); ++i) std::memcpy(&ids[i], raw.data() + 4 * i, 4);
    const double s = Seconds(start);
    std::printf(
        "old load    %.3f s: %.2f GB/s, +%.1f MiB heap per worker (read whole into a vector, widened to int32)\n", s,
        gb / s, static_cast<double>(RssAnon() - before) / (1 << 20));
  }
  return 0;
}
