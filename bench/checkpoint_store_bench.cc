// Checkpoint store throughput: stage N tensors (a rank's shard), commit, then read them back from
// the writer's open store and from a read-only open beside it (as a resuming rank reads another
// worker's store), against the disk's own write and read speed for the same bytes.
//
// usage: checkpoint_store_bench DIR [MiB=700] [TENSORS=150]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "storage/shard_store.h"

using namespace strata;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

void Report(const char* what, double bytes, double seconds) {
  std::printf("%-44s %8.2f s  %8.0f MB/s\n", what, seconds, bytes / seconds / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [MiB=700] [TENSORS=150]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 700;
  const size_t count = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 150;
  const size_t per = (mib << 20) / count / sizeof(float) * sizeof(float);
  const double total = static_cast<double>(per * count);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  std::vector<uint8_t> bytes(per);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[i], &v, 8);
  }

  // The disk: the same bytes as one file, fdatasync'ed, then read back.
  {
    const auto start = Clock::now();
    const int fd = open((dir + "/raw").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    for (size_t i = 0; i < count; ++i) {
      if (write(fd, bytes.data(), per) != static_cast<ssize_t>(per)) return 1;
    }
    fdatasync(fd);
    close(fd);
    Report("disk: write + fdatasync", total, Seconds(start));
    const auto read_start = Clock::now();
    const int in = open((dir + "/raw").c_str(), O_RDONLY);
    std::vector<uint8_t> back(per);
    for (size_t i = 0; i < count; ++i) {
      if (read(in, back.data(), per) != static_cast<ssize_t>(per)) return 1;
    }
    close(in);
    Report("disk: read (page cache)", total, Seconds(read_start));
    std::filesystem::remove(dir + "/raw");
  }

  auto store = storage::ShardStore::Open(dir + "/store");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const std::vector<int64_t> shape = {static_cast<int64_t>(per / sizeof(float))};
  auto start = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    storage::TensorView view{storage::DType::kF32, shape, std::span<const uint8_t>(bytes)};
    if (auto st = (*store)->PutCheckpointTensor("bench", 1, "t" + std::to_string(i), view); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  const double staged = Seconds(start);
  const auto commit_start = Clock::now();
  if (auto st = (*store)->CommitCheckpoint("bench", 1); !st.ok()) return 1;
  Report("store: stage", total, staged);
  Report("store: stage + commit (durable)", total, Seconds(start));
  (void)commit_start;

  start = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    auto t = (*store)->ReadCheckpointTensor("bench", 1, "t" + std::to_string(i));
    if (!t.ok()) return 1;
  }
  Report("store: read, writer's open store", total, Seconds(start));

  storage::StoreOptions read_only;
  read_only.create_if_missing = false;
  read_only.read_only = true;
  start = Clock::now();
  auto beside = storage::ShardStore::Open(dir + "/store", read_only);
  if (!beside.ok()) return 1;
  const double opened = Seconds(start);
  for (size_t i = 0; i < count; ++i) {
    auto t = (*beside)->ReadCheckpointTensor("bench", 1, "t" + std::to_string(i));
    if (!t.ok()) return 1;
  }
  std::printf("(read-only open: %.2f s)\n", opened);
  Report("store: read-only open + read, beside the writer", total, Seconds(start));
  return 0;
}
