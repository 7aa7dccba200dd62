#include "coordinator/rpc_handlers.h"

#include <algorithm>

#include "common/log.h"
#include "shard/planner.h"

namespace strata::coordinator {

void RpcHandlers::Dispatch(const std::string& identity, Envelope::Reader root) {
  const uint64_t rid = root.getRequestId();
  switch (root.which()) {
    case Envelope::REGISTER_WORKER:
      return HandleRegisterWorker(identity, rid, root.getRegisterWorker());
    case Envelope::HEARTBEAT:
      return HandleHeartbeat(identity, rid, root.getHeartbeat());
    case Envelope::TASK_EVENT:
      return HandleTaskEvent(identity, root.getTaskEvent());
    case Envelope::SUBMIT_RUN:
      return HandleSubmitRun(identity, rid, root.getSubmitRun());
    case Envelope::STATUS_REQUEST:
      return HandleStatusRequest(identity, rid, root.getStatusRequest());
    case Envelope::WORKERS_REQUEST:
      return HandleWorkersRequest(identity, rid);
    case Envelope::EVENTS_REQUEST:
      return HandleEventsRequest(identity, rid, root.getEventsRequest());
    case Envelope::CANCEL_RUN:
      return HandleCancelRun(identity, rid, root.getCancelRun());
    case Envelope::CHECKPOINTS_REQUEST:
      return HandleCheckpointsRequest(identity, rid, root.getCheckpointsRequest());
    case Envelope::ACTIVATIONS_REQUEST:
      return HandleActivationsRequest(identity, rid, root.getActivationsRequest());
    case Envelope::RUN_FILE_REQUEST:
      return HandleRunFileRequest(identity, rid, root.getRunFileRequest());
    case Envelope::SHARD_REPLICATED:
      return HandleShardReplicated(identity, root.getShardReplicated());
    case Envelope::SHUTDOWN:
      return HandleShutdown(identity, rid);
    case Envelope::ACK:
      return;
    default:
      STRATA_LOG(kWarn) << "dropped a message of unexpected kind " << static_cast<int>(root.which());
      c_.outbox.Send(identity,
                     schema::MakeErrorReply(rid, InvalidArgument("the coordinator does not accept this message kind")));
  }
}

// ---------------------------------------------------------------- workers
void RpcHandlers::HandleRegisterWorker(const std::string& identity, uint64_t rid, RegisterWorker::Reader req) {
  auto registered = c_.workers.Register(identity, req);  // a restart that lost its task tells the run
  if (!registered.ok()) {
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, registered.status()));
    return;
  }
  WorkerEntry& w = **registered;
  if (!w.current_run.empty()) {
    // Re-registration while running (e.g. after a coordinator restart): re-attach if the run
    // still expects it, otherwise tell it to stop.
    const RunEntry* run = c_.FindRun(w.current_run);
    if (run && run->running() && std::count(run->workers.begin(), run->workers.end(), w.id)) {
      w.state = WorkerState::BUSY;
    } else {
      c_.SendCancel(w, w.current_run, "the coordinator no longer runs this task");
      w.current_run.clear();
    }
  }
  committer_.ReconcileStoredCheckpoints(w, req);
  schema::EnvelopeBuilder reply(rid);
  auto r = reply.root().initRegistered();
  r.setWorkerId(w.id);
  r.setHeartbeatIntervalMs(c_.options.heartbeat_interval_ms);
  c_.outbox.Send(identity, reply.Serialize());
  c_.Schedule();
}

void RpcHandlers::HandleHeartbeat(const std::string& identity, uint64_t rid, Heartbeat::Reader hb) {
  if (!c_.workers.Heartbeat(identity, hb)) {
    // Unknown (coordinator restarted), a placeholder this coordinator made at restart for a
    // running run's worker (it knows no address yet), or declared lost: ask it to register again.
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, NotFound("unknown worker; register again")));
  }
}

