// Reads every field of a decoded Cap'n Proto struct through the dynamic API, the way handlers
// read them one getter at a time: text (to its NUL), data, enums, nested structs and lists, and
// the active member of each union. The decoders promise that what they accept can be read without
// an exception (schema/envelope.h); a read that throws here is a decoder letting bad bytes through,
// and libFuzzer reports the escaping exception as a crash.
#pragma once

#include <capnp/dynamic.h>

#include <cstdint>

namespace strata::fuzz {

// Returns a value derived from everything read, so the reads cannot be optimised away.
uint64_t ReadEverything(capnp::DynamicStruct::Reader root);

template <typename Reader>
uint64_t ReadEverything(Reader root) {
  return ReadEverything(capnp::DynamicStruct::Reader(capnp::toDynamic(root)));
}

}  // namespace strata::fuzz
