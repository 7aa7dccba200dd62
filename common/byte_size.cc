#include "common/byte_size.h"

#include <cctype>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace strata {

Result<uint64_t> ParseByteSize(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    return InvalidArgument(what + " = \"" + text + "\" is not a size; write e.g. 2GiB, 512MiB or 1073741824");
  }
  std::string unit;
  for (char c : text.substr(pos)) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  if (unit.size() >= 2 && unit.back() == 'B') unit.pop_back();  // "GB", "GIB" -> "G", "GI"
  if (unit.size() == 2 && unit.back() == 'I') unit.pop_back();  // "GI" -> "G"
  double scale = 0;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K")
    scale = 1024.0;
  else if (unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  if (scale == 0 || !(value >= 0) || !std::isfinite(value * scale) || value * scale > 1.8e19) {
    return InvalidArgument(what + " = \"" + text + "\" is not a size; write e.g. 2GiB, 512MiB or 1073741824");
  }
  return static_cast<uint64_t>(std::llround(value * scale));
}

std::string HumanBytes(uint64_t b) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  if (b >= (1ull << 30))
    s << b / double(1ull << 30) << " GiB";
  else if (b >= (1ull << 20))
    s << b / double(1ull << 20) << " MiB";
  else
    s << b / 1024.0 << " KiB";
  return s.str();
}

}  // namespace strata
