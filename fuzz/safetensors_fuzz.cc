// Hugging Face safetensors files (storage/safetensors.h), read by `model.init_from` imports: the
// file comes from outside Strata. ReadSafetensors takes a path, so each input is written to a
// memfd and read back through /proc/self/fd. It must return Corruption for anything malformed;
// every tensor it accepts must hold exactly numel(shape) x dtype-size bytes (the worker builds
// tensors over those bytes with that shape).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/records.h"
#include "storage/safetensors.h"

namespace {

// One memfd for the whole run; rewritten and truncated for each input.
int InputFile() {
  static const int fd = [] {
    int f = memfd_create("safetensors_fuzz", 0);
    STRATA_CHECK(f >= 0);
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::storage;
  const int fd = InputFile();
  STRATA_CHECK(ftruncate(fd, 0) == 0);
  STRATA_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  auto file = ReadSafetensors("/proc/self/fd/" + std::to_string(fd));
  if (!file.ok()) {
    STRATA_CHECK(file.status().code() == strata::StatusCode::kCorruption);
    return 0;
  }
  for (const auto& [name, tensor] : file->tensors) {
    STRATA_CHECK(DTypeSize(tensor.dtype) != 0);
    for (int64_t d : tensor.shape) STRATA_CHECK(d >= 0);
    STRATA_CHECK(records::ByteSize(tensor.dtype, tensor.shape) == tensor.bytes.size());
    STRATA_CHECK(Checksum(tensor.bytes) == tensor.checksum);
  }
  return 0;
}
