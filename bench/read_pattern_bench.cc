// The read pattern of shuffled batches (activations/batches.h) with plain preads and nothing else:
// the byte ranges of one (layer, site) that capture.batches(...) reads, in its order (chunks
// shuffled by the same seed), taken by the same number of threads, each chunk's record in one
// pread into a reused buffer - no checksum, no copy, no gather. Against the same chunk files read
// whole, sequentially. Tells whether the pattern or our code loses the disk's bandwidth
// (bench/batches_bench.py prints it beside the batches' numbers).
//
// usage: read_pattern_bench RUN LAYER SITE THREADS SEED MODE[,MODE...] STORE_DIR [STORE_DIR...]
//   MODE records         one buffered pread per record (what the store did before O_DIRECT reads)
//        records-willneed  the same after posix_fadvise(WILLNEED) of the record (all of it queued at once)
//        records-direct  one O_DIRECT pread per record (its 4 KiB-aligned cover), into a buffer on
//                        2 MiB pages where the kernel gives them (as the store reads)
//        records-direct-4k  the same into 4 KiB pages (the requests are cut at max_segments pages)
//        files           every chunk file the pattern touches, whole, 16 MiB buffered reads
// Every mode starts cold: the stores' files are synced and dropped from the page cache
// (posix_fadvise DONTNEED) first. Prints one JSON line per mode.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "activations/batches.h"
#include "activations/reader.h"
#include "storage/shard_store.h"

using namespace strata;

namespace {

struct Range {
  std::string file;
  uint64_t offset = 0, size = 0;
};

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "read_pattern_bench: %s\n", message.c_str());
  std::exit(1);
}

void DropCache(const std::vector<std::string>& stores) {
  ::sync();
  for (const std::string& store : stores) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(store)) {
      if (!entry.is_regular_file()) continue;
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
}

// Reads `size` bytes at `offset` of `fd`; the bytes read (short only at the file's end).
uint64_t ReadAll(int fd, uint8_t* out, uint64_t size, uint64_t offset) {
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail(std::string("pread: ") + std::strerror(errno));
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  return done;
}

