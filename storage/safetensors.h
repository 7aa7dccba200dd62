// Hugging Face safetensors files (https://github.com/huggingface/safetensors, format v0):
//   [u64 little-endian N][N bytes of JSON header][data]
// The header maps each tensor name to {"dtype": "F32"|"BF16"|..., "shape": [...],
// "data_offsets": [begin, end]} (offsets relative to the data section, tensors contiguous and
// non-overlapping) plus an optional "__metadata__" object of string -> string.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "storage/shard_store.h"

namespace strata::storage {

struct NamedTensorView {
  std::string name;
  TensorView tensor;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
// The bytes before the data section ([u64 length][JSON header, space-padded to 8]) of a file
// holding `entries` in this order, for writers that stream the data after it.
Result<std::string> SafetensorsPrefix(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata = {});

// Writes atomically (temp file + rename). Names must be unique.
Status WriteSafetensors(const std::string& path, const std::vector<NamedTensorView>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // checksum filled in
  std::map<std::string, std::string> metadata;
};

// Reads and validates every header field (dtype known, offsets in range and consistent with
// shape x dtype size); a malformed file is Corruption naming the path and the field.
Result<SafetensorsFile> ReadSafetensors(const std::string& path);

// A safetensors file memory-mapped read-only, every header field checked as by ReadSafetensors
// (a tensor past the end of the file, i.e. a truncated file, is Corruption naming it). Tensors
// are views into the mapping: pages are read from disk only where touched, so a rank that needs
// a slice of a tensor reads that slice, and the page cache, not this process, holds the bytes.
class MappedSafetensors {
 public:
  static Result<std::unique_ptr<MappedSafetensors>> Open(const std::string& path);
  ~MappedSafetensors();
  MappedSafetensors(const MappedSafetensors&) = delete;
  MappedSafetensors& operator=(const MappedSafetensors&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedSafetensors() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace strata::storage
