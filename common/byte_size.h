// Byte counts as people write and read them: "2GiB", "512 MiB", "1.5G", "4096".
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

// Accepts a number with an optional unit: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024; "KB",
// "MB", ... are taken as the same binary units). InvalidArgument names `what` on bad input.
Result<uint64_t> ParseByteSize(const std::string& text, const std::string& what);

// "12.0 KiB", "3.4 MiB", "1.2 GiB".
std::string HumanBytes(uint64_t bytes);

}  // namespace strata
