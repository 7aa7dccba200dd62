// TensorBoard's event files, for a run's scalar metrics (loss, lr, grad norm, tokens/s, memory),
// written and read without TensorFlow or protobuf: the format is small and fixed.
//
//   file     events.out.tfevents.<unix seconds>.<host>: a sequence of TFRecords, each
//              uint64 length (little-endian) | uint32 masked_crc32c(length bytes)
//              | data[length] | uint32 masked_crc32c(data)
//            masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (crc32c: Castagnoli).
//   data     a serialized tensorflow.Event: wall_time (field 1, double), step (2, varint), and
//            either file_version (3, string; "brain.Event:2" in the first record) or summary (5):
//            Summary { repeated Value value = 1 }, Value { string tag = 1; float simple_value = 2 }.
// This is what TensorFlow's and PyTorch's SummaryWriter write for add_scalar, and what
// TensorBoard's loader reads (a directory of such files; the name must contain "tfevents").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace strata::tensorboard {

struct Scalar {
  std::string tag;  // e.g. "train/loss"
  float value = 0;
};

struct ScalarEvent {
  int64_t step = 0;
  double wall_time = 0;  // seconds since the Unix epoch
  std::string tag;
  float value = 0;
};

// Appends to the event file in `dir` (created 0700 if missing; the file 0600). A directory that
// has an event file already is appended to (a restarted coordinator goes on in the same file);
// else a new file is named from `unix_seconds` and this host and begins with the version record.
class EventFileWriter {
 public:
  enum class Existing { kAppend, kRefuse };
  // kRefuse: AlreadyExists-like InvalidArgument naming the file when `dir` holds an event file
  // (an export must not repeat steps in a directory TensorBoard merges).
  static Result<EventFileWriter> Open(const std::string& dir, int64_t unix_seconds,
                                      Existing existing = Existing::kAppend);
  const std::string& path() const { return path_; }
  // One record holding every scalar of a step. IoError naming the file (a full disk) or
  // InvalidArgument for an empty tag; the file keeps every complete record before it.
  Status Append(int64_t step, double wall_time, const std::vector<Scalar>& scalars) const;

 private:
  std::string path_;
};

// A training step's metrics as TensorBoard scalars, under the tags train/loss, train/lr,
// train/grad_norm, train/tokens_per_second and train/memory_bytes; a value that is not finite (no
// gradient norm reported, a loss that diverged) is left out.
std::vector<Scalar> StepScalars(double loss, double lr, double grad_norm, double tokens_per_second,
                                double memory_bytes);

// Every scalar of an event file, in file order. Corruption naming the file and the byte offset
// of a record whose length or data fails its checksum, or that is cut short.
Result<std::vector<ScalarEvent>> ReadEventFile(const std::string& path);

// CRC-32C (Castagnoli) and TFRecord's masked form of it.
uint32_t Crc32c(const void* data, size_t size);
uint32_t MaskedCrc32c(const void* data, size_t size);

}  // namespace strata::tensorboard
