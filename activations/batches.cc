#include "activations/batches.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

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

namespace {

class StreamImpl final : public BatchStream {
 public:
  StreamImpl(OpenReader open, ActivationIndex index, BatchOptions options)
      : open_(std::move(open)), index_(std::move(index)), options_(std::move(options)) {
    for (const auto& [layer, site] : options_.records) row_bytes_.push_back(index_.RowBytes(site));
    thread_ = std::thread([this] { Produce(); });
  }

  ~StreamImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    thread_.join();
  }

  Result<std::optional<Batch>> Next() override {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (!queue_.empty()) {
      Batch b = std::move(queue_.front());
      queue_.pop_front();
      space_.notify_one();
      return std::optional<Batch>(std::move(b));
    }
    STRATA_RETURN_IF_ERROR(status_);
    return std::optional<Batch>();
  }

 private:
  // The buffer of one window: row numbers and, per record, their bytes.
  struct Pool {
    std::vector<uint64_t> rows;
    std::vector<std::vector<uint8_t>> data;
  };

  void Produce() {
    Status st = Run();
    std::lock_guard<std::mutex> lock(mu_);
    status_ = st;
    done_ = true;
    ready_.notify_all();
  }

  // False when the consumer went away.
  bool Push(Batch batch) {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [&] { return queue_.size() < std::max<size_t>(options_.prefetch, 1) || stop_; });
    if (stop_) return false;
    queue_.push_back(std::move(batch));
    ready_.notify_one();
    return true;
  }

  bool Stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  // Rows `order[from, to)` of `pool`, in that order.
  Batch Gather(const Pool& pool, const std::vector<uint64_t>& order, size_t from, size_t to, int64_t epoch) const {
    Batch b;
    b.epoch = epoch;
    b.rows.reserve(to - from);
    for (size_t i = from; i < to; ++i) b.rows.push_back(pool.rows[order[i]]);
    for (size_t r = 0; r < row_bytes_.size(); ++r) {
      const uint64_t n = row_bytes_[r];
      std::vector<uint8_t> out((to - from) * n);
      const uint8_t* src = pool.data[r].data();
      for (size_t i = from; i < to; ++i) std::memcpy(out.data() + (i - from) * n, src + order[i] * n, n);
      b.data.push_back(std::move(out));
    }
    return b;
  }

  Status Run() {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ActivationReader> reader, open_());
    const uint64_t batch = options_.batch_rows;
    uint64_t buffer_rows = options_.buffer_rows;
    if (buffer_rows == 0) {
      uint64_t per_row = 0;
      for (uint64_t n : row_bytes_) per_row += n;
      buffer_rows = (uint64_t{256} << 20) / std::max<uint64_t>(per_row, 1);
    }
    buffer_rows = std::max(buffer_rows, batch);
    const size_t chunks = index_.chunks.size();
    for (int64_t epoch = 0; epoch < options_.epochs; ++epoch) {
      SplitMix64 rng(options_.seed, static_cast<uint64_t>(epoch));
      std::vector<size_t> order(chunks);
      for (size_t i = 0; i < chunks; ++i) order[i] = i;
      if (options_.shuffle) rng.Shuffle(order);
      Pool pool;
      pool.data.resize(row_bytes_.size());
      size_t next = 0;
      while (next < chunks) {
        while (next < chunks && (pool.rows.empty() || pool.rows.size() < buffer_rows)) {
          if (Stopped()) return Status::Ok();
          const StoredChunk& c = index_.chunks[order[next++]];
          for (uint64_t row = c.row_begin; row < c.row_begin + c.row_count; ++row) pool.rows.push_back(row);
          for (size_t r = 0; r < options_.records.size(); ++r) {
            const auto& [layer, site] = options_.records[r];
            std::vector<uint8_t>& out = pool.data[r];
            STRATA_RETURN_IF_ERROR(reader->ReadRows(index_, layer, site, c.row_begin, c.row_begin + c.row_count,
                                                    [&](std::span<const uint8_t> bytes) {
                                                      out.insert(out.end(), bytes.begin(), bytes.end());
                                                      return Status::Ok();
                                                    }));
          }
        }
        const bool last = next == chunks;
        std::vector<uint64_t> perm(pool.rows.size());
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
        if (options_.shuffle) rng.Shuffle(perm);
        const size_t full = perm.size() / batch * batch;
        for (size_t from = 0; from < full; from += batch) {
          if (!Push(Gather(pool, perm, from, from + batch, epoch))) return Status::Ok();
        }
        if (full == perm.size()) {
          pool = Pool{};
          pool.data.resize(row_bytes_.size());
          continue;
        }
        if (last) {
          if (!options_.drop_last && !Push(Gather(pool, perm, full, perm.size(), epoch))) return Status::Ok();
          continue;
        }
        Batch rest = Gather(pool, perm, full, perm.size(), epoch);  // carried over, in drawn order
        pool.rows = std::move(rest.rows);
        pool.data = std::move(rest.data);
      }
    }
    return Status::Ok();
  }

  OpenReader open_;
  const ActivationIndex index_;
  const BatchOptions options_;
  std::vector<uint64_t> row_bytes_;  // per record

  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<Batch> queue_;
  bool stop_ = false, done_ = false;
  Status status_;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<BatchStream>> BatchStream::Start(OpenReader open, ActivationIndex index, BatchOptions options) {
  if (options.batch_rows == 0) return InvalidArgument("batch_rows is 0; give at least 1 row per batch");
  if (options.epochs < 1) return InvalidArgument("epochs is " + std::to_string(options.epochs) + "; give 1 or more");
  if (options.records.empty()) return InvalidArgument("no (layer, site) asked for; give at least one layer and one site");
  for (const auto& [layer, site] : options.records) {
    STRATA_RETURN_IF_ERROR(index.CheckSite(layer, site));
  }
  if (!index.complete()) {
    std::string missing;
    for (auto [a, b] : index.MissingRows()) missing += (missing.empty() ? "" : ", ") + std::to_string(a) + ":" + std::to_string(b);
    if (index.offline) {
      return NotFound("rows " + missing + " of run " + index.run + " are in none of the given " + index.source +
                      "; batches cover every row: pass the store of every worker that captured it");
    }
    return Unavailable("run " + index.run + " is " + index.state + " and has not stored rows " + missing +
                       " yet; batches cover every row: wait for it to finish");
  }
  return std::unique_ptr<BatchStream>(std::make_unique<StreamImpl>(std::move(open), std::move(index), std::move(options)));
}

}  // namespace strata::activations
