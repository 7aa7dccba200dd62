// The NCCL communicator (GPU workers; compiled only against a CUDA LibTorch, STRATA_WITH_CUDA).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "worker/comm/communicator.h"

namespace strata::worker {

// Joins the NCCL world of `bootstrap`'s ranks on CUDA device `device`; the unique id travels over
// `bootstrap` (the task's ZeroMQ world). Every rank calls it together. An operation of it or of
// its groups not finished `timeout_ms` after it was issued aborts them all (the hang watchdog),
// after calling `on_timeout` with what timed out (from the watchdog's thread).
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device, int timeout_ms,
                                                             std::function<void(const std::string&)> on_timeout);

}  // namespace strata::worker
