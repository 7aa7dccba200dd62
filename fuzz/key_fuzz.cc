// Order-preserving key pieces (storage/shard_store.h): the store and the coordinator split keys
// and index values they read back (checkpoint names, activation record refs, chunk lists) with
// ConsumeKeyString / ConsumeKeyU64. Each input byte of a leading op string says which piece to
// take next; every piece taken must re-encode to exactly the bytes it consumed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "storage/shard_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::storage;
  if (size == 0) return 0;
  const size_t ops = data[0] % 16;  // then `ops` op bytes, then the key
  if (size < 1 + ops) return 0;
  std::string_view in(reinterpret_cast<const char*>(data + 1 + ops), size - 1 - ops);
  for (size_t i = 0; i < ops; ++i) {
    const std::string_view before = in;
    if (data[1 + i] % 2 == 0) {
      std::string s;
      if (!ConsumeKeyString(&in, &s)) {
        STRATA_CHECK(in == before);
        return 0;
      }
      STRATA_CHECK(before.substr(0, before.size() - in.size()) == EncodeKeyString(s));
    } else {
      uint64_t v = 0;
      if (!ConsumeKeyU64(&in, &v)) {
        STRATA_CHECK(in == before);
        return 0;
      }
      STRATA_CHECK(before.substr(0, 8) == EncodeKeyU64(v));
      STRATA_CHECK(in.size() + 8 == before.size());
    }
  }
  return 0;
}
