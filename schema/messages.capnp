@0x8065d47c33bc003c;
# Every message between Strata processes is one Envelope. Bulk tensor bytes never travel inside
# a message: they go as extra ZeroMQ frames beside it (worker data plane).
#
# Compatibility: `version` must equal kProtocolVersion (schema/envelope.h); a receiver answers a
# mismatch with an Error and otherwise ignores the message.

using StoreSchema = import "store.capnp";
using Spec = import "spec.capnp";

struct Envelope {
  version @0 :UInt16;
  requestId @1 :UInt64;      # echoed in the reply, so a client can match answers to questions
  union {
    error @2 :Error;
    ack @3 :Void;
    # worker -> coordinator
    registerWorker @4 :RegisterWorker;
    heartbeat @5 :Heartbeat;
    taskEvent @6 :TaskEvent;
    # coordinator -> worker
    registered @7 :Registered;
    assignTask @8 :AssignTask;
    cancelTask @9 :CancelTask;
    shutdown @10 :Void;        # also client -> coordinator: stop the cluster
    # client -> coordinator, and replies
    submitRun @11 :SubmitRun;
    submitted @12 :Submitted;
    statusRequest @13 :StatusRequest;
    statusReply @14 :StatusReply;
    workersRequest @15 :Void;
    workersReply @16 :WorkersReply;
    eventsRequest @17 :RunRef;
    eventsReply @18 :EventsReply;
    cancelRun @19 :RunRef;
    checkpointsRequest @20 :RunRef;
    checkpointsReply @21 :CheckpointsReply;
    # activation capture: client -> coordinator (index), client -> worker store server (bytes)
    activationsRequest @22 :RunRef;
    activationsReply @23 :ActivationsReply;
    readActivation @24 :ReadActivation;
    activationData @25 :ActivationData;   # followed by one frame of raw bytes
    # Checkpoints across hosts: a worker's store server answers piece reads (a resume on another
    # host, a replica being made); the coordinator has a shard copied to a store on another host.
    readCheckpointPiece @26 :ReadCheckpointPiece;
    checkpointPieceData @27 :ActivationData;  # followed by one frame of raw bytes
    replicateShard @28 :ReplicateShard;       # coordinator -> worker
    shardReplicated @29 :ShardReplicated;     # worker -> coordinator
    deleteCheckpoint @30 :DeleteCheckpoint;   # coordinator -> worker: retention
    # `strata logs` / `strata metrics`: bytes of a run's per-rank log or metrics file
    runFileRequest @31 :RunFileRequest;
    runFileReply @32 :RunFileReply;
  }
}

# Retention (train.keep_checkpoints): the coordinator no longer lists this checkpoint; the worker
# deletes its shard (or copy) stored under (keyRun, step). Resent at registration until the
# worker's store no longer holds it.
struct DeleteCheckpoint {
  keyRun @0 :Text;
  step @1 :Int64;
}

struct Error {
  code @0 :Text;       # StatusCodeName: "InvalidArgument", "NotFound", ...
  message @1 :Text;    # written for the user: what is wrong and what to do
}

struct MemoryStats {
  device @0 :Text;           # "cpu" or "cuda:N"
  totalBytes @1 :UInt64;     # CPU: cgroup limit or MemTotal; GPU: device memory
  freeBytes @2 :UInt64;
  allocatedBytes @3 :UInt64; # CPU: resident set size; GPU: allocator's allocated bytes
  reservedBytes @4 :UInt64;
  peakBytes @5 :UInt64;
  hostTotalBytes @6 :UInt64; # the worker's host memory (for optimizer offload); 0: not reported
  hostFreeBytes @7 :UInt64;
  # The disk of the worker's shard store (MemorySnapshot); 0: not reported.
  storeTotalBytes @8 :UInt64;
  storeFreeBytes @9 :UInt64;   # what writes may still use: free space less the store's reserve
  storeFsId @10 :UInt64;       # statvfs f_fsid: stores of one host with the same id share a disk
}

struct RegisterWorker {
  name @0 :Text;             # stable across restarts, e.g. "worker-0"
  host @1 :Text;
  pid @2 :UInt32;
  memory @3 :MemoryStats;
  storePath @4 :Text;        # the worker's shard store
  dataAddress @5 :Text;      # where peers reach its data-plane socket
  currentRun @6 :Text;       # non-empty when it re-registers while running a task
  currentStep @7 :Int64;
  serveAddress @8 :Text;     # its store server (activation reads); empty if it serves none
  # Every committed checkpoint its store holds (keyRun, step), so the coordinator can mark the
  # checkpoints whose shard it no longer holds (a salvaged or replaced store) unreadable.
  storedCheckpoints @9 :List(StoredCheckpoint);
  storedCheckpointsKnown @10 :Bool;  # false: the store could not list them (nothing is reconciled)
}

