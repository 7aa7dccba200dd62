// The coordinator's message handlers: each decodes one request, calls the room that owns the
// answer and encodes the reply. Not thread-safe: the loop thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "coordinator/checkpoint_committer.h"
#include "coordinator/cluster.h"
#include "coordinator/extract_scheduler.h"
#include "coordinator/run_files.h"
#include "coordinator/train_run.h"

namespace strata::coordinator {

class RpcHandlers {
 public:
  RpcHandlers(Cluster& c, TrainRun& train, ExtractScheduler& extract, CheckpointCommitter& committer, RunFiles& files,
              std::function<void()> on_shutdown)
      : c_(c),
        train_(train),
        extract_(extract),
        committer_(committer),
        files_(files),
        on_shutdown_(std::move(on_shutdown)) {}

  // Handles one decoded envelope from `identity` (a worker or a client).
  void Dispatch(const std::string& identity, Envelope::Reader root);

 private:
  void HandleRegisterWorker(const std::string& identity, uint64_t rid, RegisterWorker::Reader req);
  void HandleHeartbeat(const std::string& identity, uint64_t rid, Heartbeat::Reader hb);
  void HandleTaskEvent(const std::string& identity, TaskEvent::Reader ev);
  void HandleShardReplicated(const std::string& identity, ShardReplicated::Reader done);
  void HandleRunFileRequest(const std::string& identity, uint64_t rid, RunFileRequest::Reader req);
  void HandleSubmitRun(const std::string& identity, uint64_t rid, SubmitRun::Reader req);
  void HandleCancelRun(const std::string& identity, uint64_t rid, RunRef::Reader req);
  void HandleActivationsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req);
  void HandleStatusRequest(const std::string& identity, uint64_t rid, StatusRequest::Reader req);
  void HandleWorkersRequest(const std::string& identity, uint64_t rid);
  void HandleEventsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req);
  void HandleCheckpointsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req);
  void HandleShutdown(const std::string& identity, uint64_t rid);

  // A run that starts from `source_id`'s checkpoint at `step` (0 = its latest): same model, any mesh.
  Status SetUpResume(RunEntry& run, const std::string& source_id, int64_t step);
  std::string NewRunId(const std::string& name);
  template <typename T, typename InitList>
  void ReplyWithRunRecords(const std::string& identity, uint64_t rid, const std::string& id, const std::string& prefix,
                           InitList init_list, const std::function<void(schema::EnvelopeBuilder&)>& finish = nullptr);
  // The run `id`, or null after answering the request with NotFound.
  RunEntry* RunOrReplyNotFound(const std::string& identity, uint64_t rid, const std::string& id);
  static std::string UnknownRun(const std::string& id);
  void Ack(const std::string& identity, uint64_t rid);

  Cluster& c_;
  TrainRun& train_;
  ExtractScheduler& extract_;
  CheckpointCommitter& committer_;
  RunFiles& files_;
  std::function<void()> on_shutdown_;
};

}  // namespace strata::coordinator
