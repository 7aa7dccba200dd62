#include "coordinator/event_kind.h"

#include <array>
#include <utility>

namespace strata::coordinator {
namespace {

constexpr std::array<std::pair<EventKind, std::string_view>, 24> kNames = {{
    {EventKind::kSubmitted, "submitted"},
    {EventKind::kPlanned, "planned"},
    {EventKind::kAssigned, "assigned"},
    {EventKind::kFinished, "finished"},
    {EventKind::kFailed, "failed"},
    {EventKind::kCancelled, "cancelled"},
    {EventKind::kRankFailed, "rank-failed"},
    {EventKind::kWorkerLost, "worker-lost"},
    {EventKind::kStalled, "stalled"},
    {EventKind::kRecovering, "recovering"},
    {EventKind::kReplanned, "replanned"},
    {EventKind::kGrew, "grew"},
    {EventKind::kOom, "oom"},
    {EventKind::kSnapshot, "snapshot"},
    {EventKind::kCheckpoint, "checkpoint"},
    {EventKind::kCheckpointNotCopied, "checkpoint-not-copied"},
    {EventKind::kCheckpointIncomplete, "checkpoint-incomplete"},
    {EventKind::kCheckpointCopyLost, "checkpoint-copy-lost"},
    {EventKind::kCheckpointUnreadable, "checkpoint-unreadable"},
    {EventKind::kCheckpointDeleted, "checkpoint-deleted"},
    {EventKind::kCoordinatorRestarted, "coordinator-restarted"},
    {EventKind::kChunksResumed, "resumed"},
    {EventKind::kChunksReassigned, "reassigned"},
    {EventKind::kReservationExpired, "replan"},
}};

}  // namespace

std::string_view EventKindName(EventKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

std::optional<EventKind> EventKindFromName(std::string_view name) {
  for (const auto& [k, n] : kNames) {
    if (n == name) return k;
  }
  return std::nullopt;
}

bool IsHandledFailure(std::string_view name) {
  const auto kind = EventKindFromName(name);
  if (!kind) return false;
  switch (*kind) {
    case EventKind::kOom:
    case EventKind::kWorkerLost:
    case EventKind::kStalled:
    case EventKind::kCheckpointUnreadable:
    case EventKind::kCoordinatorRestarted:
      return true;
    default:
      return false;
  }
}

}  // namespace strata::coordinator
