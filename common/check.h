// Checks of our own invariants that print the operands: for bugs, never for bad input (that is a
// Status naming the field). STRATA_CHECK (common/status.h) prints only the condition.
#pragma once

#include <cstdlib>
#include <iostream>

namespace strata::check_internal {
template <typename A, typename B>
[[noreturn]] void Failed(const char* file, int line, const char* condition, const A& a, const B& b) {
  std::cerr << file << ":" << line << ": check failed: " << condition << " (" << a << " vs " << b << ")" << std::endl;
  std::abort();
}
}  // namespace strata::check_internal

// STRATA_CHECK_EQ(a, b) and friends: as STRATA_CHECK, and print both operands' values
// ("x.cc:12: check failed: rows == expected (96 vs 128)"). Each operand is evaluated once.
#define STRATA_CHECK_OP(op, a, b)                                                                    \
  do {                                                                                               \
    const auto& _strata_a = (a);                                                                     \
    const auto& _strata_b = (b);                                                                     \
    if (!(_strata_a op _strata_b)) {                                                                 \
      ::strata::check_internal::Failed(__FILE__, __LINE__, #a " " #op " " #b, _strata_a, _strata_b); \
    }                                                                                                \
  } while (0)
#define STRATA_CHECK_EQ(a, b) STRATA_CHECK_OP(==, a, b)
#define STRATA_CHECK_NE(a, b) STRATA_CHECK_OP(!=, a, b)
#define STRATA_CHECK_LT(a, b) STRATA_CHECK_OP(<, a, b)
#define STRATA_CHECK_LE(a, b) STRATA_CHECK_OP(<=, a, b)
#define STRATA_CHECK_GT(a, b) STRATA_CHECK_OP(>, a, b)
#define STRATA_CHECK_GE(a, b) STRATA_CHECK_OP(>=, a, b)
