// Token ids live in the page cache, not in each worker's heap: the file is mapped read-only and
// shared (MAP_SHARED), so the workers of a node hold one copy however large the corpus, and a
// worker touches only the pages of the windows it reads. Ids are widened to the caller's integer
// type one window at a time (Read).
//
// Range check. An id >= vocab would index past the embedding (on CUDA, a device-side assert that
// kills the process, not an error). Files up to kScanAtLoadBytes are scanned whole at Load: per
// block of kScanBlock ids a max (and for signed types a min) reduction that the compiler
// vectorizes, so the scan runs at memory bandwidth; only a block whose max is out of range is
// searched id by id for the first culprit. Larger files are checked per window in Read.
#include "worker/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>

#include "common/check.h"
#include "common/token_file.h"

namespace strata::worker {
namespace {

// Ids per block of the load-time scan: large enough that the per-block test is noise, small
// enough (256 KiB of u32) to stay in L2 while it is searched for the culprit.
constexpr size_t kScanBlock = size_t{1} << 16;
// The reductions run over fixed runs of this many ids, a trip count GCC's -O2 ("very cheap")
// vectorizer accepts; the tail of a block goes through the scalar loop.
constexpr size_t kLanes = 64;
// Documents per entry of the sampling index (below): the index costs 8 bytes per this many
// documents, and a draw scans at most this many offsets.
constexpr uint64_t kDocumentStride = 256;

template <typename T>
T LoadId(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the data of a .npy may sit at any alignment; compiles to a plain load
  return v;
}

// The ids of [p, p + n * sizeof(T)) all lie in [0, vocab)?
template <typename T>
bool AllBelow(const unsigned char* p, size_t n, uint64_t vocab) {
  T hi = 0, lo = 0;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    T run_hi = LoadId<T>(p + i * sizeof(T)), run_lo = run_hi;
    for (size_t j = 0; j < kLanes; ++j) {
      const T v = LoadId<T>(p + (i + j) * sizeof(T));
      run_hi = v > run_hi ? v : run_hi;
      if constexpr (std::is_signed_v<T>) run_lo = v < run_lo ? v : run_lo;
    }
    hi = run_hi > hi ? run_hi : hi;
    if constexpr (std::is_signed_v<T>) lo = run_lo < lo ? run_lo : lo;
  }
  for (; i < n; ++i) {
    const T v = LoadId<T>(p + i * sizeof(T));
    hi = std::max(hi, v);
    lo = std::min(lo, v);
  }
  if constexpr (std::is_signed_v<T>) {
    if (lo < 0) return false;
  }
  return static_cast<uint64_t>(hi) < vocab;
}

// Index of the first id of [p, p + n * sizeof(T)) outside [0, vocab), or n.
template <typename T>
size_t FirstOutOfRange(const unsigned char* p, size_t n, uint64_t vocab) {
  for (size_t i = 0; i < n; ++i) {
    const T v = LoadId<T>(p + i * sizeof(T));
    if constexpr (std::is_signed_v<T>) {
      if (v < 0) return i;
    }
    if (static_cast<uint64_t>(v) >= vocab) return i;
  }
  return n;
}

template <typename T>
size_t ScanTyped(const unsigned char* p, size_t n, uint64_t vocab) {
  for (size_t begin = 0; begin < n; begin += kScanBlock) {
    const size_t count = std::min(kScanBlock, n - begin);
    const unsigned char* block = p + begin * sizeof(T);
    if (!AllBelow<T>(block, count, vocab)) return begin + FirstOutOfRange<T>(block, count, vocab);
  }
  return n;
}

// Calls fn(T{}) with T the C++ type of `type`.
template <typename Fn>
decltype(auto) WithType(const IntType& type, Fn&& fn) {
  switch (type.size) {
    case 1:
      return type.is_signed ? fn(int8_t{}) : fn(uint8_t{});
    case 2:
      return type.is_signed ? fn(int16_t{}) : fn(uint16_t{});
    case 4:
      return type.is_signed ? fn(int32_t{}) : fn(uint32_t{});
    default:
      return type.is_signed ? fn(int64_t{}) : fn(uint64_t{});
  }
}

// First id of `n` at `p` outside [0, vocab), or n.
size_t FindOutOfRange(const IntType& type, const unsigned char* p, size_t n, uint64_t vocab) {
  return WithType(type, [&](auto t) { return ScanTyped<decltype(t)>(p, n, vocab); });
}

int64_t IdAt(const IntType& type, const unsigned char* p) {
  return WithType(type, [&](auto t) { return static_cast<int64_t>(LoadId<decltype(t)>(p)); });
}

// A read-only, shared mapping of a whole file; unmapped with the object.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_) ::munmap(base_, length_);
  }

  // Maps `path` (`what` names it in messages); `expected_bytes` is the size its layout was read
  // with, so a file that changed in between is refused rather than read past its end.
  Status Map(const std::string& path, const std::string& what, uint64_t expected_bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError(what + " cannot be opened on this worker: " + std::strerror(errno));
    const off_t end = ::lseek(fd, 0, SEEK_END);
    if (end < 0 || static_cast<uint64_t>(end) != expected_bytes) {
      ::close(fd);
      return IoError(what + " changed size while it was being opened (" + std::to_string(expected_bytes) +
                     " bytes, now " + std::to_string(end) + "); do not rewrite a corpus while a run reads it");
    }
    if (expected_bytes > 0) {
      void* base = ::mmap(nullptr, expected_bytes, PROT_READ, MAP_SHARED, fd, 0);
      const int err = errno;
      ::close(fd);
      if (base == MAP_FAILED) return IoError(what + " cannot be mapped: " + std::strerror(err));
      base_ = base;
      length_ = expected_bytes;
    } else {
      ::close(fd);
    }
    return Status::Ok();
  }

  void Advise(int advice) const {
    if (base_) (void)::madvise(base_, length_, advice);  // a hint: failure changes only speed
  }
  const unsigned char* bytes() const { return static_cast<const unsigned char*>(base_); }

 private:
  void* base_ = nullptr;
  size_t length_ = 0;
};

}  // namespace

