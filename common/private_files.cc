#include "common/private_files.h"

#include <sys/stat.h>

namespace strata {

Status ApplyUmask(const std::string& octal) {
  size_t used = 0;
  unsigned long mask = 01000;
  try {
    mask = std::stoul(octal, &used, 8);
  } catch (const std::exception&) {
  }
  if (octal.empty() || used != octal.size() || mask > 0777) {
    return InvalidArgument("--umask " + octal +
                           ": expected an octal mask such as 0077 (private, the default) or 0027 "
                           "(readable by the group)");
  }
  ::umask(static_cast<mode_t>(mask));
  return Status::Ok();
}

}  // namespace strata
