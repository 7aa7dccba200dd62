// A capture on disk without a model: the store layout of an extract run (chunk files of every
// layer's record plus the tokens record, the RocksDB index, the run record), written by the
// store's own writer (ShardStore::PutActivationChunk) with pseudo-random values. For measuring
// reads on machines where a real capture of that size would take hours of CPU forward passes
// (bench/batches_bench.py reads it like any capture: `stores=[DIR]`).
//
// usage: synthetic_capture DIR RUN [LAYERS=12] [HIDDEN=768] [ROWS=1048576] [CHUNK_ROWS=16384] [SITE=resid_post]
// The defaults are bench/activations_bench.sh's `batches` capture on the GPU node: GPT-2 124M,
// resid_post of 12 blocks, bf16, 16 sequences of 1024 tokens per chunk, 1M tokens (~19 GB).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "storage/shard_store.h"

using namespace strata;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s DIR RUN [LAYERS=12] [HIDDEN=768] [ROWS=1048576] [CHUNK_ROWS=16384] [SITE=resid_post]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1], run = argv[2];
  auto arg = [&](int i, uint64_t fallback) { return argc > i ? std::strtoull(argv[i], nullptr, 10) : fallback; };
  const int64_t layers = static_cast<int64_t>(arg(3, 12));
  const int64_t hidden = static_cast<int64_t>(arg(4, 768));
  const uint64_t rows = arg(5, 1 << 20), chunk_rows = arg(6, 16384);
  const std::string site = argc > 7 ? argv[7] : "resid_post";
  if (layers < 1 || hidden < 1 || rows < 1 || chunk_rows < 1) {
    std::fprintf(stderr, "LAYERS, HIDDEN, ROWS and CHUNK_ROWS must be at least 1\n");
    return 2;
  }
  auto store = storage::ShardStore::Open(dir);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  storage::ActivationRunInfo info;
  for (int64_t l = 0; l < layers; ++l) info.layers.push_back(l);
  info.sites = {site};
  info.row_shapes = {{hidden}};
  info.dtype = storage::DType::kBF16;
  info.total_rows = rows;
  info.sequence = 1024;
  if (Status st = (*store)->PutActivationRun(run, info); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  // One buffer per layer, refilled per chunk from a xorshift stream (the values do not matter, but
  // every chunk's must differ so that a test of the reader could tell chunks apart).
  std::vector<std::vector<uint8_t>> values(layers, std::vector<uint8_t>(chunk_rows * hidden * 2));
  std::vector<int64_t> tokens(chunk_rows * storage::kActivationTokenColumns);
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  const auto start = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (uint64_t chunk = 0, begin = 0; begin < rows; ++chunk, begin += chunk_rows) {
    const uint64_t count = std::min(chunk_rows, rows - begin);
    std::vector<storage::ActivationRecordView> records;
    for (int64_t l = 0; l < layers; ++l) {
      auto* words = reinterpret_cast<uint64_t*>(values[l].data());
      for (size_t i = 0; i < values[l].size() / 8; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        words[i] = x;
      }
      records.push_back(
          {l,
           site,
           {storage::DType::kBF16, {static_cast<int64_t>(count), hidden}, {values[l].data(), count * hidden * 2}}});
    }
    for (uint64_t i = 0; i < count; ++i) {
      tokens[i * 3] = static_cast<int64_t>((begin + i) % 50257);
      tokens[i * 3 + 1] = static_cast<int64_t>((begin + i) / 1024);
      tokens[i * 3 + 2] = static_cast<int64_t>((begin + i) % 1024);
    }
    records.push_back({0,
                       storage::kActivationTokensSite,
                       {storage::DType::kI64,
                        {static_cast<int64_t>(count), storage::kActivationTokenColumns},
                        {reinterpret_cast<const uint8_t*>(tokens.data()), count * 3 * sizeof(int64_t)}}});
    storage::ActivationChunkInfo c{chunk, begin, count, 0};
    for (const auto& r : records) c.bytes += r.tensor.bytes.size();
    if (Status st = (*store)->PutActivationChunk(run, c, records); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    bytes += c.bytes;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"run\": \"%s\", \"rows\": %llu, \"bytes\": %llu, \"seconds\": %.3f}\n", run.c_str(),
              static_cast<unsigned long long>(rows), static_cast<unsigned long long>(bytes), seconds);
  return 0;
}