// A worker's report about its task: notices are journaled; the rest goes to the run's room.
void RpcHandlers::HandleTaskEvent(const std::string& identity, TaskEvent::Reader ev) {
  RunEntry* run = c_.FindRun(ev.getRunId().cStr());
  if (!run || run->terminal()) return;
  if (ev.which() == TaskEvent::NOTICE) {
    const WorkerEntry* w = c_.workers.Find(identity);
    c_.journal.AddNotice(*run, ev.getNotice().getKind().cStr(),
                         (w ? w->id + ": " : std::string()) + ev.getNotice().getMessage().cStr());
    return;
  }
  if (run->spec.is_extract()) return extract_.HandleTaskEvent(identity, *run, ev);
  train_.HandleTaskEvent(*run, ev);
}

void RpcHandlers::HandleShardReplicated(const std::string& identity, ShardReplicated::Reader done) {
  committer_.ShardReplicated(identity, done);
}

void RpcHandlers::HandleRunFileRequest(const std::string& identity, uint64_t rid, RunFileRequest::Reader req) {
  if (const RunEntry* run = RunOrReplyNotFound(identity, rid, req.getRunId().cStr()))
    files_.HandleRunFileRequest(identity, rid, *run, req);
}

// ---------------------------------------------------------------- runs
void RpcHandlers::HandleSubmitRun(const std::string& identity, uint64_t rid, SubmitRun::Reader req) {
  // Every field is checked again (the coordinator must not start a run it cannot plan), but no
  // file: the run's data and weights are opened by its workers, whose hosts may be the only ones
  // holding them, and each worker checks them before it starts (worker.cc, HandleAssign).
  auto spec = ParseSubmittedRunSpec(req.getSpecToml().cStr());
  if (!spec.ok()) {
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, spec.status()));
    return;
  }
  RunEntry run;
  run.id = NewRunId(spec->name);
  run.name = spec->name;
  run.spec = *spec;
  ParallelSpec& parallel = run.spec.parallel;
  if (!run.spec.is_extract() && !parallel.automatic.count("pp") && parallel.pp > 1 && parallel.stages.empty()) {
    auto stages = shard::BalancedStages(run.spec.model, parallel.pp);  // what the planner estimated
    if (!stages.ok()) {
      c_.outbox.Send(identity, schema::MakeErrorReply(rid, stages.status()));
      return;
    }
    parallel.stages = *stages;
  }
  run.spec_toml = RunSpecToToml(run.spec);
  run.base_identity = req.getBaseIdentity().cStr();
  run.created_ms = run.updated_ms = c_.clock.UnixMs();
  if (run.spec.is_extract()) {
    Status st = ExtractScheduler::SizeExtract(run);
    if (!st.ok()) {
      c_.outbox.Send(identity, schema::MakeErrorReply(rid, st));
      return;
    }
  }
  if (!run.spec.is_extract() && req.getResumeRun().size() > 0) {
    Status st = SetUpResume(run, req.getResumeRun().cStr(), req.getResumeStep());
    if (!st.ok()) {
      c_.outbox.Send(identity, schema::MakeErrorReply(rid, st));
      return;
    }
  }
  // The run is accepted only once its record is durable: a submit that cannot be journaled (a
  // full disk) is refused, never a run that a restart would forget.
  if (Status st = c_.journal.Persist(run); !st.ok()) {
    c_.outbox.Send(identity,
                   schema::MakeErrorReply(rid, Status(st.code(), "the run was not submitted: " + st.message())));
    return;
  }
  RunEntry& stored = c_.runs[run.id] = std::move(run);
  if (stored.spec.is_patch()) {
    std::string what;
    for (const auto& site : stored.spec.patch.sites) what += (what.empty() ? "" : ", ") + site;
    std::string layers;
    for (int64_t l : stored.spec.patch.layers) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
    c_.AddEvent(stored, EventKind::kSubmitted,
                "run " + stored.id + " submitted: the loss of " + std::to_string(stored.extract.total_rows) +
                    " token rows with " + what + " of layer(s) " + layers + " replaced (" +
                    std::string(Name(stored.spec.patch.ablation)) + " ablation), in " +
                    std::to_string(stored.extract.total_chunks) + " chunks on " +
                    std::to_string(stored.spec.parallel.dp) + " worker(s)");
  } else if (stored.spec.is_extract()) {
    c_.AddEvent(stored, EventKind::kSubmitted,
                "run " + stored.id + " submitted: capture " + std::to_string(stored.extract.total_rows) +
                    " token rows of " + std::to_string(stored.spec.extract.layers.size()) + " layer(s) in " +
                    std::to_string(stored.extract.total_chunks) + " chunks on " +
                    std::to_string(stored.spec.parallel.dp) + " worker(s)");
  } else {
    // An auto-planned run's mesh is chosen when it starts (the `planned` event says what): until
    // then its parallel fields hold placeholders, so they are not printed as if decided.
    const ParallelSpec& p = stored.spec.parallel;
    std::string automatic;
    for (const std::string& field : p.automatic) automatic += (automatic.empty() ? "" : ", ") + field;
    const bool fixed_mesh = p.mesh_fixed();
    const std::string mesh = !fixed_mesh
                                 ? ", mesh planned when it starts (auto: " + automatic + ")"
                                 : " on " + std::to_string(p.workers()) + " worker(s) (dp=" + std::to_string(p.dp) +
                                       " pp=" + std::to_string(p.pp) + " tp=" + std::to_string(p.tp) + ")" +
                                       (p.planned() ? "" : "; " + automatic + " planned when it starts");
    c_.AddEvent(stored, EventKind::kSubmitted,
                "run " + stored.id + " submitted: " + std::to_string(stored.spec.train.steps) + " steps" + mesh +
                    (stored.resume_run.empty()
                         ? std::string()
                         : ", resuming from " + stored.resume_run + " at step " + std::to_string(stored.resume_step)));
  }
  c_.Persist(stored);
  schema::EnvelopeBuilder reply(rid);
  reply.root().initSubmitted().setRunId(stored.id);
  c_.outbox.Send(identity, reply.Serialize());
  c_.Schedule();
}

