// Small state files (cluster.json, tokens, keys) written so that a reader never sees half of one:
// a temporary file beside it, written whole, fsync'ed, renamed over the old one, directory synced.
// A full disk or any other write error leaves the old file as it was and is an error naming the
// path (ResourceExhausted for ENOSPC / EDQUOT).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

Status WriteFileAtomically(const std::string& path, std::string_view contents, mode_t mode = 0600);

}  // namespace strata
