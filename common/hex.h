// Bytes as lowercase hex: run ids are user text, and where one becomes a path (a store's
// checkpoint, activation and log directories) it goes through this, never raw.
#pragma once

#include <string>
#include <string_view>

namespace strata {

inline std::string HexOf(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  return hex;
}

}  // namespace strata
