#include "coordinator/run_entry.h"

namespace strata::coordinator {

RunState StateOf(Phase phase) {
  switch (phase) {
    case Phase::kQueued:
    case Phase::kRecovering:
    case Phase::kRecoveringAnyMesh:
    case Phase::kAwaitingSnapshot:
      return RunState::PENDING;
    case Phase::kRunning:
    case Phase::kStallWindow:
      return RunState::RUNNING;
    case Phase::kFinished:
      return RunState::FINISHED;
    case Phase::kFailed:
      return RunState::FAILED;
    case Phase::kCancelled:
      return RunState::CANCELLED;
  }
  return RunState::FAILED;
}

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kQueued:
      return "queued";
    case Phase::kRecovering:
      return "recovering";
    case Phase::kRecoveringAnyMesh:
      return "recovering-any-mesh";
    case Phase::kAwaitingSnapshot:
      return "awaiting-snapshot";
    case Phase::kRunning:
      return "running";
    case Phase::kStallWindow:
      return "stall-window";
    case Phase::kFinished:
      return "finished";
    case Phase::kFailed:
      return "failed";
    case Phase::kCancelled:
      return "cancelled";
  }
  return "?";
}

}  // namespace strata::coordinator
