// Shuffled batches of captured rows, for training on them (sparse autoencoders and their peers):
// every stored row exactly once per epoch, in an order fixed by (seed, epoch), read and gathered
// by threads of the stream's own while the caller consumes earlier batches.
//
// Order (docs/python.md, "Shuffled batches"). For epoch e, a SplitMix64 generator seeded with
// seed and e drives every draw, and Fisher-Yates (with unbiased bounded draws) every shuffle:
//   1. the chunks are shuffled;
//   2. they are taken in that order into a buffer until it holds at least buffer_rows rows (and
//      the rows carried over from the window before);
//   3. the buffer's rows are shuffled; whole batches of batch_rows go out in that order, and
//      what is left (fewer than batch_rows) stays in the buffer for the next window;
//   4. after the last window the rest is one short batch (unless drop_last).
// With buffer_rows >= the capture's rows the epoch is one uniform permutation of all rows. With
// shuffle off the rows come in row order. The same (index, options) give the same batches.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "activations/reader.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace strata::activations {

struct BatchOptions {
  std::vector<std::pair<int64_t, std::string>> records;  // (layer, site) of each array of a batch
  uint64_t batch_rows = 4096;
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t epochs = 1;
  // Rows shuffled together (step 2). 0: what 256 MiB of the asked records hold, at least a batch.
  uint64_t buffer_rows = 0;
  bool drop_last = false;  // no short batch at the end of an epoch
  size_t prefetch = 4;     // batches made ahead of the caller
  // Threads reading chunks (each with a reader of its own) and gathering rows into batches.
  // 0: the machine's cores, at most 8. The order does not depend on it.
  size_t threads = 0;
  // How chunks that are not in the page cache are read from stores (ActivationReader::ReadChunk;
  // chunks it holds are copied from it either way). false: around it (O_DIRECT, one request per
  // record: the disk's sequential bandwidth, where buffered reads reached 61-69% of it, and no
  // other cached data pushed out), and they stay uncached; true: through it, slower from the disk,
  // but the next read of them comes from memory. Unset: true when this stream reads them again
  // (epochs > 1) and one epoch's records fit in half the memory available now, else false. A
  // program that opens a stream per epoch over a capture that fits in memory passes true.
  std::optional<bool> page_cache;
};

// Bytes that are not zero-filled when allocated: a batch's every byte is written before it is read.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Bytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// Buffers for batches, given back when their user is done with them (the Python arrays' capsules
// do), so that steady-state batches reuse mapped pages: a fresh multi-MiB allocation costs a page
// fault and a zeroed page per 4 KiB, a quarter of the time of making a batch. Thread-safe.
class BufferPool {
 public:
  // A kept buffer that holds `size` bytes, or a new one; not zero-filled.
  Bytes Take(size_t size) STRATA_EXCLUDES(mu_);
  void Give(Bytes&& buffer) STRATA_EXCLUDES(mu_);  // kept while fewer than kKept are, else freed

 private:
  static constexpr size_t kKept = 64;
  Mutex mu_;
  std::vector<Bytes> kept_ STRATA_GUARDED_BY(mu_);
};

struct Batch {
  int64_t epoch = 0;
  std::vector<uint64_t> rows;  // the capture's row numbers, in batch order
  std::vector<Bytes> data;     // per record: [rows.size(), row shape...] of index.dtype
};

// The generator of the order: SplitMix64 over a state made from (seed, epoch).
class SplitMix64 {
 public:
  SplitMix64(uint64_t seed, uint64_t stream);
  uint64_t Next();
  uint64_t Below(uint64_t n);  // uniform in [0, n), n > 0 (Lemire's method, rejection keeps it unbiased)
  template <typename T>
  void Shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(i)]);
  }

 private:
  uint64_t state_;
};

class BatchStream {
 public:
  using OpenReader = std::function<Result<std::unique_ptr<ActivationReader>>()>;
  // `open` makes the reader of the stream's thread (a reader serves one thread). InvalidArgument
  // for a record not captured or batch_rows = 0; Unavailable / NotFound when rows are missing
  // (a running capture, or stores not given), naming them.
  static Result<std::unique_ptr<BatchStream>> Start(OpenReader open, ActivationIndex index, BatchOptions options);
  virtual ~BatchStream() = default;  // stops and joins the thread
  // The next batch (blocks until it is ready); nullopt after the last; a read error once met.
  virtual Result<std::optional<Batch>> Next() = 0;
  // Where a batch's buffers came from: give them back there when done (optional).
  virtual std::shared_ptr<BufferPool> buffers() const = 0;
};

}  // namespace strata::activations