struct StoredCheckpoint {
  keyRun @0 :Text;
  step @1 :Int64;
}

struct Registered {
  workerId @0 :Text;
  heartbeatIntervalMs @1 :UInt32;
}

struct Heartbeat {
  workerId @0 :Text;
  memory @1 :MemoryStats;
  currentRun @2 :Text;
  currentStep @3 :Int64;
}

struct AssignTask {
  runId @0 :Text;
  spec @1 :Spec.RunSpec;    # the validated run spec with the plan in `parallel` (data paths absolute)
  rank @2 :UInt32;
  worldSize @3 :UInt32;
  peerDataAddresses @4 :List(Text);  # by rank
  taskToken @5 :UInt64;     # distinguishes this task's data-plane traffic from stale traffic
  chunks @6 :List(UInt64);  # extract runs: the chunks this worker must capture (ascending)
  resumeFrom @7 :CheckpointManifest;  # train runs: start from this checkpoint (any mesh); unset = fresh
}

struct CancelTask {
  runId @0 :Text;
  reason @1 :Text;
  # > 0: before stopping, a train rank whose state is exactly this step (no partial update; the
  # run stops to replay the next step under a new plan) saves it as a checkpoint shard and reports
  # it, so the replay needs no older checkpoint.
  snapshotStep @2 :Int64;
}

struct TaskEvent {
  runId @0 :Text;
  rank @1 :UInt32;
  union {
    started @2 :Void;
    step @3 :StepReport;
    checkpointSaved @4 :CheckpointShard;
    finished @5 :Void;
    failed @6 :Text;        # why
    chunkStored @7 :ChunkStored;
    notice @8 :Notice;      # something the run's journal should say (e.g. an OOM handled)
    checkpointUnreadable @9 :CheckpointUnreadable;  # resume found a damaged or missing piece
    outOfMemory @11 :OutOfMemory;  # a step ran out of memory; the task has ended
    stalled @12 :Stalled;          # a peer did not arrive in time; the task has ended
  }
  taskToken @10 :UInt64;    # the AssignTask's token: reports of an earlier attempt are told apart
}

# The hang watchdog: this rank waited past its deadline for `missingRank` (a transfer or the
# task's start-up never came), so that rank is treated as lost. An NCCL collective that times out
# cannot say who did not arrive (rankKnown = false): the coordinator then blames the ranks that
# did not report a stall of their own within its stall window.
struct Stalled {
  missingRank @0 :UInt32;
  detail @1 :Text;
  rankKnown @2 :Bool = true;
}

# A train rank ran out of memory (device allocator, or the OS limit of a CPU worker). No rank
# applied the failed step's update: the optimizer update starts only after a world all-reduce
# that a failed rank never joins.
struct OutOfMemory {
  step @0 :Int64;           # the step that failed (1-based); 0 = while loading the model
  microBatch @1 :Int64;     # sequences per forward when it failed
  intactStep @2 :Int64;     # the step whose whole state this rank still holds (-1: torn)
  detail @3 :Text;          # the allocator's message
  freeBytes @4 :UInt64;     # the device after the failure
  totalBytes @5 :UInt64;
}

# A rank could not read the checkpoint it was told to resume from (a record fails its checksum,
# is truncated or missing): the coordinator falls back to the next older complete checkpoint.
struct CheckpointUnreadable {
  sourceRun @0 :Text;
  step @1 :Int64;
  why @2 :Text;
}

# An extract chunk whose records (every asked layer and site) are durable in the worker's store.
struct ChunkStored {
  chunk @0 :UInt64;
  rowBegin @1 :UInt64;      # token rows [rowBegin, rowBegin + rowCount)
  rowCount @2 :UInt64;
  bytes @3 :UInt64;         # activation bytes of the chunk, all layers and sites
  computed @4 :Bool;        # false: it was already in the store (a resumed task skipped it)
}

struct Notice {
  kind @0 :Text;            # event kind, e.g. "oom"
  message @1 :Text;
}

