#include "coordinator/journal.h"

#include "common/log.h"
#include "spec/run_spec_capnp.h"
#include "storage/metadata_batch.h"

namespace strata::coordinator {

using storage::EncodeKeyString;
using storage::EncodeKeyU64;

namespace keys {
std::string Run(const std::string& run) { return "run/" + run; }
std::string AllRuns() { return "run/"; }
std::string EventPrefix(const std::string& run) { return "evt/" + EncodeKeyString(run); }
std::string Event(const std::string& run, uint64_t seq) { return EventPrefix(run) + EncodeKeyU64(seq); }
std::string CheckpointPrefix(const std::string& run) { return AllCheckpoints() + EncodeKeyString(run); }
std::string AllCheckpoints() { return "ckpt/"; }
std::string Checkpoint(const std::string& run, int64_t step) { return CheckpointPrefix(run) + EncodeKeyU64(step); }
std::string LossPrefix(const std::string& run) { return "loss/" + EncodeKeyString(run); }
std::string Loss(const std::string& run, int64_t step) { return LossPrefix(run) + EncodeKeyU64(step); }
std::string ChunkPrefix(const std::string& run) { return "act/" + EncodeKeyString(run); }
std::string Chunk(const std::string& run, uint64_t chunk) { return ChunkPrefix(run) + EncodeKeyU64(chunk); }
std::string TaskPrefix(const std::string& run) { return "task/" + EncodeKeyString(run); }
std::string Task(const std::string& run, const std::string& worker) {
  return TaskPrefix(run) + EncodeKeyString(worker);
}
std::string DeletedShardPrefix(const std::string& store_path) { return "ckptdel/" + EncodeKeyString(store_path); }
std::string DeletedShard(const std::string& store_path, const std::string& key_run, int64_t step) {
  return DeletedShardPrefix(store_path) + EncodeKeyString(key_run) + EncodeKeyU64(step);
}
std::string UnreadableCheckpoint(const std::string& run, int64_t step) {
  return "ckptbad/" + EncodeKeyString(run) + EncodeKeyU64(step);
}
std::string Salvaged(const std::string& key) { return "salvaged/" + key; }
}  // namespace keys

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void Journal::AddNotice(RunEntry& run, const std::string& kind, const std::string& message) {
  if (IsHandledFailure(kind)) ++run.handled[kind];
  capnp::MallocMessageBuilder builder;
  auto ev = builder.initRoot<::Event>();
  ev.setUnixMs(clock_.UnixMs());
  ev.setKind(kind);
  ev.setMessage(message);
  run.unjournaled_events.emplace_back(run.next_event_seq++, schema::StructToBytes(ev.asReader()));
  STRATA_LOG(kInfo) << "run " << run.id << " " << kind << ": " << message;
}

void Journal::AddEvent(RunEntry& run, EventKind kind, const std::string& message) {
  AddNotice(run, std::string(EventKindName(kind)), message);
}

Status Journal::Persist(RunEntry& run) {
  run.updated_ms = clock_.UnixMs();
  capnp::MallocMessageBuilder message;
  FillRunRecord(run, message.initRoot<RunRecord>(), /*with_losses=*/false);
  std::vector<storage::MetadataPut> puts;
  puts.push_back({keys::Run(run.id), schema::StructToBytes(message.getRoot<RunRecord>().asReader())});
  for (auto& [seq, bytes] : run.unjournaled_events) puts.push_back({keys::Event(run.id, seq), bytes});
  Status st = storage::PutMetadataBatch(*store_, puts);
  if (!st.ok()) {
    STRATA_LOG(kError) << "could not persist run " << run.id << ": " << st.ToString();
    return st;
  }
  run.unjournaled_events.clear();
  return st;
}

void Journal::Flush(std::map<std::string, RunEntry>& runs) {
  for (auto& [id, run] : runs) {
    if (run.unjournaled_events.empty()) continue;
    std::vector<storage::MetadataPut> puts;
    for (auto& [seq, bytes] : run.unjournaled_events) puts.push_back({keys::Event(run.id, seq), bytes});
    Status st = storage::PutMetadataBatch(*store_, puts);
    if (!st.ok()) {
      STRATA_LOG(kError) << "could not persist events of " << run.id << ": " << st.ToString();
      continue;
    }
    run.unjournaled_events.clear();
  }
}

int64_t Journal::LastCheckpointStep(const std::string& run, int64_t before) {
  auto list = store_->ScanMetadata(keys::CheckpointPrefix(run));
  if (!list.ok()) return 0;
  for (auto it = list->rbegin(); it != list->rend(); ++it) {
    auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(it->second);
    if (!manifest.ok()) continue;
    const int64_t step = manifest->root().getStep();
    if (step >= before || Unreadable(run, step)) continue;
    return step;
  }
  return 0;
}

std::string Journal::UnreadableWhy(const std::string& run, int64_t step) {
  auto mark = store_->GetMetadata(keys::UnreadableCheckpoint(run, step));
  if (!mark.ok()) return "its mark could not be read (" + mark.status().message() + ")";
  if (!mark->has_value()) return "";
  std::string why((*mark)->begin(), (*mark)->end());
  return why.empty() ? "marked unreadable" : why;
}

Status Journal::MarkUnreadable(const std::string& run, int64_t step, const std::string& why) {
  Status st = store_->PutMetadata(keys::UnreadableCheckpoint(run, step), AsBytes(why), true);
  if (!st.ok())
    STRATA_LOG(kError) << "could not mark the checkpoint of " << run << " at step " << step
                       << " unreadable: " << st.ToString();
  return st;
}

bool Journal::CheckpointCommitted(const std::string& run, int64_t step) {
  auto committed = store_->GetMetadata(keys::Checkpoint(run, step));
  return committed.ok() && committed->has_value();
}

void Journal::FillRunRecord(const RunEntry& run, RunRecord::Builder b, bool with_losses) {
  b.setRunId(run.id);
  b.setName(run.name);
  b.setSpecToml(run.spec_toml);  // the display copy
  WriteRunSpec(run.spec, b.initSpec());
  b.setState(run.state());
  b.setCreatedUnixMs(run.created_ms);
  b.setUpdatedUnixMs(run.updated_ms);
  b.setTotalSteps(run.TotalSteps());
  b.setKind(std::string(Name(run.spec.kind)));
  b.setStep(run.step);
  if (with_losses) {
    auto losses = b.initLosses(run.losses.size());
    for (size_t i = 0; i < run.losses.size(); ++i) losses.set(i, run.losses[i]);
  }
  auto workers = b.initWorkers(run.workers.size());
  for (size_t i = 0; i < run.workers.size(); ++i) workers.set(i, run.workers[i]);
  b.setMessage(run.message);
  b.setWorldSize(run.spec.is_extract() ? run.spec.parallel.dp : run.spec.parallel.workers());
  b.setTokensPerSecond(run.tokens_per_second);
  b.setResumeRun(run.resume_run);
  b.setBaseIdentity(run.base_identity);
  b.setResumeStep(run.resume_step);
  b.setGrowBackToDp(run.grow_back_to_dp);
  b.setTaskToken(run.task_token);
  auto handled = b.initHandled(static_cast<unsigned>(run.handled.size()));
  size_t h = 0;
  for (const auto& [kind, count] : run.handled) {
    handled[h].setKind(kind);
    handled[h++].setCount(count);
  }
  auto memory = b.initMemory(run.memory.size());
  for (size_t i = 0; i < run.memory.size(); ++i) {
    memory[i].setWorker(run.memory[i].worker);
    memory[i].setEstimateBytes(run.memory[i].estimate);
    memory[i].setWorkspaceBytes(run.memory[i].workspace);
    memory[i].setMeasuredPeakBytes(run.memory[i].measured);
  }
}

}  // namespace strata::coordinator