// `work(thread, item, buffer)` over items [0, count), taken in order by `threads` threads; the bytes
// they return summed.
// Each thread's buffer is a RecordBuffer (on huge pages from 2 MiB, as the store reads into), or
// with `small_pages` one on 4 KiB pages (MADV_NOHUGEPAGE).
template <typename Work>
uint64_t Parallel(size_t threads, size_t count, size_t buffer_bytes, Work work, bool small_pages = false) {
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> total{0};
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      storage::RecordBuffer buffer;
      uint8_t* data = nullptr;
      std::unique_ptr<uint8_t, decltype(&std::free)> small(nullptr, &std::free);
      if (small_pages) {
        const size_t rounded = (buffer_bytes + 4095) / 4096 * 4096;
        small.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, rounded)));
        ::madvise(small.get(), rounded, MADV_NOHUGEPAGE);
        data = small.get();
      } else {
        data = buffer.Reserve(buffer_bytes);
      }
      for (size_t i; (i = next.fetch_add(1)) < count;) total += work(i, data);
    });
  }
  for (auto& t : pool) t.join();
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s RUN LAYER SITE THREADS SEED MODE[,MODE...] STORE_DIR [STORE_DIR...]\n", argv[0]);
    return 2;
  }
  const std::string run = argv[1], site = argv[3];
  const int64_t layer = std::strtoll(argv[2], nullptr, 10);
  size_t threads = std::strtoull(argv[4], nullptr, 10);
  if (threads == 0) threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);  // batches' default
  const uint64_t seed = std::strtoull(argv[5], nullptr, 10);
  std::vector<std::string> modes;
  for (std::string m = argv[6]; !m.empty();) {
    const size_t comma = m.find(',');
    modes.push_back(m.substr(0, comma));
    m = comma == std::string::npos ? "" : m.substr(comma + 1);
  }
  const std::vector<std::string> dirs(argv + 7, argv + argc);

  // The chunks in batches' order for epoch 0 (BatchStream: SplitMix64(seed, 0) shuffles them first).
  auto reader = activations::ActivationReader::OpenStores(dirs);
  if (!reader.ok()) Fail(reader.status().ToString());
  auto index = (*reader)->Index(run);
  if (!index.ok()) Fail(index.status().ToString());
  std::vector<size_t> order(index->chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  activations::SplitMix64 rng(seed, 0);
  rng.Shuffle(order);
  reader->reset();

  storage::StoreOptions options;
  options.read_only = true;
  options.create_if_missing = false;
  std::vector<std::unique_ptr<storage::ShardStore>> stores;
  for (const std::string& dir : dirs) {
    auto store = storage::ShardStore::Open(dir, options);
    if (!store.ok()) Fail(store.status().ToString());
    stores.push_back(std::move(*store));
  }
  std::vector<Range> ranges;
  std::vector<std::string> files;
  uint64_t largest = 0;
  for (size_t i : order) {
    const activations::StoredChunk& c = index->chunks[i];
    auto where = stores[c.store]->LocateActivation(run, layer, site, c.row_begin);
    if (!where.ok()) Fail(where.status().ToString());
    ranges.push_back({where->file, where->offset, where->size});
    files.push_back(where->file);
    largest = std::max(largest, where->size);
  }
  stores.clear();

  for (const std::string& mode : modes) {
    DropCache(dirs);
    const auto start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    std::string what;
    if (mode == "records" || mode == "records-direct" || mode == "records-willneed" || mode == "records-direct-4k") {
      const bool small_pages = mode == "records-direct-4k";
      const bool direct = mode == "records-direct" || small_pages, willneed = mode == "records-willneed";
      what = small_pages ? "read pattern: one O_DIRECT pread per record into 4 KiB pages, batches' order"
             : direct    ? "read pattern: one O_DIRECT pread per record, batches' order"
             : willneed  ? "read pattern: WILLNEED then one buffered pread per record, batches' order"
                         : "read pattern: one buffered pread per record, batches' order";
      constexpr uint64_t kAlign = storage::RecordBuffer::kAlignment;
      bytes = Parallel(
          threads, ranges.size(), largest + 2 * kAlign,
          [&](size_t i, uint8_t* buffer) {
            const Range& r = ranges[i];
            const int fd = ::open(r.file.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
            if (fd < 0) Fail("open " + r.file + ": " + std::strerror(errno));
            const uint64_t begin = direct ? r.offset / kAlign * kAlign : r.offset;
            const uint64_t end = direct ? (r.offset + r.size + kAlign - 1) / kAlign * kAlign : r.offset + r.size;
            if (willneed)
              ::posix_fadvise(fd, static_cast<off_t>(begin), static_cast<off_t>(end - begin), POSIX_FADV_WILLNEED);
            ReadAll(fd, buffer, end - begin, begin);
            ::close(fd);
            return r.size;
          },
          small_pages);
    } else if (mode == "files") {
      what = "chunk files read whole, sequentially (16 MiB buffered preads)";
      constexpr uint64_t kBlock = 16 << 20;
      bytes = Parallel(threads, files.size(), kBlock, [&](size_t i, uint8_t* buffer) {
        const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) Fail("open " + files[i] + ": " + std::strerror(errno));
        uint64_t done = 0;
        for (uint64_t n; (n = ReadAll(fd, buffer, kBlock, done)) > 0;) done += n;
        ::close(fd);
        return done;
      });
    } else {
      Fail("unknown mode " + mode + " (records, records-willneed, records-direct, records-direct-4k, files)");
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "{\"measure\": \"%s\", \"mode\": \"%s\", \"threads\": %zu, \"records\": %zu, \"bytes\": %llu, "
        "\"seconds\": %.3f, \"GB_per_s\": %.3f}\n",
        what.c_str(), mode.c_str(), threads, ranges.size(), static_cast<unsigned long long>(bytes), seconds,
        bytes / seconds / 1e9);
    std::fflush(stdout);
  }
  return 0;
}
