// Faults at exact instants that a real thing cannot reach on demand: a memory spike in one step
// of one rank, a rank that stops in its own work. Tests set them - in-process through
// TaskContext::faults, across processes with the hidden `--inject-fault` flag of strata-worker
// (and `strata up`, which passes it to every worker it starts). Product code asks the injector at
// the instant; the default injects nothing. No environment variable is read.
//
// Fault specs (one per flag):
//   ballast:STEP:BYTES[:RANK]  step STEP (on rank RANK, default every rank) also allocates BYTES
//                              per sequence of its micro-batch on the device, as a longer batch
//                              would; the allocation and its failure are real.
//   hang:STEP:RANK[:stuck]     rank RANK stops before step STEP, once per worker (process restarts
//                              included: a restarted worker gets no faults), as a rank stuck in its
//                              own work would: heartbeats go on while its peers wait in the step's
//                              first collective. It wakes when cancelled, or with ":stuck" never (a
//                              device call that will not return: the worker must restart itself).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::worker {

class FaultInjector {
 public:
  enum class Hang { kNone, kUntilCancelled, kForever };

  virtual ~FaultInjector() = default;
  // Extra device bytes per sequence that step `step` of rank `rank` allocates (0: none).
  virtual int64_t StepBallastBytesPerSequence(int64_t step, uint32_t rank) const = 0;
  // Whether rank `rank` hangs before step `step`; a hang is handed out once per process.
  virtual Hang HangBeforeStep(int64_t step, uint32_t rank) = 0;
  // In-process tests only (no spec): whether step `step`'s schedule waits for the device after its
  // backwards, as an op that synchronises would - which a CUDA graph's capture refuses.
  virtual bool SyncInStep(int64_t step) const {
    (void)step;
    return false;
  }
};

// Injects nothing: every worker's default.
FaultInjector& NoFaults();

// The injector of the specs above; InvalidArgument naming the spec that does not parse.
Result<std::unique_ptr<FaultInjector>> ParseFaults(const std::vector<std::string>& specs);

}  // namespace strata::worker
