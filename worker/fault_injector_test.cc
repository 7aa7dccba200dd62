#include "worker/fault_injector.h"

#include <gtest/gtest.h>

namespace strata::worker {
namespace {

TEST(FaultInjectorTest, BallastHitsItsStepAndRankOnly) {
  auto faults = ParseFaults({"ballast:3:1024:1", "ballast:5:7"});
  ASSERT_TRUE(faults.ok()) << faults.status().ToString();
  EXPECT_EQ((*faults)->StepBallastBytesPerSequence(3, 1), 1024);
  EXPECT_EQ((*faults)->StepBallastBytesPerSequence(3, 0), 0);
  EXPECT_EQ((*faults)->StepBallastBytesPerSequence(2, 1), 0);
  EXPECT_EQ((*faults)->StepBallastBytesPerSequence(5, 0), 7);  // no rank: every rank
  EXPECT_EQ((*faults)->StepBallastBytesPerSequence(5, 3), 7);
  EXPECT_EQ((*faults)->StepBallastBytesPerSequence(3, 1), 1024);  // a ballast repeats with its step
}

TEST(FaultInjectorTest, HangFiresOncePerProcess) {
  auto faults = ParseFaults({"hang:6:1"});
  ASSERT_TRUE(faults.ok());
  EXPECT_EQ((*faults)->HangBeforeStep(6, 0), FaultInjector::Hang::kNone);
  EXPECT_EQ((*faults)->HangBeforeStep(5, 1), FaultInjector::Hang::kNone);
  EXPECT_EQ((*faults)->HangBeforeStep(6, 1), FaultInjector::Hang::kUntilCancelled);
  EXPECT_EQ((*faults)->HangBeforeStep(6, 1), FaultInjector::Hang::kNone);  // the replayed step runs
  auto stuck = ParseFaults({"hang:2:0:stuck"});
  ASSERT_TRUE(stuck.ok());
  EXPECT_EQ((*stuck)->HangBeforeStep(2, 0), FaultInjector::Hang::kForever);
}

TEST(FaultInjectorTest, NoFaultsInjectsNothing) {
  EXPECT_EQ(NoFaults().StepBallastBytesPerSequence(1, 0), 0);
  EXPECT_EQ(NoFaults().HangBeforeStep(1, 0), FaultInjector::Hang::kNone);
  auto empty = ParseFaults({});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->HangBeforeStep(1, 0), FaultInjector::Hang::kNone);
}

TEST(FaultInjectorTest, BadSpecIsRefusedNamingIt) {
  for (const char* bad : {"hang:6", "hang:6:1:later", "ballast:3", "ballast:x:5", "ballast:3:-5", "explode:1:1",
                          "hang:6:1:stuck:0", ""}) {
    auto faults = ParseFaults({bad});
    ASSERT_FALSE(faults.ok()) << bad;
    EXPECT_NE(faults.status().message().find("--inject-fault \"" + std::string(bad) + "\""), std::string::npos)
        << faults.status().message();
  }
}

}  // namespace
}  // namespace strata::worker
