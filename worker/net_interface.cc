#include "worker/net_interface.h"

#include <net/if.h>

#include <cstdlib>

namespace strata::worker {

Status UseNetInterface(const std::string& interface) {
  if (interface.empty()) return Status::Ok();
  // NCCL also takes a prefix list ("eth,ib") or ^exclusions; one exact name is what the flag offers,
  // so that a typo is caught here rather than as a hang in ncclCommInitRank on another host.
  if (if_nametoindex(interface.c_str()) == 0) {
    return InvalidArgument("--net-interface " + interface +
                           ": this host has no such network interface; name the one "
                           "on the network the other hosts reach (list them with `ip -br addr`)");
  }
  if (setenv("NCCL_SOCKET_IFNAME", interface.c_str(), 1) != 0) {
    return Internal("--net-interface " + interface + ": cannot set NCCL_SOCKET_IFNAME");
  }
  return Status::Ok();
}

}  // namespace strata::worker
