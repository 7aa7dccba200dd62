// Helpers that nf4.cc (quantization) and nf4_state_dict.cc (bnb's state-dict layout) share; private
// to quant/, not part of nf4.h's API. Defined in nf4.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::quant::internal {

// One of the blocksizes bitsandbytes' quantize_4bit accepts: 32, 64, ..., 4096.
bool ValidBlocksize(int64_t b);

// The product of `shape` (1 for a 0-d shape); InvalidArgument for a negative dimension or overflow.
Result<int64_t> CheckedNumel(const std::vector<int64_t>& shape);

int64_t CeilDiv(int64_t a, int64_t b);

// "[4096, 4096]", as Python prints a list of ints (and json.dumps writes one).
std::string ShapeString(const std::vector<int64_t>& s);

}  // namespace strata::quant::internal