struct TokenData::Impl {
  std::string path;
  Mapping map;
  const unsigned char* ids = nullptr;  // the first id
  TokenFileLayout layout;
  uint64_t vocab = 0;
  bool scanned = false;      // every id was checked at Load
  bool check_reads = false;  // Read checks each window (not scanned, and the type can exceed vocab)

  // Within-document sampling (docs/run-spec.md, "Batches"): document d spans
  // [start(d), start(d + 1)) (the last one ends at the last token) and has
  // max(0, length - sequence) windows of sequence + 1 tokens. Draw r in [0, windows) picks the
  // r-th of them in file order. windows_before[k]: windows in documents [0, k * kDocumentStride).
  bool within_documents = false;
  int64_t sequence = 0;
  Mapping documents_map;
  DocumentsLayout documents;
  const unsigned char* starts = nullptr;
  std::vector<uint64_t> windows_before;
  uint64_t windows = 0;

  uint64_t Start(uint64_t d) const {
    return d < documents.count ? static_cast<uint64_t>(IdAt(documents.type, starts + d * 8)) : layout.tokens;
  }
  uint64_t Windows(uint64_t d) const {
    const uint64_t length = Start(d + 1) - Start(d);
    return length > static_cast<uint64_t>(sequence) ? length - static_cast<uint64_t>(sequence) : 0;
  }
  uint64_t Offset(uint64_t r) const {
    const size_t k = static_cast<size_t>(std::upper_bound(windows_before.begin(), windows_before.end(), r) -
                                         windows_before.begin()) -
                     1;
    r -= windows_before[k];
    for (uint64_t d = k * kDocumentStride;; ++d) {
      const uint64_t w = Windows(d);
      if (r < w) return Start(d) + r;
      r -= w;
    }
  }

  Status OutOfRange(uint64_t index) const {
    const uint64_t byte = layout.data_offset + index * layout.type.size;
    const int64_t id = IdAt(layout.type, ids + index * layout.type.size);
    const bool negative = layout.type.is_signed && id < 0;
    const std::string text =
        negative ? std::to_string(id) : std::to_string(static_cast<uint64_t>(id));  // u8 ids past 2^63 too
    return InvalidArgument(
        "data.path = \"" + path + "\" holds token id " + text + " at byte offset " + std::to_string(byte) + " (token " +
        std::to_string(index) + "), " +
        (negative ? std::string("a negative id") : "not below model.vocab = " + std::to_string(vocab)) +
        "; token ids must lie in [0, model.vocab): raise model.vocab to the tokenizer's, or re-tokenize");
  }

  Status LoadDocuments(const std::string& documents_path);

  template <typename Out>
  Status ReadAs(int64_t offset, int64_t n, Out* out) const {
    STRATA_CHECK(offset >= 0 && n >= 0 && static_cast<uint64_t>(offset) + static_cast<uint64_t>(n) <= layout.tokens);
    if (n == 0) return Status::Ok();
    const unsigned char* p = ids + static_cast<uint64_t>(offset) * layout.type.size;
    if (check_reads) {
      const size_t bad = FindOutOfRange(layout.type, p, static_cast<size_t>(n), vocab);
      if (bad < static_cast<size_t>(n)) return OutOfRange(static_cast<uint64_t>(offset) + bad);
    }
    WithType(layout.type, [&](auto t) {
      using T = decltype(t);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(LoadId<T>(p + i * sizeof(T)));
    });
    return Status::Ok();
  }
};

