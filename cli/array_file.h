// One array [rows, row shape...] streamed to a file the user's tools load: .npy (numpy.load) or .safetensors
// (safetensors / transformers), chosen by the path's extension; "-" streams .npy to stdout.
// Atomic: bytes go to a temp file beside PATH (PATH.tmp.XXXXXX), moved to PATH by Commit(); a
// writer dropped without Commit removes its temp file, so a failed query leaves nothing behind.
// An existing PATH is never replaced unless `replace` (--force): Create refuses it up front and
// Commit moves the file with link(), which fails rather than replace one that appeared meanwhile.
// numpy has no bfloat16, so bf16 data is widened to float32 in .npy (exactly); safetensors keeps
// BF16.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::cli {

class ArrayFileWriter {
 public:
  // InvalidArgument for an extension other than .npy / .safetensors, or for an existing PATH
  // without `replace`; IoError if the temp file cannot be created (the message names the path).
  static Result<std::unique_ptr<ArrayFileWriter>> Create(const std::string& path, storage::DType dtype, uint64_t rows,
                                                         const std::vector<int64_t>& row_shape,
                                                         const std::string& tensor_name,
                                                         const std::map<std::string, std::string>& metadata,
                                                         bool replace);
  virtual ~ArrayFileWriter() = default;
  virtual Status Append(std::span<const uint8_t> bytes) = 0;  // row-major data of `dtype`
  virtual Status Commit() = 0;                                // every byte appended: move into place
  virtual std::string description() const = 0;                // "float32 [rows, 768] .npy"
};

}  // namespace strata::cli
