// Training data: a token file mapped read-only (never copied whole), its ids checked against the
// model's vocabulary, and the deterministic choice of which windows form each step's global batch
// (so 1 worker and N workers see the same rows). Formats and rules: docs/run-spec.md, [data].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::worker {

class TokenData {
 public:
  // How the caller will read the file (an madvise hint): training draws random windows, so
  // read-ahead past a window is wasted; extraction walks the file front to back.
  enum class Access { kRandomWindows, kSequential };

  // Files up to this size are range-checked whole at Load, so a bad id fails the run before its
  // first step: the scan runs at memory bandwidth (docs/benchmarks.md, "Token data": 7.6 GB/s),
  // so 8 GiB take ~1 s from the page cache and a few seconds from a local disk. A larger file (a
  // multi-TB corpus) would keep every worker reading for minutes before training, so its ids are
  // checked window by window as Read copies them, and the step that meets a bad id fails the run
  // naming its offset.
  static constexpr uint64_t kScanAtLoadBytes = uint64_t{8} << 30;

  // Maps spec.path (data.format "bytes", "u16", "u32" or "npy") and, with
  // spec.sample_within_documents, the document offsets of spec.documents, which then index the
  // windows of `sequence` + 1 tokens that BatchOffsets draws from (sequence > 0 is required
  // there, and is the sequence BatchOffsets must be called with). Every id must be in
  // [0, vocab): InvalidArgument names the file, the id's byte offset, the id and the vocab.
  static Result<TokenData> Load(const DataSpec& spec, int64_t vocab, int64_t sequence = 0,
                                Access access = Access::kRandomWindows);

  TokenData(TokenData&&) noexcept;
  TokenData& operator=(TokenData&&) noexcept;
  ~TokenData();

  // Tokens in the file.
  size_t size() const;
  // Whether Load range-checked every id (files up to kScanAtLoadBytes).
  bool scanned_at_load() const;

  // Copies tokens [offset, offset + n) into out[0, n), widening each id; the only way to the ids.
  // REQUIRES: 0 <= offset, 0 <= n, offset + n <= size(). An id outside [0, vocab) is
  // InvalidArgument naming the file and its byte offset (a file scanned at Load has none).
  Status Read(int64_t offset, int64_t n, int64_t* out) const;
  Status Read(int64_t offset, int64_t n, int32_t* out) const;

  // Start offsets of the global batch of `step` (0-based): row i of every step is a window of
  // sequence + 1 tokens, drawn from a generator seeded by (seed, step) alone. Within documents
  // (DataSpec::sample_within_documents) each draw picks among the windows that lie inside one
  // document instead (docs/run-spec.md, "Batches").
  std::vector<int64_t> BatchOffsets(int64_t seed, int64_t step, int64_t global_batch, int64_t sequence) const;

 private:
  struct Impl;
  TokenData();
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::worker