Status TokenData::Impl::LoadDocuments(const std::string& documents_path) {
  const std::string what = "data.documents = \"" + documents_path + "\"";
  STRATA_ASSIGN_OR_RETURN(documents, ReadDocumentsLayout(documents_path));
  STRATA_RETURN_IF_ERROR(documents_map.Map(documents_path, what, documents.data_offset + documents.count * 8));
  documents_map.Advise(MADV_SEQUENTIAL);
  starts = documents_map.bytes() + documents.data_offset;
  // Every offset once: 0 first, never decreasing (equal neighbours are empty documents), none past
  // the last token; and the sparse index of windows on the way.
  uint64_t longest = 0;
  for (uint64_t d = 0; d < documents.count; ++d) {
    const int64_t raw = IdAt(documents.type, starts + d * 8);
    const uint64_t start = static_cast<uint64_t>(raw);
    auto refuse = [&](const std::string& why) {
      return InvalidArgument(what + ": offset " + std::to_string(d) + " (byte " +
                             std::to_string(documents.data_offset + d * 8) + ") is " +
                             (documents.type.is_signed ? std::to_string(raw) : std::to_string(start)) + ", " + why +
                             "; the file lists each document's first token, ascending from 0");
    };
    if (d == 0 && start != 0) return refuse("not 0");
    if (documents.type.is_signed && raw < 0) return refuse("negative");
    if (start > layout.tokens) return refuse("past the " + std::to_string(layout.tokens) + " tokens of data.path");
    if (d > 0 && start < Start(d - 1))
      return refuse("below offset " + std::to_string(d - 1) + " = " + std::to_string(Start(d - 1)));
    if (d % kDocumentStride == 0) windows_before.push_back(windows);
    // Offsets up to d are checked, and Windows(d) reads d + 1: check it first.
    const uint64_t next =
        d + 1 < documents.count ? static_cast<uint64_t>(IdAt(documents.type, starts + (d + 1) * 8)) : layout.tokens;
    if (next < start || next > layout.tokens) continue;  // refused at the next offset
    longest = std::max(longest, next - start);
    windows += Windows(d);
  }
  documents_map.Advise(MADV_RANDOM);
  if (windows == 0) {
    return InvalidArgument(
        what + ": no document holds model.sequence + 1 = " + std::to_string(sequence + 1) +
        " tokens (the longest holds " + std::to_string(longest) +
        "), so no window lies inside one; use a shorter sequence or set data.sample_within_documents = false");
  }
  return Status::Ok();
}

TokenData::TokenData() : impl_(std::make_unique<Impl>()) {}
TokenData::TokenData(TokenData&&) noexcept = default;
TokenData& TokenData::operator=(TokenData&&) noexcept = default;
TokenData::~TokenData() = default;

Result<TokenData> TokenData::Load(const DataSpec& spec, int64_t vocab, int64_t sequence, Access access) {
  STRATA_ASSIGN_OR_RETURN(TokenFileLayout layout, ReadTokenFileLayout(spec.path, spec.format));
  TokenData data;
  Impl& d = *data.impl_;
  d.path = spec.path;
  d.layout = layout;
  d.vocab = static_cast<uint64_t>(std::max<int64_t>(vocab, 0));
  STRATA_RETURN_IF_ERROR(d.map.Map(spec.path, "data.path = \"" + spec.path + "\"", layout.file_bytes));
  d.ids = d.map.bytes() ? d.map.bytes() + layout.data_offset : nullptr;
  // Unsigned ids of a type whose largest value is below vocab need no check (bytes, u16 with a
  // vocab over 65535).
  const bool bounded =
      !layout.type.is_signed && layout.type.size < 8 && (uint64_t{1} << (8 * layout.type.size)) <= d.vocab;
  if (bounded || layout.tokens == 0) {
    d.scanned = true;
  } else if (layout.tokens * layout.type.size <= kScanAtLoadBytes) {
    d.map.Advise(MADV_SEQUENTIAL);
    const size_t bad = FindOutOfRange(layout.type, d.ids, static_cast<size_t>(layout.tokens), d.vocab);
    if (bad < layout.tokens) return d.OutOfRange(bad);
    d.scanned = true;
  } else {
    d.check_reads = true;
  }
  d.map.Advise(access == Access::kSequential ? MADV_SEQUENTIAL : MADV_RANDOM);
  if (spec.sample_within_documents) {
    if (sequence <= 0) return Internal("TokenData::Load: within-document sampling needs the model's sequence");
    d.within_documents = true;
    d.sequence = sequence;
    STRATA_RETURN_IF_ERROR(d.LoadDocuments(spec.documents));
  }
  return data;
}

size_t TokenData::size() const { return static_cast<size_t>(impl_->layout.tokens); }
bool TokenData::scanned_at_load() const { return impl_->scanned; }
Status TokenData::Read(int64_t offset, int64_t n, int64_t* out) const { return impl_->ReadAs(offset, n, out); }
Status TokenData::Read(int64_t offset, int64_t n, int32_t* out) const { return impl_->ReadAs(offset, n, out); }

std::vector<int64_t> TokenData::BatchOffsets(int64_t seed, int64_t step, int64_t global_batch, int64_t sequence) const {
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step));
  std::vector<int64_t> offsets(global_batch);
  if (impl_->within_documents) {
    STRATA_CHECK_EQ(sequence, impl_->sequence);
    for (auto& o : offsets) o = static_cast<int64_t>(impl_->Offset(rng() % impl_->windows));
    return offsets;
  }
  const uint64_t span = size() - static_cast<size_t>(sequence);  // starts whose window of sequence + 1 fits
  for (auto& o : offsets) o = static_cast<int64_t>(rng() % span);
  return offsets;
}

}  // namespace strata::worker