struct StepReport {
  step @0 :Int64;           # 1-based: the step just completed
  loss @1 :Float64;         # mean over the global batch
  tokensPerSecond @2 :Float64;
  # The reporting rank's measured peak memory in this step (worker/device_memory.h): during the
  # forward/backward schedule, and during the optimizer update.
  schedulePeakBytes @3 :UInt64;
  updatePeakBytes @4 :UInt64;
  gradNorm @5 :Float64;     # global L2 norm of the step's gradient, before clipping
}

struct CheckpointShard {
  step @0 :Int64;
  storePath @1 :Text;
  tensors @2 :List(StoreSchema.CheckpointManifestRecord.Entry);
  # Set by the coordinator: the host of storePath, and copies of the whole shard in stores on
  # other hosts (a cluster that spans hosts commits a checkpoint only once every shard has one).
  host @3 :Text;
  copies @4 :List(ShardCopy);
  # AssignTask only: the store server of storePath's worker, while that worker is alive.
  serveAddress @5 :Text;
  # The key of the shard's pieces in that store when not the run's id: a shard cut unlike one an
  # earlier attempt of the run left at this step there (the worker picks it; see Trainer).
  keyRun @6 :Text;
}

# A copy of a checkpoint shard: its pieces under (keyRun, step) in the store at storePath.
struct ShardCopy {
  storePath @0 :Text;
  keyRun @1 :Text;
  host @2 :Text;
  serveAddress @3 :Text;    # AssignTask only, as in CheckpointShard
}

# Read one committed checkpoint piece: answered with checkpointPieceData + the bytes frame.
struct ReadCheckpointPiece {
  keyRun @0 :Text;
  step @1 :Int64;
  name @2 :Text;
}

# Copy a rank's shard of checkpoint (runId, step) from the store server at source into this
# worker's store, under (keyRun, step), and commit it there.
struct ReplicateShard {
  runId @0 :Text;
  step @1 :Int64;
  rank @2 :UInt32;
  source @3 :Text;          # the origin worker's store server
  sourceKeyRun @4 :Text;
  keyRun @5 :Text;
  tensors @6 :List(StoreSchema.CheckpointManifestRecord.Entry);
}

struct ShardReplicated {
  runId @0 :Text;
  step @1 :Int64;
  rank @2 :UInt32;
  storePath @3 :Text;
  keyRun @4 :Text;
  error @5 :Text;           # empty: the copy is committed (durable)
}

struct SubmitRun {
  specToml @0 :Text;
  resumeRun @1 :Text;       # start from a checkpoint of this run (any mesh); empty = fresh
  resumeStep @2 :Int64;     # that checkpoint's step; 0 = the latest complete one
  baseIdentity @3 :Text;    # model::BaseIdentity of the spec's base, as submit computed it
}

struct Submitted {
  runId @0 :Text;
}

struct RunRef {
  runId @0 :Text;
}

struct StatusRequest {
  runId @0 :Text;           # empty: all runs
  # true: each run's losses holds at most its last loss (a listing needs no more; whole histories
  # of hundreds of runs made `strata status` slow). false: every loss, index = step - 1.
  lastLossOnly @1 :Bool;
}

struct StatusReply {
  runs @0 :List(RunRecord);
}

# A run as the coordinator persists it in its metadata store (also sent to clients).
struct RunRecord {
  runId @0 :Text;
  name @1 :Text;
  specToml @2 :Text;
  state @3 :RunState;
  createdUnixMs @4 :Int64;
  updatedUnixMs @5 :Int64;
  totalSteps @6 :Int64;
  step @7 :Int64;            # last completed step
  losses @8 :List(Float64);  # per step, index = step - 1
  workers @9 :List(Text);    # worker ids by rank, while assigned
  message @10 :Text;         # why it failed / was cancelled
  worldSize @11 :UInt32;
  tokensPerSecond @12 :Float64;
  kind @13 :Text;            # "train" or "extract"; for extract, step/totalSteps count chunks
  resumeRun @14 :Text;       # started from this run's checkpoint at resumeStep (empty: fresh)
  resumeStep @15 :Int64;
  memory @16 :List(RankMemory);  # per rank, in rank order, while the run has a mesh
  taskToken @17 :UInt64;     # the running attempt's AssignTask token (reports of others are stale)
  handled @18 :List(HandledCount);  # failures the run got through, by event kind (e.g. "oom")
  growBackToDp @19 :Int64;   # the dp it ran with before a lost worker made it smaller (0: never shrunk)
  spec @20 :Spec.RunSpec;    # the validated spec (specToml is its display copy; records written
                             # before this field hold only the TOML: ReadRunRecordSpec)
  baseIdentity @21 :Text;    # the weights it started from (SubmitRun.baseIdentity; "" if not known)
}