// A run that starts from `source`'s checkpoint at `step` (0 = its latest): same model, any
// mesh. It takes over the source's losses up to that step.
Status RpcHandlers::SetUpResume(RunEntry& run, const std::string& source_id, int64_t step) {
  auto source = c_.runs.find(source_id);
  if (source == c_.runs.end()) return NotFound("--resume: no run '" + source_id + "'; `strata status` lists the runs");
  const RunSpec& from = source->second.spec;
  if (from.is_extract()) return InvalidArgument("--resume: run " + source_id + " is a capture and has no checkpoints");
  const ModelSpec &a = from.model, &b = run.spec.model;
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"layers", {a.layers, b.layers}},       {"hidden", {a.hidden, b.hidden}}, {"heads", {a.heads, b.heads}},
      {"kv_heads", {a.kv_heads, b.kv_heads}}, {"ffn", {a.ffn, b.ffn}},          {"vocab", {a.vocab, b.vocab}},
      {"sequence", {a.sequence, b.sequence}}};
  if (a.family != b.family) {
    return InvalidArgument("--resume: model.family = \"" + std::string(Name(b.family)) + "\" but run " + source_id +
                           " trained \"" + std::string(Name(a.family)) + "\"");
  }
  for (const auto& [field, values] : fields) {
    if (values.first != values.second) {
      return InvalidArgument("--resume: model." + std::string(field) + " = " + std::to_string(values.second) +
                             " but run " + source_id + " trained model." + field + " = " +
                             std::to_string(values.first) +
                             "; a checkpoint resumes only the same model (the mesh may differ)");
    }
  }
  // A LoRA checkpoint is adapters (and their moments) only: it resumes only a LoRA run of the same
  // adapters, over the same base.
  const LoraSpec &la = from.lora, &lb = run.spec.lora;
  if (la.enabled != lb.enabled) {
    return InvalidArgument("--resume: run " + source_id +
                           (la.enabled ? " trained LoRA adapters (its checkpoints hold them, not the "
                                         "base); resume it with the same [lora] table"
                                       : " trained every weight (its checkpoints hold no adapters); "
                                         "start LoRA from its export: model.init_from = an `strata "
                                         "export` of it, and no --resume"));
  }
  if (la.enabled) {
    if (la.rank != lb.rank || la.target_modules != lb.target_modules) {
      return InvalidArgument("--resume: lora.rank / lora.target_modules differ from run " + source_id + "'s (rank " +
                             std::to_string(la.rank) + "): its checkpoint's adapters have other shapes");
    }
    const std::string& trained = source->second.base_identity;
    if (!trained.empty() && trained != run.base_identity) {
      auto base = [](const RunSpec& s) {
        return s.model.init_from.empty() ? "drawn from train.seed = " + std::to_string(s.train.seed)
                                         : "model.init_from = \"" + s.model.init_from + "\"";
      };
      return InvalidArgument("--resume: run " + source_id + "'s adapters were trained over the base " + base(from) +
                             " (" + trained + "), but this spec's base is " + base(run.spec) + " (" +
                             (run.base_identity.empty() ? std::string("unknown") : run.base_identity) +
                             "); a LoRA checkpoint resumes only onto its own base");
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto list, c_.journal.store().ScanMetadata(keys::CheckpointPrefix(source_id)));
  std::string steps;
  int64_t chosen = 0;
  for (auto& [key, value] : list) {
    auto manifest = schema::DecodedRecord<CheckpointManifest>::Decode(value);
    if (!manifest.ok()) continue;
    const int64_t s = manifest->root().getStep();
    steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    if (s == step || (step == 0 && !c_.journal.Unreadable(source_id, s)))
      chosen = s;  // in step order: 0 ends on the latest readable
  }
  if (step != 0 && chosen == step) {
    if (const std::string why = c_.journal.UnreadableWhy(source_id, step); !why.empty()) {
      const int64_t older = c_.journal.LastCheckpointStep(source_id, step);
      return InvalidArgument(
          "--resume " + source_id + "@" + std::to_string(step) + ": that checkpoint is unreadable (" + why + "); " +
          (older > 0 ? "resume from " + source_id + "@" + std::to_string(older) + ", the newest readable one before it"
                     : std::string("no older checkpoint is readable")));
    }
  }
  if (chosen == 0) {
    return InvalidArgument(
        "--resume: run " + source_id + " has no complete checkpoint" +
        (step ? " at step " + std::to_string(step) : std::string()) +
        (steps.empty() ? std::string("; set train.checkpoint_every in its spec") : "; complete ones: " + steps));
  }
  if (chosen >= run.spec.train.steps) {
    return InvalidArgument("--resume: train.steps = " + std::to_string(run.spec.train.steps) +
                           " leaves nothing to train after step " + std::to_string(chosen) + "; raise train.steps");
  }
  run.resume_run = source_id;
  run.resume_step = chosen;
  run.resume_step_asked = step != 0;
  run.step = chosen;
  run.losses.assign(source->second.losses.begin(),
                    source->second.losses.begin() + std::min<size_t>(chosen, source->second.losses.size()));
  // The history is the new run's too (persisted like its own steps, so a restart keeps it).
  STRATA_ASSIGN_OR_RETURN(auto history, c_.journal.store().ScanMetadata(keys::LossPrefix(source_id)));
  for (auto& [key, value] : history) {
    auto report = schema::DecodedRecord<StepReport>::Decode(value);
    if (!report.ok() || report->root().getStep() > chosen) continue;
    STRATA_RETURN_IF_ERROR(c_.journal.store().PutMetadata(keys::Loss(run.id, report->root().getStep()), value, false));
  }
  return Status::Ok();
}

