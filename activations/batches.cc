#include "activations/batches.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/thread_annotations.h"

namespace strata::activations {

SplitMix64::SplitMix64(uint64_t seed, uint64_t stream) : state_(seed) {
  // Epochs must not be neighbouring states of one sequence: mix the stream in through a draw.
  state_ ^= stream * 0xD1B54A32D192ED03ULL;
  (void)Next();
}

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Below(uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

Bytes BufferPool::Take(size_t size) {
  {
    MutexLock lock(mu_);
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i].capacity() >= size) {
        Bytes b = std::move(kept_[i]);
        kept_[i] = std::move(kept_.back());
        kept_.pop_back();
        b.resize(size);
        return b;
      }
    }
  }
  Bytes b;
  b.resize(size);
  return b;
}

void BufferPool::Give(Bytes&& buffer) {
  MutexLock lock(mu_);
  if (kept_.size() < kKept) kept_.push_back(std::move(buffer));
}

namespace {

size_t ThreadCount(size_t asked) {
  if (asked > 0) return std::min<size_t>(asked, 64);
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
}

// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
uint64_t AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}

// BatchOptions::page_cache made definite: through the page cache only where a later epoch can
// read from it.
storage::ColdRead ColdReadOf(const BatchOptions& options, const ActivationIndex& index,
                             const std::vector<uint64_t>& row_bytes) {
  if (options.page_cache)
    return *options.page_cache ? storage::ColdRead::kThroughPageCache : storage::ColdRead::kDirect;
  if (options.epochs < 2) return storage::ColdRead::kDirect;
  uint64_t epoch_bytes = 0;
  for (uint64_t n : row_bytes) epoch_bytes += n * index.total_rows;
  return epoch_bytes <= AvailableMemory() / 2 ? storage::ColdRead::kThroughPageCache : storage::ColdRead::kDirect;
}

// Buffers that chunk records are read into, kept across windows and epochs: their pages stay
// mapped, where a fresh multi-MiB allocation costs a page fault and a zeroed page per 4 KiB.
// Thread-safe.
class RecordBufferPool {
 public:
  storage::RecordBuffer Take() STRATA_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (kept_.empty()) return storage::RecordBuffer();
    storage::RecordBuffer b = std::move(kept_.back());
    kept_.pop_back();
    return b;
  }
  void Give(storage::RecordBuffer&& buffer) STRATA_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    kept_.push_back(std::move(buffer));
  }

 private:
  Mutex mu_;
  // At most what one window and the read-ahead held at once.
  std::vector<storage::RecordBuffer> kept_ STRATA_GUARDED_BY(mu_);
};

// Rows of the window buffer: their row numbers and, per record, their bytes.
struct Segment {
  std::vector<uint64_t> rows;
  std::vector<const uint8_t*> data;         // per record: rows.size() rows, in `read` or `carried`
  std::vector<storage::RecordBuffer> read;  // a chunk's records as read (their bytes may start past the buffer's)
  std::vector<Bytes> carried;               // or rows carried over from the window before
};

// Reads one epoch's chunks, in the epoch's order, on one thread per reader, at most `ahead`
// chunks beyond the one the consumer waits for; Take(i) hands chunk i over in order.
class ChunkPrefetcher {
 public:
  // Chunk records are read into buffers from `buffers` (those of segments the consumer is done with).
  ChunkPrefetcher(const std::vector<std::unique_ptr<ActivationReader>>& readers, const ActivationIndex& index,
                  const BatchOptions& options, const std::vector<uint64_t>& row_bytes, std::vector<size_t> order,
                  size_t ahead, RecordBufferPool& buffers, storage::ColdRead cold)
      : index_(index),
        options_(options),
        row_bytes_(row_bytes),
        order_(std::move(order)),
        ahead_(ahead),
        buffers_(buffers),
        cold_(cold) {
    for (const auto& reader : readers) threads_.emplace_back([this, r = reader.get()] { Work(r); });
  }

