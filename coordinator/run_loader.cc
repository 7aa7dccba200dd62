#include "coordinator/run_loader.h"

#include <algorithm>

#include "common/log.h"
#include "spec/run_spec_capnp.h"

namespace strata::coordinator {
namespace {

Phase PhaseOf(RunState state) {
  switch (state) {
    case RunState::RUNNING:
      return Phase::kRunning;
    case RunState::FINISHED:
      return Phase::kFinished;
    case RunState::FAILED:
      return Phase::kFailed;
    case RunState::CANCELLED:
      return Phase::kCancelled;
    default:
      return Phase::kQueued;
  }
}

}  // namespace

Status RunLoader::Load() {
  auto scanned = c_.journal.store().ScanMetadata(keys::AllRuns());
  if (!scanned.ok()) {
    return Status(
        scanned.status().code(),
        scanned.status().message() + (c_.options.salvage ? "" : " (start with --salvage to keep what is intact)"));
  }
  auto& records = *scanned;
  for (auto& [key, bytes] : records) {
    auto rec = schema::DecodedRecord<RunRecord>::Decode(bytes);
    if (!rec.ok()) {
      STRATA_RETURN_IF_ERROR(UnreadableRunRecord(key, bytes, rec.status().message()));
      continue;
    }
    auto r = rec->root();
    RunEntry run;
    run.id = r.getRunId().cStr();
    run.name = r.getName().cStr();
    run.spec_toml = r.getSpecToml().cStr();
    auto spec = ReadRunRecordSpec(r);  // names from before the name rule still load
    if (!spec.ok()) {
      STRATA_RETURN_IF_ERROR(
          UnreadableRunRecord(key, bytes, "its stored spec does not parse: " + spec.status().message()));
      continue;
    }
    run.spec = *spec;
    run.phase = PhaseOf(r.getState());
    run.created_ms = r.getCreatedUnixMs();
    run.updated_ms = r.getUpdatedUnixMs();
    run.step = r.getStep();
    run.resume_run = r.getResumeRun().cStr();
    run.base_identity = r.getBaseIdentity().cStr();
    run.resume_step = r.getResumeStep();
    run.grow_back_to_dp = r.getGrowBackToDp();
    run.task_token = r.getTaskToken();
    for (auto m : r.getMemory()) {
      run.memory.push_back(
          {m.getWorker().cStr(), m.getEstimateBytes(), m.getWorkspaceBytes(), m.getMeasuredPeakBytes()});
    }
    if (run.resume_run == run.id && r.getState() == RunState::PENDING) {
      run.phase = Phase::kRecovering;  // it was recovering: its grace period starts again
    }
    auto steps = c_.journal.store().ScanMetadata(keys::LossPrefix(run.id));
    if (steps.ok()) {
      for (auto& [key, value] : *steps) {
        auto report = schema::DecodedRecord<StepReport>::Decode(value);
        if (!report.ok() || report->root().getStep() < 1) continue;
        const int64_t step = report->root().getStep();
        if (static_cast<int64_t>(run.losses.size()) < step) run.losses.resize(step, 0.0);
        run.losses[step - 1] = report->root().getLoss();
        run.step = std::max(run.step, step);
        run.tokens_per_second = report->root().getTokensPerSecond();
      }
    }
    for (auto w : r.getWorkers()) run.workers.push_back(w.cStr());
    run.message = r.getMessage().cStr();
    if (run.spec.is_extract()) {
      Status st = extract_.Load(run);
      if (!st.ok()) STRATA_LOG(kError) << "run " << run.id << ": cannot restore its capture state: " << st.message();
    }
    auto events = c_.journal.store().ScanMetadata(keys::EventPrefix(run.id));
    run.next_event_seq = events.ok() ? events->size() : 0;
    // The journal is the record of what was handled (the run record may be a step behind it).
    if (events.ok()) {
      for (auto& [key, value] : *events) {
        auto event = schema::DecodedRecord<Event>::Decode(value);
        if (event.ok() && IsHandledFailure(event->root().getKind().cStr()))
          ++run.handled[event->root().getKind().cStr()];
      }
    }
    RunEntry& stored = c_.runs[run.id] = std::move(run);
    if (stored.phase == Phase::kRecovering) train_.ArmRecoveryDeadline(stored);
    if (stored.running()) {
      // Expect its workers back: placeholders that the heartbeat timeout turns lost (failing
      // the run) unless they re-register in time.
      for (auto& id : stored.workers) c_.workers.ExpectBack(id, stored.id);
      c_.AddEvent(stored, EventKind::kCoordinatorRestarted,
                  "coordinator restarted; waiting for the run's workers to re-attach");
    }
  }
  return Status::Ok();
}

// A run record that does not decode: without --salvage the coordinator does not start (it would
// otherwise forget the run without a word); with it, the record moves under "salvaged/" (kept,
// not deleted) and the rest loads.
Status RunLoader::UnreadableRunRecord(const std::string& key, const std::vector<uint8_t>& bytes,
                                      const std::string& why) {
  const std::string where =
      "the run record " + storage::PrintableKey(key) + " in the metadata store " + c_.options.state_dir + "/metadata";
  if (!c_.options.salvage) {
    return Corruption(
        where + " is damaged (" + why +
        "); the coordinator did not start, so nothing is lost yet. Restore "
        "the state directory from a backup, or start with --salvage to keep every intact run (the damaged "
        "record is kept under the salvaged/ prefix)");
  }
  STRATA_LOG(kError) << where << " is damaged (" << why
                     << "): salvaging, it is kept under salvaged/ and its run is not loaded";
  STRATA_RETURN_IF_ERROR(c_.journal.store().PutMetadata(keys::Salvaged(key), bytes, true));
  return c_.journal.store().DeleteMetadata(key);
}

}  // namespace strata::coordinator