std::string RpcHandlers::NewRunId(const std::string& name) {
  std::string id;
  do {
    id = name + "-" + std::to_string(c_.clock.UnixMs() % 100000000) + "-" + std::to_string(c_.rng() % 1000);
  } while (c_.runs.count(id));
  return id;
}

void RpcHandlers::HandleCancelRun(const std::string& identity, uint64_t rid, RunRef::Reader req) {
  auto it = c_.runs.find(req.getRunId().cStr());
  if (it == c_.runs.end()) {
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, NotFound(UnknownRun(req.getRunId().cStr()))));
    return;
  }
  RunEntry& run = it->second;
  if (run.terminal()) {
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, InvalidArgument("run " + run.id + " already " +
                                                                         schema::RunStateName(run.state()))));
    return;
  }
  for (auto& id : run.workers) {
    auto w = c_.workers.all().find(id);
    if (w != c_.workers.all().end() && w->second.state != WorkerState::LOST)
      c_.SendCancel(w->second, run.id, "cancelled by user");
  }
  run.message = "cancelled by user";
  c_.AddEvent(run, EventKind::kCancelled, "cancelled by user at step " + std::to_string(run.step));
  c_.ReleaseWorkers(run);
  c_.Transition(run, Phase::kCancelled);
  Ack(identity, rid);
  c_.Schedule();
}

