#include "common/check.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(CheckDeathTest, FailedComparisonPrintsBothOperands) {
  const int rows = 96, expected = 128;
  EXPECT_DEATH(STRATA_CHECK_EQ(rows, expected), "check failed: rows == expected \\(96 vs 128\\)");
  EXPECT_DEATH(STRATA_CHECK_LT(expected, rows), "check failed: expected < rows \\(128 vs 96\\)");
}

TEST(CheckDeathTest, PassingComparisonEvaluatesEachOperandOnce) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  STRATA_CHECK_EQ(next(), 1);
  STRATA_CHECK_LE(next(), 2);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace strata
