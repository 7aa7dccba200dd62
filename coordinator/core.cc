#include "coordinator/core.h"

#include "coordinator/run_loader.h"

namespace strata::coordinator {

CoordinatorCore::CoordinatorCore(const CoordinatorOptions& options, const Clock& clock,
                                 std::unique_ptr<storage::ShardStore> store, Outbox& outbox,
                                 std::function<void()> on_shutdown)
    : timers_(clock),
      journal_(std::move(store), clock),
      cluster_(options, clock, timers_, journal_, outbox),
      committer_(cluster_),
      files_(cluster_),
      train_(cluster_, committer_, files_),
      extract_(cluster_),
      admission_(cluster_, train_, extract_),
      rpc_(cluster_, train_, extract_, committer_, files_, std::move(on_shutdown)),
      dashboard_(cluster_) {
  cluster_.schedule = [this] { admission_.Schedule(); };
  committer_.OnCommitted([this](RunEntry& run, int64_t step) { train_.MaybeGrowBack(run, step); });
  cluster_.workers.AddWorkerLostListener([this](const std::string& worker) { committer_.AbandonCopiesTo(worker); });
  cluster_.workers.AddTaskLostListener([this](WorkerEntry& w, const std::string& run_id, const std::string& why) {
    RunEntry* run = cluster_.FindRun(run_id);
    if (!run || run->terminal()) return;
    if (run->spec.is_extract()) {
      extract_.WorkerLost(*run, w, why);
    } else {
      train_.WorkerLost(*run, w.id, why);
    }
  });
  timers_.Every(100, [this] { cluster_.workers.CheckHeartbeats(); });
  timers_.Every(250, [this] { dashboard_.Publish(); });
  if (options.on_status) timers_.Every(1000, [this] { cluster_.options.on_status(dashboard_.Summary()); });
}

Status CoordinatorCore::Load() {
  Status st = RunLoader(cluster_, train_, extract_).Load();
  journal_.Flush(cluster_.runs);
  return st;
}

void CoordinatorCore::Dispatch(const std::string& identity, Envelope::Reader root) {
  rpc_.Dispatch(identity, root);
  journal_.Flush(cluster_.runs);
}

void CoordinatorCore::RunDueTimers() {
  timers_.RunDue();
  journal_.Flush(cluster_.runs);
}

}  // namespace strata::coordinator