void RpcHandlers::HandleActivationsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req) {
  const std::string id = req.getRunId().cStr();
  const RunEntry* found = RunOrReplyNotFound(identity, rid, id);
  if (!found) return;
  const RunEntry& run = *found;
  if (!run.spec.is_extract()) {
    c_.outbox.Send(identity,
                   schema::MakeErrorReply(rid, InvalidArgument("run " + id +
                                                               " is a training run; activations are stored by "
                                                               "runs of kind = \"extract\"")));
    return;
  }
  schema::EnvelopeBuilder reply(rid);
  auto r = reply.root().initActivationsReply();
  r.setRunId(run.id);
  r.setState(run.state());
  auto layers = r.initLayers(run.spec.extract.layers.size());
  for (size_t i = 0; i < run.spec.extract.layers.size(); ++i)
    layers.set(i, static_cast<uint32_t>(run.spec.extract.layers[i]));
  auto sites = r.initSites(run.spec.extract.sites.size());
  for (size_t i = 0; i < run.spec.extract.sites.size(); ++i) sites.set(i, run.spec.extract.sites[i]);
  switch (run.spec.extract.dtype) {
    case StoredDType::kFp32:
      r.setDtype(::DType::F32);
      break;
    case StoredDType::kBf16:
      r.setDtype(::DType::BF16);
      break;
    case StoredDType::kFp16:
      r.setDtype(::DType::F16);
      break;
  }
  r.setHidden(static_cast<uint64_t>(run.spec.model.hidden));
  auto shapes = r.initRowShapes(run.spec.extract.sites.size());
  for (size_t i = 0; i < run.spec.extract.sites.size(); ++i) {
    const std::vector<int64_t> shape = ExtractSiteRowShape(run.spec, run.spec.extract.sites[i]);
    auto dims = shapes.init(i, shape.size());
    for (size_t d = 0; d < shape.size(); ++d) dims.set(d, shape[d]);
  }
  r.setSequence(static_cast<uint64_t>(run.spec.model.sequence));
  r.setTotalRows(run.extract.total_rows);
  auto chunks = r.initChunks(run.extract.stored.size());
  size_t i = 0;
  for (const auto& [chunk, bytes] : run.extract.stored) {
    auto loc = schema::DecodedRecord<ChunkLocation>::Decode(AsBytes(bytes));
    if (!loc.ok()) continue;
    chunks.setWithCaveats(i, loc->root());
    // A worker that re-registered may serve from a new address: give the live one.
    auto w = c_.workers.all().find(loc->root().getWorker().cStr());
    if (w != c_.workers.all().end() && !w->second.serve_address.empty())
      chunks[i].setServeAddress(w->second.serve_address);
    ++i;
  }
  c_.outbox.Send(identity, reply.Serialize());
}

// ---------------------------------------------------------------- queries
void RpcHandlers::HandleStatusRequest(const std::string& identity, uint64_t rid, StatusRequest::Reader req) {
  const std::string only = req.getRunId().cStr();
  if (!only.empty() && !c_.runs.count(only)) {
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, NotFound(UnknownRun(only))));
    return;
  }
  std::vector<const RunEntry*> list;
  for (auto& [id, run] : c_.runs) {
    if (only.empty() || id == only) list.push_back(&run);
  }
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->created_ms < b->created_ms; });
  schema::EnvelopeBuilder reply(rid);
  auto runs = reply.root().initStatusReply().initRuns(list.size());
  const bool last_only = req.getLastLossOnly();
  for (size_t i = 0; i < list.size(); ++i) {
    Journal::FillRunRecord(*list[i], runs[i], /*with_losses=*/!last_only);
    if (last_only && !list[i]->losses.empty()) runs[i].initLosses(1).set(0, list[i]->losses.back());
  }
  c_.outbox.Send(identity, reply.Serialize());
}

