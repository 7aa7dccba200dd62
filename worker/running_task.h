// A task running on this worker: its thread, cancel flag and reports (private to worker/).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/task_log.h"
#include "common/thread_annotations.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"
#include "worker/outbox.h"
#include "worker/task.h"

namespace strata::worker {

// A running task: its thread, cancel flag and reporter.
class RunningTask final : public TaskReporter {
 public:
  RunningTask(std::string run_id, uint32_t rank, uint64_t task_token, Outbox* outbox)
      : run_id_(std::move(run_id)), rank_(rank), task_token_(task_token), outbox_(outbox) {}

  void ReportStep(int64_t step, double loss, double grad_norm, double tokens_per_second,
                  const StepMemory& memory) override {
    current_step_.store(step);
    schema::EnvelopeBuilder msg;
    auto ev = Event(msg);
    auto s = ev.initStep();
    s.setStep(step);
    s.setLoss(loss);
    s.setTokensPerSecond(tokens_per_second);
    s.setGradNorm(grad_norm);
    s.setSchedulePeakBytes(static_cast<uint64_t>(std::max<int64_t>(0, memory.schedule_peak_bytes)));
    s.setUpdatePeakBytes(static_cast<uint64_t>(std::max<int64_t>(0, memory.update_peak_bytes)));
    PushAndRemember(msg.Serialize());
    if (task_log_) {
      char line[256];
      std::snprintf(line, sizeof(line), "step %lld loss %.6f lr %.6g grad_norm %.6g tokens/s %.1f memory %lld bytes",
                    static_cast<long long>(step), loss, LearningRate(train_, step), grad_norm, tokens_per_second,
                    static_cast<long long>(std::max(memory.schedule_peak_bytes, memory.update_peak_bytes)));
      task_log_->Append(log::Level::kInfo, line);
    }
  }

  void ReportCheckpoint(int64_t step, const std::string& key_run,
                        const std::vector<storage::CheckpointTensorInfo>& tensors) override {
    schema::EnvelopeBuilder msg;
    auto shard = Event(msg).initCheckpointSaved();
    shard.setStep(step);
    shard.setStorePath(store_path_);
    if (key_run != run_id_) shard.setKeyRun(key_run);
    auto list = shard.initTensors(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      list[i].setName(tensors[i].name);
      list[i].setDtype(ToWire(tensors[i].dtype));
      auto shape = list[i].initShape(tensors[i].shape.size());
      for (size_t d = 0; d < tensors[i].shape.size(); ++d) shape.set(d, tensors[i].shape[d]);
      list[i].setChecksum(tensors[i].checksum);
      list[i].setSizeBytes(tensors[i].size_bytes);
    }
    PushAndRemember(msg.Serialize());
  }

  // Step and checkpoint reports sent during a coordinator outage (or in flight when it died) are
  // lost with it; they are idempotent, so after re-registering the control thread sends them all
  // again (the restarted coordinator keeps what it lacks).
  std::vector<std::string> History() STRATA_EXCLUDES(history_mutex_) {
    MutexLock lock(history_mutex_);
    return {history_.begin(), history_.end()};
  }

  void ReportChunk(const storage::ActivationChunkInfo& chunk, bool computed) override {
    current_step_.fetch_add(1);
    schema::EnvelopeBuilder msg;
    auto c = Event(msg).initChunkStored();
    c.setChunk(chunk.chunk);
    c.setRowBegin(chunk.row_begin);
    c.setRowCount(chunk.row_count);
    c.setBytes(chunk.bytes);
    c.setComputed(computed);
    outbox_->Push(msg.Serialize());
  }

  void ReportNotice(const std::string& kind, const std::string& message) override {
    schema::EnvelopeBuilder msg;
    auto n = Event(msg).initNotice();
    n.setKind(kind);
    n.setMessage(message);
    outbox_->Push(msg.Serialize());
  }

  void ReportOutOfMemory(const OutOfMemoryReport& report) override {
    schema::EnvelopeBuilder msg;
    auto o = Event(msg).initOutOfMemory();
    o.setStep(report.step);
    o.setMicroBatch(report.micro_batch);
    o.setIntactStep(report.intact_step);
    o.setDetail(report.detail);
    o.setFreeBytes(report.free_bytes);
    o.setTotalBytes(report.total_bytes);
    end_reported_.store(true);
    outbox_->Push(msg.Serialize());
  }

  // missing_rank < 0: this rank timed out but cannot say on whom (an NCCL collective). Once: the
  // NCCL watchdog reports from its thread, and the task reports again when it unblocks.
  void ReportStalled(int64_t missing_rank, const std::string& detail) override {
    if (stall_reported_.exchange(true)) return;
    schema::EnvelopeBuilder msg;
    auto st = Event(msg).initStalled();
    st.setMissingRank(missing_rank < 0 ? 0 : static_cast<uint32_t>(missing_rank));
    st.setRankKnown(missing_rank >= 0);
    st.setDetail(detail);
    end_reported_.store(true);
    outbox_->Push(msg.Serialize());
  }

  // `resume`: the checkpoint the task started from. A resumed train task that ends with
  // kCorruption could not read it (nothing else in training reads the store), which the
  // coordinator answers with an older checkpoint rather than failing the run.
  void ReportEnd(const Status& status, const ResumePoint& resume) {
    if (end_reported_.load()) return;  // ReportOutOfMemory was the end report
    schema::EnvelopeBuilder msg;
    auto ev = Event(msg);
    if (status.ok()) {
      ev.setFinished();
    } else if (status.code() == StatusCode::kCorruption && !resume.run_id.empty()) {
      auto u = ev.initCheckpointUnreadable();
      u.setSourceRun(resume.run_id);
      u.setStep(resume.step);
      u.setWhy(status.message());
    } else {
      ev.setFailed(status.ToString());
    }
    outbox_->Push(msg.Serialize());
  }

  ::TaskEvent::Builder Event(schema::EnvelopeBuilder& msg) {
    auto ev = msg.root().initTaskEvent();
    ev.setRunId(run_id_);
    ev.setRank(rank_);
    ev.setTaskToken(task_token_);
    return ev;
  }

  void PushAndRemember(std::string bytes) STRATA_EXCLUDES(history_mutex_) {
    {
      MutexLock lock(history_mutex_);
      history_.push_back(bytes);
      if (history_.size() > kHistoryLimit) history_.pop_front();
    }
    outbox_->Push(std::move(bytes));
  }

  static constexpr size_t kHistoryLimit = 100000;  // ~100 bytes each
  const std::string run_id_;
  const uint32_t rank_;
  const uint64_t task_token_;
  Outbox* outbox_;
  std::atomic<bool> end_reported_{false};
  std::atomic<bool> stall_reported_{false};
  Mutex history_mutex_;
  std::deque<std::string> history_ STRATA_GUARDED_BY(history_mutex_);
  std::string store_path_;
  TrainSpec train_;                         // set before the task thread starts
  std::shared_ptr<log::TaskLog> task_log_;  // STORE/logs/<hex run>/rank-R.log; null if it could not open
  std::thread thread;
  CancelFlag cancelled;
  std::atomic<int64_t> snapshot_step{0};  // set before `cancelled` (CancelTask.snapshotStep)
  std::atomic<bool> done{false};
  std::atomic<bool> device_stuck{false};  // TaskContext::device_stuck
  std::atomic<int64_t> current_step_{0};
  // Set by the task thread while it exists; the control thread aborts it on a cancel.
  Mutex communicator_mutex;
  Communicator* communicator STRATA_GUARDED_BY(communicator_mutex) = nullptr;
};

}  // namespace strata::worker
