// .npy headers of token and document-offset files (data.format = "npy", data.documents): files a
// user hands Strata, read by the CLI, the coordinator and every worker (common/token_file.h).
// ParseNpyHeader must refuse anything malformed with a Status and never crash; what it accepts
// must describe data that starts inside the bytes it was given.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = strata::ParseNpyHeader(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  if (!header.ok()) {
    STRATA_CHECK(!header.status().message().empty());
    return 0;
  }
  STRATA_CHECK(header->data_offset <= size);
  STRATA_CHECK(header->major >= 1 && header->major <= 3);
  uint64_t elements = 1;
  for (uint64_t d : header->shape) elements *= d;  // wraps freely: only read
  (void)elements;
  return 0;
}