void RpcHandlers::HandleWorkersRequest(const std::string& identity, uint64_t rid) {
  schema::EnvelopeBuilder reply(rid);
  auto list = reply.root().initWorkersReply().initWorkers(c_.workers.all().size());
  size_t i = 0;
  const int64_t now = c_.clock.SteadyMs();
  for (auto& [id, w] : c_.workers.all()) {
    auto b = list[i++];
    b.setWorkerId(w.id);
    b.setName(w.id);
    b.setHost(w.host);
    b.setPid(w.pid);
    b.setState(w.state);
    schema::WriteMemoryStats(w.memory, b.initMemory());
    b.setStorePath(w.store_path);
    b.setDataAddress(w.data_address);
    b.setServeAddress(w.serve_address);
    b.setCurrentRun(w.current_run);
    b.setLastHeartbeatMsAgo(now - w.last_heartbeat_ms);
  }
  c_.outbox.Send(identity, reply.Serialize());
}

void RpcHandlers::HandleEventsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req) {
  ReplyWithRunRecords<Event>(
      identity, rid, req.getRunId().cStr(), keys::EventPrefix(req.getRunId().cStr()),
      [](schema::EnvelopeBuilder& reply, size_t n) { return reply.root().initEventsReply().initEvents(n); });
}

void RpcHandlers::HandleCheckpointsRequest(const std::string& identity, uint64_t rid, RunRef::Reader req) {
  const std::string id = req.getRunId().cStr();
  ReplyWithRunRecords<CheckpointManifest>(
      identity, rid, id, keys::CheckpointPrefix(id),
      [&](schema::EnvelopeBuilder& reply, size_t n) { return reply.root().initCheckpointsReply().initCheckpoints(n); },
      [&](schema::EnvelopeBuilder& reply) {
        auto checkpoints = reply.root().getCheckpointsReply();
        auto list = checkpoints.getCheckpoints();
        auto why = checkpoints.initUnreadable(list.size());
        for (unsigned i = 0; i < list.size(); ++i) why.set(i, c_.journal.UnreadableWhy(id, list[i].getStep()));
      });
}

// Answers with every persisted record of type T under `prefix` (one run's), in key order.
template <typename T, typename InitList>
void RpcHandlers::ReplyWithRunRecords(const std::string& identity, uint64_t rid, const std::string& id,
                                      const std::string& prefix, InitList init_list,
                                      const std::function<void(schema::EnvelopeBuilder&)>& finish) {
  if (!RunOrReplyNotFound(identity, rid, id)) return;
  auto records = c_.journal.store().ScanMetadata(prefix);
  if (!records.ok()) {
    c_.outbox.Send(identity, schema::MakeErrorReply(rid, records.status()));
    return;
  }
  schema::EnvelopeBuilder reply(rid);
  auto list = init_list(reply, records->size());
  for (size_t i = 0; i < records->size(); ++i) {
    auto record = schema::DecodedRecord<T>::Decode((*records)[i].second);
    if (record.ok()) list.setWithCaveats(i, record->root());
  }
  if (finish) finish(reply);
  c_.outbox.Send(identity, reply.Serialize());
}

void RpcHandlers::HandleShutdown(const std::string& identity, uint64_t rid) {
  STRATA_LOG(kInfo) << "shutdown requested: stopping workers";
  for (auto& [id, w] : c_.workers.all()) {
    if (w.state == WorkerState::LOST) continue;
    schema::EnvelopeBuilder msg;
    msg.root().setShutdown();
    c_.outbox.Send(w.identity, msg.Serialize());
  }
  Ack(identity, rid);
  on_shutdown_();
}

// The run `id`, or null after answering the request with NotFound.
RunEntry* RpcHandlers::RunOrReplyNotFound(const std::string& identity, uint64_t rid, const std::string& id) {
  auto it = c_.runs.find(id);
  if (it != c_.runs.end()) return &it->second;
  c_.outbox.Send(identity, schema::MakeErrorReply(rid, NotFound(UnknownRun(id))));
  return nullptr;
}

std::string RpcHandlers::UnknownRun(const std::string& id) {
  return "no run '" + id + "'; `strata status` lists the runs";
}

void RpcHandlers::Ack(const std::string& identity, uint64_t rid) {
  schema::EnvelopeBuilder reply(rid);
  reply.root().setAck();
  c_.outbox.Send(identity, reply.Serialize());
}

}  // namespace strata::coordinator
