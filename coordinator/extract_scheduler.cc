#include "coordinator/extract_scheduler.h"

#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>

#include "common/log.h"
#include "common/token_file.h"
#include "spec/run_spec_capnp.h"

namespace strata::coordinator {

// Counts the run's rows and chunks from its data file: the one file of a run the coordinator
// opens, so an extract run's data must be readable at the same path on the coordinator's host
// (a train run's only on its workers'); a missing or malformed file is refused at submit.
Status ExtractScheduler::SizeExtract(RunEntry& run) {
  STRATA_ASSIGN_OR_RETURN(TokenFileLayout layout, ReadTokenFileLayout(run.spec.data.path, run.spec.data.format));
  const int64_t tokens = static_cast<int64_t>(layout.tokens);
  const int64_t sequences = ExtractSequences(run.spec, tokens);
  if (sequences <= 0) {
    return InvalidArgument("data.path = \"" + run.spec.data.path +
                           "\" holds fewer tokens than one sequence (model.sequence = " +
                           std::to_string(run.spec.model.sequence) + "); nothing to capture");
  }
  run.extract.total_chunks = static_cast<uint64_t>(ExtractChunks(run.spec, tokens));
  run.extract.total_rows = static_cast<uint64_t>(sequences * run.spec.model.sequence);
  return Status::Ok();
}

// Chunks of the run neither stored, nor in a running task, nor waiting for a lost worker.
std::vector<uint64_t> ExtractScheduler::UnassignedChunks(const RunEntry& run) {
  std::vector<uint64_t> out;
  const ExtractState& x = run.extract;
  for (uint64_t c = 0; c < x.total_chunks; ++c) {
    if (x.stored.count(c)) continue;
    bool taken = false;
    for (const auto& [w, chunks] : x.tasks) taken = taken || chunks.count(c);
    for (const auto& [w, r] : x.reserved) taken = taken || r.chunks.count(c);
    if (!taken) out.push_back(c);
  }
  return out;
}

// Splits `chunks` into contiguous blocks, one per worker (rows of one block sit in one store,
// so a query over a row range reads few stores).
void ExtractScheduler::AssignBlocks(RunEntry& run, const std::vector<uint64_t>& chunks,
                                    const std::vector<WorkerEntry*>& workers) {
  const size_t n = std::min(workers.size(), chunks.size());
  for (size_t i = 0; i < n; ++i) {
    const size_t begin = chunks.size() * i / n, end = chunks.size() * (i + 1) / n;
    AssignExtractTask(run, *workers[i], std::vector<uint64_t>(chunks.begin() + begin, chunks.begin() + end));
  }
}

void ExtractScheduler::Start(RunEntry& run, const std::vector<WorkerEntry*>& workers) {
  run.workers.clear();
  run.extract.started_ms = c_.clock.SteadyMs();
  run.extract.computed_rows = 0;
  run.extract.computed_bytes = 0;
  const std::vector<uint64_t> chunks = UnassignedChunks(run);
  if (chunks.empty()) return FinishExtract(run);
  AssignBlocks(run, chunks, workers);
  std::string names;
  for (auto& n : run.workers) names += (names.empty() ? "" : ", ") + n;
  c_.AddEvent(run, EventKind::kAssigned, std::to_string(chunks.size()) + " chunks on " + names);
  c_.Transition(run, Phase::kRunning);
}

void ExtractScheduler::AssignExtractTask(RunEntry& run, WorkerEntry& w, const std::vector<uint64_t>& chunks) {
  w.state = WorkerState::BUSY;
  w.current_run = run.id;
  run.extract.tasks[w.id].insert(chunks.begin(), chunks.end());
  if (!std::count(run.workers.begin(), run.workers.end(), w.id)) run.workers.push_back(w.id);
  std::string list;
  for (uint64_t c : chunks) list += storage::EncodeKeyU64(c);
  Status st = c_.journal.store().PutMetadata(keys::Task(run.id, w.id), AsBytes(list), true);
  if (!st.ok()) STRATA_LOG(kError) << "could not persist the task of " << w.id << ": " << st.ToString();
  schema::EnvelopeBuilder msg;
  auto a = msg.root().initAssignTask();
  a.setRunId(run.id);
  WriteRunSpec(run.spec, a.initSpec());
  a.setRank(0);
  a.setWorldSize(1);
  a.setTaskToken(c_.rng());
  a.initPeerDataAddresses(1).set(0, w.data_address);
  auto list_builder = a.initChunks(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) list_builder.set(i, chunks[i]);
  c_.outbox.Send(w.identity, msg.Serialize());
}

// Gives returning workers their reserved chunks, and unassigned chunks to idle workers (at
// most parallel.dp capturing at once).
void ExtractScheduler::ScheduleChunks(RunEntry& run) {
  ExtractState& x = run.extract;
  for (auto it = x.reserved.begin(); it != x.reserved.end();) {
    auto w = c_.workers.all().find(it->first);
    if (w == c_.workers.all().end() || w->second.state != WorkerState::IDLE) {
      ++it;
      continue;
    }
    std::vector<uint64_t> chunks;
    for (uint64_t c : it->second.chunks) {
      if (!x.stored.count(c)) chunks.push_back(c);
    }
    c_.AddEvent(run, EventKind::kChunksResumed,
                w->first + " is back: it resumes its " + std::to_string(chunks.size()) + " unfinished chunks");
    it = x.reserved.erase(it);
    if (!chunks.empty()) AssignExtractTask(run, w->second, chunks);
  }
  const std::vector<uint64_t> chunks = UnassignedChunks(run);
  if (chunks.empty()) return;
  const size_t room =
      static_cast<size_t>(run.spec.parallel.dp) > x.tasks.size() ? run.spec.parallel.dp - x.tasks.size() : 0;
  std::vector<WorkerEntry*> idle;
  for (auto& [id, w] : c_.workers.all()) {
    if (w.state == WorkerState::IDLE && idle.size() < room) idle.push_back(&w);
  }
  if (idle.empty()) return;
  AssignBlocks(run, chunks, idle);
  c_.AddEvent(run, EventKind::kChunksReassigned,
              std::to_string(chunks.size()) + " unfinished chunks go to " +
                  std::to_string(std::min(idle.size(), chunks.size())) + " worker(s)");
  c_.Persist(run);
}

void ExtractScheduler::WorkerLost(RunEntry& run, const WorkerEntry& w, std::string what) {
  ExtractState& x = run.extract;
  std::set<uint64_t> chunks;
  if (auto it = x.tasks.find(w.id); it != x.tasks.end()) {
    chunks = std::move(it->second);
    x.tasks.erase(it);
  }
  (void)c_.journal.store().DeleteMetadata(keys::Task(run.id, w.id));
  run.workers.erase(std::remove(run.workers.begin(), run.workers.end(), w.id), run.workers.end());
  if (!chunks.empty()) {
    const uint64_t serial = ++reservations_;
    x.reserved[w.id] = {serial, chunks};
    c_.timers.After(c_.options.replace_grace_ms,
                    [this, run_id = run.id, worker = w.id, serial] { ReservationExpired(run_id, worker, serial); });
    what += "; its " + std::to_string(chunks.size()) + " unfinished chunks wait " +
            std::to_string(c_.options.replace_grace_ms) + " ms for it to come back, then go to the other workers";
  }
  c_.AddEvent(run, EventKind::kWorkerLost, what);
  c_.Persist(run);
}

void ExtractScheduler::HandleTaskEvent(const std::string& worker, RunEntry& run, TaskEvent::Reader ev) {
  switch (ev.which()) {
    case TaskEvent::CHUNK_STORED:
      return RecordChunk(run, worker, ev.getChunkStored());
    case TaskEvent::FINISHED:
      return EndExtractTask(run, worker);
    case TaskEvent::FAILED:
      c_.AddEvent(run, EventKind::kRankFailed, worker + ": " + ev.getFailed().cStr());
      return c_.FailRun(run, worker + " failed: " + ev.getFailed().cStr());
    default:
      return;
  }
}

void ExtractScheduler::RecordChunk(RunEntry& run, const std::string& worker, ChunkStored::Reader c) {
  ExtractState& x = run.extract;
  const uint64_t chunk = c.getChunk();
  if (chunk >= x.total_chunks) {
    STRATA_LOG(kWarn) << worker << " reported chunk " << chunk << " of " << run.id << ", which has " << x.total_chunks;
    return;
  }
  if (auto it = x.tasks.find(worker); it != x.tasks.end()) it->second.erase(chunk);
  for (auto& [w, r] : x.reserved) r.chunks.erase(chunk);
  ++(c.getComputed() ? x.computed_reports : x.found_reports);
  if (x.stored.count(chunk)) {
    // Only after a reassignment past the grace period: the index keeps the first copy.
    STRATA_LOG(kWarn) << "chunk " << chunk << " of " << run.id << " reported again by " << worker
                      << "; keeping the first";
    return;
  }
  capnp::MallocMessageBuilder message;
  auto loc = message.initRoot<ChunkLocation>();
  loc.setChunk(chunk);
  loc.setRowBegin(c.getRowBegin());
  loc.setRowCount(c.getRowCount());
  loc.setBytes(c.getBytes());
  loc.setWorker(worker);
  if (auto w = c_.workers.all().find(worker); w != c_.workers.all().end()) {
    loc.setStorePath(w->second.store_path);
    loc.setServeAddress(w->second.serve_address);
  }
  const std::string bytes = schema::StructToBytes(loc.asReader());
  Status st = c_.journal.store().PutMetadata(keys::Chunk(run.id, chunk), AsBytes(bytes), true);
  if (!st.ok()) {
    STRATA_LOG(kError) << "could not index chunk " << chunk << " of " << run.id << ": " << st.ToString();
    return;
  }
  x.stored[chunk] = bytes;
  x.stored_bytes += c.getBytes();
  x.stored_rows += c.getRowCount();
  run.step = static_cast<int64_t>(x.stored.size());
  run.updated_ms = c_.clock.UnixMs();
  if (c.getComputed()) {
    x.computed_rows += c.getRowCount();
    const double seconds = std::max(1e-3, (c_.clock.SteadyMs() - x.started_ms) / 1000.0);
    run.tokens_per_second = static_cast<double>(x.computed_rows) / seconds;
    x.computed_bytes += c.getBytes();
    x.bytes_per_second = static_cast<double>(x.computed_bytes) / seconds;
  }
  if (x.stored.size() == x.total_chunks) FinishExtract(run);
}

void ExtractScheduler::EndExtractTask(RunEntry& run, const std::string& worker) {
  run.extract.tasks.erase(worker);
  (void)c_.journal.store().DeleteMetadata(keys::Task(run.id, worker));
  run.workers.erase(std::remove(run.workers.begin(), run.workers.end(), worker), run.workers.end());
  if (auto w = c_.workers.all().find(worker); w != c_.workers.all().end() && w->second.current_run == run.id) {
    w->second.current_run.clear();
    if (w->second.state == WorkerState::BUSY) w->second.state = WorkerState::IDLE;
  }
  if (run.extract.stored.size() == run.extract.total_chunks) return FinishExtract(run);
  c_.Persist(run);
  c_.Schedule();
}

void ExtractScheduler::FinishExtract(RunEntry& run) {
  const double gib = run.extract.stored_bytes / double(1ull << 30);
  std::ostringstream msg;
  msg << "captured " << run.extract.total_rows << " token rows in " << run.extract.total_chunks << " chunks ("
      << std::fixed << std::setprecision(2) << gib << " GiB): " << run.extract.computed_reports
      << " chunk(s) computed, " << run.extract.found_reports << " found already stored by a resumed task";
  c_.AddEvent(run, EventKind::kFinished, msg.str());
  c_.CancelRanks(run, "run finished");
  for (auto& [worker, chunks] : run.extract.tasks) (void)c_.journal.store().DeleteMetadata(keys::Task(run.id, worker));
  run.extract.tasks.clear();
  run.extract.reserved.clear();
  c_.ReleaseWorkers(run);
  c_.Transition(run, Phase::kFinished);
  c_.Schedule();
}

Status ExtractScheduler::Load(RunEntry& run) {
  STRATA_RETURN_IF_ERROR(SizeExtract(run));
  STRATA_ASSIGN_OR_RETURN(auto index, c_.journal.store().ScanMetadata(keys::ChunkPrefix(run.id)));
  for (auto& [key, value] : index) {
    auto loc = schema::DecodedRecord<ChunkLocation>::Decode(value);
    if (!loc.ok()) continue;
    run.extract.stored[loc->root().getChunk()] = std::string(value.begin(), value.end());
    run.extract.stored_bytes += loc->root().getBytes();
    run.extract.stored_rows += loc->root().getRowCount();
  }
  run.step = static_cast<int64_t>(run.extract.stored.size());
  const std::string prefix = keys::TaskPrefix(run.id);
  STRATA_ASSIGN_OR_RETURN(auto tasks, c_.journal.store().ScanMetadata(prefix));
  for (auto& [key, value] : tasks) {
    std::string_view rest = std::string_view(key).substr(prefix.size());
    std::string worker;
    if (!storage::ConsumeKeyString(&rest, &worker)) continue;
    std::string_view list(reinterpret_cast<const char*>(value.data()), value.size());
    uint64_t c = 0;
    while (storage::ConsumeKeyU64(&list, &c)) {
      if (!run.extract.stored.count(c)) run.extract.tasks[worker].insert(c);
    }
  }
  return Status::Ok();
}

// A lost worker did not come back within replace_grace_ms: its reserved chunks go to the others.
void ExtractScheduler::ReservationExpired(const std::string& run_id, const std::string& worker, uint64_t serial) {
  RunEntry* run = c_.FindRun(run_id);
  if (!run || !run->running()) return;
  auto it = run->extract.reserved.find(worker);
  if (it == run->extract.reserved.end() || it->second.serial != serial) return;
  c_.AddEvent(*run, EventKind::kReservationExpired,
              worker + " did not come back within " + std::to_string(c_.options.replace_grace_ms) + " ms: its " +
                  std::to_string(it->second.chunks.size()) + " chunks go to the other workers");
  run->extract.reserved.erase(it);
  c_.Schedule();
}

}  // namespace strata::coordinator
