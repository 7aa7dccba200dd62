// What a daemon creates (stores, checkpoints, the metadata store, sockets) is private to its user
// unless the operator says otherwise: `strata up` makes its state directory 0700, but daemons
// started by hand inherited the shell's umask (usually 022) and left stores 0755 and checkpoint
// files 0644 for every user of the machine to read.
#pragma once

#include <string>

#include "common/status.h"

namespace strata {

// The default of the daemons' --umask: directories 0700, files 0600.
inline constexpr char kDefaultDaemonUmask[] = "0077";

// Sets the process umask from an octal string ("0077", "027"); an invalid one is an error that
// says what is expected. Call first thing in main, before any file or socket is made.
Status ApplyUmask(const std::string& octal);

}  // namespace strata
