// The kinds of a run's journal events. Their names are what `strata events`, the dashboard and
// scripts see (persisted in Event.kind), so a name never changes once written; EventKindName is
// the one table of them. Workers' notices carry a kind of their own (TaskEvent.notice.kind) and are
// journaled under that name.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace strata::coordinator {

enum class EventKind {
  kSubmitted,
  kPlanned,
  kAssigned,
  kFinished,
  kFailed,
  kCancelled,
  kRankFailed,
  kWorkerLost,
  kStalled,
  kRecovering,
  kReplanned,  // a train run's mesh or micro-batch changed ("replanned")
  kGrew,       // a shrunken train run took workers back
  kOom,
  kSnapshot,
  kCheckpoint,
  kCheckpointNotCopied,
  kCheckpointIncomplete,
  kCheckpointCopyLost,
  kCheckpointUnreadable,
  kCheckpointDeleted,
  kCoordinatorRestarted,
  kChunksResumed,       // a returning worker got its reserved chunks back ("resumed")
  kChunksReassigned,    // unassigned chunks went to idle workers ("reassigned")
  kReservationExpired,  // a lost worker's reserved chunks were released ("replan": its historical name)
};

std::string_view EventKindName(EventKind kind);
std::optional<EventKind> EventKindFromName(std::string_view name);

// Events that say the run got through a failure (RunRecord.handled, `strata status`). `name` may
// be a worker notice's kind (a worker's "oom" notice counts).
bool IsHandledFailure(std::string_view name);

}  // namespace strata::coordinator
