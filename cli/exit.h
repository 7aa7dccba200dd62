// Exit codes of `strata` (0 success, 1 failure, 2 bad input) and the one way errors are printed.
#pragma once

#include <iostream>

#include "common/status.h"

namespace strata::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

inline int Fail(const Status& status) {
  std::cerr << "strata: " << status.message() << std::endl;
  return status.code() == StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
}

}  // namespace strata::cli