struct HandledCount {
  kind @0 :Text;
  count @1 :UInt32;
}

# The planner's estimate for one rank against what the rank measured (the highest step peak
# reported so far), so every run checks the estimator.
struct RankMemory {
  worker @0 :Text;
  estimateBytes @1 :UInt64;      # tensor memory: weights + gradients + optimizer + activations + buffers
  workspaceBytes @2 :UInt64;     # the estimate's allowance for the CUDA context and allocator slack
  measuredPeakBytes @3 :UInt64;  # the highest StepReport peak of this rank (0 = none yet)
}

enum RunState { pending @0; running @1; finished @2; failed @3; cancelled @4; }

struct WorkersReply {
  workers @0 :List(WorkerInfo);
}

struct WorkerInfo {
  workerId @0 :Text;
  name @1 :Text;
  host @2 :Text;
  pid @3 :UInt32;
  state @4 :WorkerState;
  memory @5 :MemoryStats;
  storePath @6 :Text;
  dataAddress @7 :Text;
  currentRun @8 :Text;
  lastHeartbeatMsAgo @9 :Int64;
  serveAddress @10 :Text;
}

enum WorkerState { idle @0; busy @1; lost @2; }

struct Event {
  unixMs @0 :Int64;
  kind @1 :Text;      # "submitted", "assigned", "checkpoint", "finished", "worker-lost", ...
  message @2 :Text;
}

struct EventsReply {
  events @0 :List(Event);
}

# A checkpoint is complete when every rank's shard is durable; the coordinator then commits
# this manifest in its metadata store.
struct CheckpointManifest {
  runId @0 :Text;
  step @1 :Int64;
  committedUnixMs @2 :Int64;
  shards @3 :List(CheckpointShard);
}

struct CheckpointsReply {
  checkpoints @0 :List(CheckpointManifest);
  # Per checkpoint, in the same order: "" when complete, else why it cannot be resumed from (a
  # rank could not read it, or a worker's store no longer holds a shard of it).
  unreadable @1 :List(Text);
}

# Where a stored extract chunk lives (the coordinator's index, persisted under "act/").
struct ChunkLocation {
  chunk @0 :UInt64;
  rowBegin @1 :UInt64;
  rowCount @2 :UInt64;
  bytes @3 :UInt64;
  worker @4 :Text;
  storePath @5 :Text;
  serveAddress @6 :Text;
}

struct ActivationsReply {
  runId @0 :Text;
  state @1 :RunState;
  layers @2 :List(UInt32);
  sites @3 :List(Text);
  dtype @4 :StoreSchema.DType;
  hidden @5 :UInt64;
  totalRows @6 :UInt64;     # rows the run will have when complete
  chunks @7 :List(ChunkLocation);   # stored so far, ascending by rowBegin
  # Per site, in the order of sites: the shape of one stored row (ExtractSiteRowShape), so readers
  # never assume [hidden]. Empty from a coordinator older than it: readers then take [hidden].
  rowShapes @8 :List(List(Int64));
  sequence @9 :UInt64;      # tokens per sequence (model.sequence): row r is position r % sequence
}

# One stored record: (run, layer, site) rows [rowBegin, rowBegin + rowCount of its chunk).
struct ReadActivation {
  runId @0 :Text;
  layer @1 :UInt32;
  site @2 :Text;
  rowBegin @3 :UInt64;
}

struct ActivationData {
  dtype @0 :StoreSchema.DType;
  shape @1 :List(Int64);
  checksum @2 :UInt64;      # XXH3-64 of the bytes frame
}

# A piece of one of a run's files, read from `offset`: a rank's log (the worker's
# STORE/logs/<hex run id>/rank-R.log; the coordinator reads it by path, so the worker's store must
# be on the coordinator's host) or the run's metrics (STATE_DIR/metrics/<run id>.jsonl, one JSON
# object per step).
struct RunFileRequest {
  runId @0 :Text;
  kind @1 :Kind;
  rank @2 :UInt32;
  offset @3 :UInt64;
  enum Kind {
    log @0;
    metrics @1;
  }
}

struct RunFileReply {
  data @0 :Data;        # at most 1 MiB from the offset asked for
  size @1 :UInt64;      # the file's size when read
  terminal @2 :Bool;    # the run has ended: the file will not grow
  path @3 :Text;        # where the file is (on the host of the worker or coordinator)
}
