// The LibTorch task executor. This header is torch-free so main.cc stays cheap to compile.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "worker/task.h"

namespace strata::worker {

struct TorchExecutorOptions {
  std::string device = "cpu";       // "cpu" or "cuda:N" (needs a CUDA build)
  uint64_t memory_limit_bytes = 0;  // CUDA: cap the caching allocator at this much (0 = the card)
};

Result<std::unique_ptr<TaskExecutor>> CreateTorchExecutor(const TorchExecutorOptions& options);

// "1.13.0" / "2.11.0+cu130" and whether CUDA is compiled in and usable.
std::string TorchBuildInfo();

}  // namespace strata::worker
