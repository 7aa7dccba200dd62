// The NCCL communicator (GPU workers; compiled only against a CUDA LibTorch, STRATA_WITH_CUDA).
#pragma once

#include <memory>

#include "worker/communicator.h"

namespace strata::worker {

// Joins the NCCL world of `bootstrap`'s ranks on CUDA device `device`; the unique id travels over
// `bootstrap` (the task's ZeroMQ world). Every rank calls it together.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device);

}  // namespace strata::worker
