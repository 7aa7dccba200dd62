// The network interface a worker's collectives across hosts use (strata-worker --net-interface).
// NCCL picks its bootstrap and socket transport interface from NCCL_SOCKET_IFNAME when it creates
// a communicator; left alone it takes the first interface that is up (often a docker bridge or a
// management network on cluster nodes, which other hosts cannot reach, and the run hangs at
// ncclCommInitRank). The CPU ZeroMQ data plane needs none of this: it binds and connects to the
// addresses the workers advertise.
#pragma once

#include <string>

#include "common/status.h"

namespace strata::worker {

// Checks that `interface` exists on this host and sets NCCL_SOCKET_IFNAME to it (replacing a
// value from the environment), so every NCCL communicator this process creates later uses it.
// Empty: changes nothing. Call before any communicator is created (from main, before threads
// start: setenv is not thread-safe).
Status UseNetInterface(const std::string& interface);

}  // namespace strata::worker