  ~ChunkPrefetcher() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    changed_.NotifyAll();
    for (auto& t : threads_) t.join();
  }

  Result<Segment> Take(size_t i) STRATA_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    taken_ = i;
    changed_.NotifyAll();
    changed_.Wait(lock, [&]() STRATA_REQUIRES(mu_) { return done_.count(i) > 0; });
    Result<Segment> out = std::move(done_.at(i));
    done_.erase(i);
    return out;
  }

 private:
  void Work(ActivationReader* reader) STRATA_EXCLUDES(mu_) {
    for (;;) {
      size_t i;
      {
        MutexLock lock(mu_);
        changed_.Wait(
            lock, [&]() STRATA_REQUIRES(mu_) { return stop_ || next_ >= order_.size() || next_ <= taken_ + ahead_; });
        if (stop_ || next_ >= order_.size()) return;
        i = next_++;
      }
      Result<Segment> segment = Read(reader, index_.chunks[order_[i]]);
      {
        MutexLock lock(mu_);
        done_.emplace(i, std::move(segment));
      }
      changed_.NotifyAll();
    }
  }

  Result<Segment> Read(ActivationReader* reader, const StoredChunk& c) {
    Segment s;
    s.rows.resize(c.row_count);
    for (uint64_t k = 0; k < c.row_count; ++k) s.rows[k] = c.row_begin + k;
    for (size_t r = 0; r < options_.records.size(); ++r) {
      const auto& [layer, site] = options_.records[r];
      // The whole record lands in the buffer: no copy, and from stores a cold one comes in one
      // O_DIRECT request at the disk's sequential bandwidth (ActivationReader::ReadChunk).
      s.read.push_back(buffers_.Take());
      Result<std::span<const uint8_t>> bytes = reader->ReadChunk(index_, c, layer, site, s.read.back(), cold_);
      if (!bytes.ok()) {
        for (storage::RecordBuffer& b : s.read) buffers_.Give(std::move(b));
        return bytes.status();
      }
      if (bytes->size() != c.row_count * row_bytes_[r]) {
        return Internal("the reader gave " + std::to_string(bytes->size()) + " bytes of chunk rows " +
                        std::to_string(c.row_begin) + "+, expected " + std::to_string(c.row_count * row_bytes_[r]));
      }
      s.data.push_back(bytes->data());
    }
    return s;
  }

  const ActivationIndex& index_;
  const BatchOptions& options_;
  const std::vector<uint64_t>& row_bytes_;
  const std::vector<size_t> order_;
  const size_t ahead_;
  RecordBufferPool& buffers_;
  const storage::ColdRead cold_;

  Mutex mu_;
  CondVar changed_;
  size_t next_ STRATA_GUARDED_BY(mu_) = 0;   // the next chunk (position in order_) a thread takes up
  size_t taken_ STRATA_GUARDED_BY(mu_) = 0;  // the chunk the consumer waits for
  std::map<size_t, Result<Segment>> done_ STRATA_GUARDED_BY(mu_);
  bool stop_ STRATA_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class StreamImpl final : public BatchStream {
 public:
  StreamImpl(OpenReader open, ActivationIndex index, BatchOptions options)
      : open_(std::move(open)),
        index_(std::move(index)),
        options_(std::move(options)),
        threads_(ThreadCount(options_.threads)) {
    for (const auto& [layer, site] : options_.records) row_bytes_.push_back(index_.RowBytes(site));
    thread_ = std::thread([this] { Produce(); });
  }

  ~StreamImpl() override {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    space_.NotifyAll();
    thread_.join();
  }

  Result<std::optional<Batch>> Next() override STRATA_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ready_.Wait(lock, [&]() STRATA_REQUIRES(mu_) { return !queue_.empty() || done_; });
    if (!queue_.empty()) {
      Batch b = std::move(queue_.front());
      queue_.pop_front();
      space_.NotifyOne();
      return std::optional<Batch>(std::move(b));
    }
    STRATA_RETURN_IF_ERROR(status_);
    return std::optional<Batch>();
  }

  std::shared_ptr<BufferPool> buffers() const override { return buffers_; }

 private:
  // The window buffer: its segments (rows carried over first, then chunks in the epoch's order)
  // and, per buffer row, where its bytes are for each record.
  struct Window {
    std::vector<Segment> segments;
    std::vector<uint64_t> rows;
    std::vector<std::vector<const uint8_t*>> where;  // [record][buffer row]

    void Add(Segment s, const std::vector<uint64_t>& row_bytes) {
      where.resize(row_bytes.size());
      rows.insert(rows.end(), s.rows.begin(), s.rows.end());
      for (size_t r = 0; r < row_bytes.size(); ++r) {
        for (size_t k = 0; k < s.rows.size(); ++k) where[r].push_back(s.data[r] + k * row_bytes[r]);
      }
      segments.push_back(std::move(s));  // moving buffers keeps their bytes where they are: `where` stays valid
    }

    // Empties the window, handing its buffers back for reuse.
    void Release(RecordBufferPool& read, BufferPool& carried) {
      for (Segment& s : segments) {
        for (storage::RecordBuffer& b : s.read) read.Give(std::move(b));
        for (Bytes& b : s.carried) carried.Give(std::move(b));
      }
      *this = Window{};
    }
  };

  void Produce() STRATA_EXCLUDES(mu_) {
    Status st = Run();
    MutexLock lock(mu_);
    status_ = st;
    done_ = true;
    ready_.NotifyAll();
  }

  // False when the consumer went away.
  bool Push(Batch batch) STRATA_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    space_.Wait(lock,
                [&]() STRATA_REQUIRES(mu_) { return queue_.size() < std::max<size_t>(options_.prefetch, 1) || stop_; });
    if (stop_) return false;
    queue_.push_back(std::move(batch));
    ready_.NotifyOne();
    return true;
  }

  bool Stopped() STRATA_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return stop_;
  }

  // Buffer rows `order[from, to)` of `window`, in that order.
  Batch Gather(const Window& window, const std::vector<uint64_t>& order, size_t from, size_t to, int64_t epoch) const {
    Batch b;
    b.epoch = epoch;
    b.rows.resize(to - from);
    for (size_t i = from; i < to; ++i) b.rows[i - from] = window.rows[order[i]];
    for (size_t r = 0; r < row_bytes_.size(); ++r) {
      const uint64_t n = row_bytes_[r];
      Bytes out = buffers_->Take((to - from) * n);
      const std::vector<const uint8_t*>& src = window.where[r];
      // Rows come from random places of a buffer far larger than the caches: ask for the row
      // kAhead rows on while copying this one, so the copy does not wait on memory row by row.
      constexpr size_t kAhead = 8;
      for (size_t i = from; i < to; ++i) {
        if (i + kAhead < to) {
          const uint8_t* next = src[order[i + kAhead]];
          for (uint64_t line = 0; line < n; line += 64) __builtin_prefetch(next + line);
        }
        std::memcpy(out.data() + (i - from) * n, src[order[i]], n);
      }
      b.data.push_back(std::move(out));
    }
    return b;
  }

  // Whole batches [first, first + count) of a window, gathered by up to threads_ threads, in order.
  std::vector<Batch> GatherSome(const Window& window, const std::vector<uint64_t>& order, size_t first, size_t count,
                                int64_t epoch) {
    const uint64_t batch = options_.batch_rows;
    std::vector<Batch> out(count);
    auto gather = [&](size_t b) {
      out[b] = Gather(window, order, (first + b) * batch, (first + b + 1) * batch, epoch);
    };
    const size_t threads = std::min(threads_, count);
    if (threads <= 1) {
      for (size_t b = 0; b < count; ++b) gather(b);
      return out;
    }
    std::vector<std::thread> workers;
    for (size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (size_t b = t; b < count; b += threads) gather(b);
      });
    }
    for (auto& w : workers) w.join();
    return out;
  }

  Status Run() {
    std::vector<std::unique_ptr<ActivationReader>> readers;
    for (size_t t = 0; t < threads_; ++t) {
      STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ActivationReader> reader, open_());
      readers.push_back(std::move(reader));
    }
    const uint64_t batch = options_.batch_rows;
    uint64_t buffer_rows = options_.buffer_rows;
    if (buffer_rows == 0) {
      uint64_t per_row = 0;
      for (uint64_t n : row_bytes_) per_row += n;
      buffer_rows = (uint64_t{256} << 20) / std::max<uint64_t>(per_row, 1);
    }
    buffer_rows = std::max(buffer_rows, batch);
    const size_t chunks = index_.chunks.size();
    const storage::ColdRead cold = ColdReadOf(options_, index_, row_bytes_);
    // Chunks read ahead of the one the window waits for: a window's worth beyond 2 per thread. The
    // window takes no chunk while its batches are gathered and handed out, so with less the readers
    // stop there and the disk idles (seen with 2 threads: 0.3 s gaps after every window, cold
    // batches at 55-65% of the disk).
    const uint64_t mean_chunk_rows = std::max<uint64_t>(index_.total_rows / std::max<size_t>(chunks, 1), 1);
    const size_t ahead = 2 * threads_ + static_cast<size_t>((buffer_rows + mean_chunk_rows - 1) / mean_chunk_rows);
    for (int64_t epoch = 0; epoch < options_.epochs; ++epoch) {
      SplitMix64 rng(options_.seed, static_cast<uint64_t>(epoch));
      std::vector<size_t> order(chunks);
      for (size_t i = 0; i < chunks; ++i) order[i] = i;
      if (options_.shuffle) rng.Shuffle(order);
      ChunkPrefetcher prefetch(readers, index_, options_, row_bytes_, order, ahead, chunk_buffers_, cold);
      Window window;
      size_t next = 0;
      while (next < chunks) {
        while (next < chunks && (window.rows.empty() || window.rows.size() < buffer_rows)) {
          if (Stopped()) return Status::Ok();
          STRATA_ASSIGN_OR_RETURN(Segment segment, prefetch.Take(next++));
          window.Add(std::move(segment), row_bytes_);
        }
        const bool last = next == chunks;
        std::vector<uint64_t> perm(window.rows.size());
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
        if (options_.shuffle) rng.Shuffle(perm);
        const size_t full = perm.size() / batch * batch;
        // A round of threads_ batches at a time, handed out before the next is gathered: the
        // consumer starts sooner, and only about prefetch + threads batch buffers are alive
        // instead of a window's worth (a fresh buffer costs a zeroed page per 4 KiB: with every
        // batch of a window gathered at once, page clearing was a fifth of a cold epoch's CPU).
        for (size_t first = 0; first < full / batch; first += threads_) {
          for (Batch& b : GatherSome(window, perm, first, std::min(threads_, full / batch - first), epoch)) {
            if (!Push(std::move(b))) return Status::Ok();
          }
        }
        if (full == perm.size()) {
          window.Release(chunk_buffers_, *buffers_);
          continue;
        }
        Batch rest = Gather(window, perm, full, perm.size(), epoch);  // in drawn order
        if (last) {
          if (!options_.drop_last && !Push(std::move(rest))) return Status::Ok();
          continue;
        }
        window.Release(chunk_buffers_, *buffers_);  // what is left is carried over into the next window, first
        Segment carried;
        carried.rows = std::move(rest.rows);
        for (const Bytes& b : rest.data) carried.data.push_back(b.data());
        carried.carried = std::move(rest.data);
        window.Add(std::move(carried), row_bytes_);
      }
    }
    return Status::Ok();
  }

  OpenReader open_;
  const ActivationIndex index_;
  const BatchOptions options_;
  const size_t threads_;
  std::vector<uint64_t> row_bytes_;                                             // per record
  const std::shared_ptr<BufferPool> buffers_ = std::make_shared<BufferPool>();  // of batches
  RecordBufferPool chunk_buffers_;                                              // of chunks read, across epochs

  Mutex mu_;
  CondVar ready_, space_;
  std::deque<Batch> queue_ STRATA_GUARDED_BY(mu_);
  bool stop_ STRATA_GUARDED_BY(mu_) = false;
  bool done_ STRATA_GUARDED_BY(mu_) = false;
  Status status_ STRATA_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<BatchStream>> BatchStream::Start(OpenReader open, ActivationIndex index, BatchOptions options) {
  if (options.batch_rows == 0) return InvalidArgument("batch_rows is 0; give at least 1 row per batch");
  if (options.epochs < 1) return InvalidArgument("epochs is " + std::to_string(options.epochs) + "; give 1 or more");
  if (options.records.empty())
    return InvalidArgument("no (layer, site) asked for; give at least one layer and one site");
  for (const auto& [layer, site] : options.records) {
    STRATA_RETURN_IF_ERROR(index.CheckSite(layer, site));
  }
  if (!index.complete()) {
    std::string missing;
    for (auto [a, b] : index.MissingRows())
      missing += (missing.empty() ? "" : ", ") + std::to_string(a) + ":" + std::to_string(b);
    if (index.offline) {
      return NotFound("rows " + missing + " of run " + index.run + " are in none of the given " + index.source +
                      "; batches cover every row: pass the store of every worker that captured it");
    }
    return Unavailable("run " + index.run + " is " + index.state + " and has not stored rows " + missing +
                       " yet; batches cover every row: wait for it to finish");
  }
  return std::unique_ptr<BatchStream>(
      std::make_unique<StreamImpl>(std::move(open), std::move(index), std::move(options)));
}

}  // namespace strata::activations
