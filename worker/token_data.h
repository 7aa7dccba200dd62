// Training data: a token file read whole into memory, and the deterministic choice of which
// windows form each step's global batch (so 1 worker and N workers see the same rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/run_spec.h"
#include "common/status.h"

namespace strata::worker {

class TokenData {
 public:
  // format "bytes": each byte is a token; "u16": little-endian uint16 ids (< vocab).
  static Result<TokenData> Load(const DataSpec& spec, int64_t vocab);

  size_t size() const { return tokens_.size(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  // Start offsets of the global batch of `step` (0-based): row i of every step is a window of
  // sequence + 1 tokens, drawn from a generator seeded by (seed, step) alone.
  std::vector<int64_t> BatchOffsets(int64_t seed, int64_t step, int64_t global_batch, int64_t sequence) const;

 private:
  std::vector<int32_t> tokens_;
};

}  // namespace strata::worker
