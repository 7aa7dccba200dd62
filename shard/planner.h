// The parallel planner: given a model, a job and the cluster's free memory, choose how to shard
// the training step (data / pipeline / tensor parallel degrees, ZeRO stage, micro-batch,
// activation recompute, optimizer offload) and predict its memory per worker and its step time.
// Pure functions: no I/O, no clocks, no LibTorch; the coordinator feeds in what workers report.
//
// Rank layout of a plan over its workers (ordered by node, then name, so tensor-parallel groups
// stay inside a node): rank = (stage * dp + dp_rank) * tp + tp_rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/memory_snapshot.h"
#include "common/status.h"
#include "spec/run_spec.h"

namespace strata::shard {

// Exact trainable parameter count of worker/gpt2.cc or worker/llama.cc for `model`
// (kv_heads 0 -> heads, ffn 0 -> 4 * hidden, as the run spec fills them in).
int64_t ParameterCount(const ModelSpec& model);

// ---- Inputs ------------------------------------------------------------------------------

// Where the optimizer state, and with "+params" the parameters, live ([parallel] offload; the
// run spec's Offload, spec/spec_choices.h, named "none", "optimizer", "optimizer+params"):
// on the device; m, v and the fp32 master in host memory (worker/train/optimizer.h); or the parameters
// too, streamed to the device a layer at a time as ZeRO-3 gathers them (worker/train/stage_model.h:
// ZeRO-3 without recompute). Ordered from the simplest.
using ::strata::Offload;

struct JobSpec {
  int64_t global_batch = 8;                 // sequences per optimizer step, over all data-parallel ranks
  int64_t sequence = 0;                     // tokens per sequence; 0 -> model.sequence
  Precision precision = Precision::kFp32;   // or bf16 (bf16 autocast, fp32 master/grads/moments)
  Optimizer optimizer = Optimizer::kAdamW;  // or adamw8bit: 8-bit blockwise moments (about a quarter of the bytes)
  // The [parallel] fields; unset = "auto", searched.
  std::optional<int64_t> dp, pp, tp, zero, micro_batch;
  std::optional<bool> recompute;
  std::optional<Offload> offload;
  // ZeRO-3 without recompute: layers per stage kept gathered from forward to backward; unset =
  // as many as fit (within half of what the plan leaves of the budget).
  std::optional<int64_t> keep_gathered;
  bool uniform_recompute = false;  // recompute every stage or none (no per-stage choice)
  std::vector<int64_t> stages;     // layers per stage when fixed for pp = stages.size(); else balanced
  bool offload_supported = true;   // false: the executor cannot offload, so neither search nor Replan offers it
  // [parallel] sequence_parallel: under tp, where tp divides the sequence (shard/layout.h SequenceParallel).
  bool sequence_parallel = true;
  // [lora] (lora.enabled): every base parameter frozen in the compute dtype, only the adapters
  // trained (shard/lora_memory.cc prices it). Searched on tp = 1, ZeRO 0-2 and offload "none" or
  // "optimizer" only, what a LoRA run takes (spec/run_spec_lora.cc); other fixed values are refused.
  LoraSpec lora{};
};

struct WorkerView {
  std::string name;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  std::string node;             // workers with the same node share the link below
  std::string link = "nvlink";  // "nvlink" | "pcie" | "tcp"
  double peak_flops = 989e12;   // per second; H100 dense bf16
  double bandwidth = 0;         // bytes/s to peers on the same node; 0 -> typical for `link`
  bool gpu = true;              // false: a CPU worker (no CUDA context or cuBLAS workspace)
  // Free memory of the worker's host (shared by the workers of its node), which an offloaded
  // optimizer's state takes; 0: unknown, not checked.
  int64_t host_free_bytes = 0;
};

struct ClusterView {
  std::vector<WorkerView> workers;
};

// The planner's job for a train run spec: its [parallel] fields fixed where the spec fixes them
// (ParallelSpec::automatic lists the rest), and the search kept to what worker/trainer runs:
// recompute on every stage or none; with [lora], its adapters and the meshes LoRA runs on.
JobSpec JobForRun(const RunSpec& spec);

// A worker as its heartbeats describe it: a GPU on NVLink at H100 bf16 peak, or a CPU worker
// (~100 GFLOP/s, TCP between processes).
WorkerView WorkerFromMemory(std::string name, std::string node, const MemorySnapshot& memory);

struct PlannerOptions {
  double safety_margin = 0.1;   // a plan may use (1 - margin) of each worker's free memory
  bool fused_attention = true;  // flash / SDPA attention: no s x s score matrix is stored
  // Achieved fraction of peak_flops in the matmuls (measured 0.71-0.76 on an H200; the rest of a
  // step is counted apart, shard/estimator.cc "Step time").
  double compute_efficiency = 0.7;
  double inter_node_bandwidth = 12.5e9;  // bytes/s between nodes (100 Gb/s)
  double host_bandwidth = 25e9;          // bytes/s GPU <-> host, for optimizer offload
  // Bytes/s the host AdamW of an offloaded optimizer moves (28 a parameter): kernels_bench
  // measured 116e9 on 16 threads of an H200 host (docs/history/benchmarks-sessions.md, 2026-11-28).
  double host_adamw_bandwidth = 100e9;
  int64_t workspace_bytes = int64_t{1} << 30;  // CUDA context, cuBLAS workspace, fragmentation
  // Used instead when every worker is a CPU worker: allocator arenas and thread-pool buffers (its
  // libraries are already resident, so not in its free memory).
  int64_t cpu_workspace_bytes = int64_t{64} << 20;
};

// ---- Outputs -----------------------------------------------------------------------------

struct MemoryEstimate {
  int64_t weights = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t activations = 0;
  int64_t communication_buffers = 0;
  int64_t workspace = 0;
  int64_t total() const {
    return weights + gradients + optimizer_state + activations + communication_buffers + workspace;
  }
  // Host memory the worker's offloaded optimizer keeps (not in total(), which is the device's).
  int64_t host = 0;
};

struct LayerRange {
  int64_t begin = 0;  // first transformer layer of the stage
  int64_t end = 0;    // one past the last
  int64_t size() const { return end - begin; }
};

struct StepTime {
  double compute_s = 0;
  double communication_s = 0;  // not overlapped with compute: a conservative prediction
  double bubble_s = 0;         // pipeline fill and drain
  double total_s() const { return compute_s + communication_s + bubble_s; }
};

struct WorkerAssignment {
  std::string worker;
  int64_t stage = 0, dp_rank = 0, tp_rank = 0;
  MemoryEstimate memory;
  int64_t budget_bytes = 0;  // free memory less the safety margin
};

struct Plan {
  int64_t dp = 1, pp = 1, tp = 1, zero = 0;
  int64_t micro_batch = 1;                // sequences per forward/backward on one rank
  int64_t gradient_accumulation = 1;      // micro-batches per step per dp rank
  std::vector<bool> recompute;            // per pipeline stage
  Offload offload = Offload::kNone;       // where optimizer state (and parameters) live
  int64_t keep_gathered = 0;              // ZeRO-3 without recompute: layers per stage kept gathered for the backward
  std::vector<LayerRange> stages;         // stage 0 also holds the embedding, the last the head + loss
  std::vector<WorkerAssignment> workers;  // in rank order
  StepTime step_time;
  std::string why;                   // what was chosen, the runner-up and what it lost on
  int64_t candidates_evaluated = 0;  // ChoosePlan: estimates the search made (its cost, bounded per mesh)
};

// Bytes the rank `w` of `plan` writes to its store per checkpoint: its data-parallel share of the
// fp32 weights and both AdamW moments of its stage's tensor-parallel slices, replicated tensors
// written by tensor-parallel rank 0 only and a tied head by the first stage only
// (worker/train/trainer_checkpoint.cc; adamw8bit's moments are stored widened to fp32). A LoRA
// run's checkpoint (lora.enabled) holds its adapters only: the frozen base is not written.
int64_t CheckpointShardBytes(const ModelSpec& model, const Plan& plan, const WorkerAssignment& w,
                             const LoraSpec& lora = {});

Result<Plan> ChoosePlan(const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                        const PlannerOptions& options = {});

// Layers per stage for a `pp`-stage pipeline, balanced as ChoosePlan balances them (by compute and
// parameters, the embedding on the first stage and the head on the last): what a run with a
// fixed pp and no [parallel] stages is given.
Result<std::vector<int64_t>> BalancedStages(const ModelSpec& model, int64_t pp);

// ---- Re-planning after a failure ---------------------------------------------------------

struct ReplanReason {
  enum class Kind { kWorkerLost, kOutOfMemory };
  Kind kind = Kind::kWorkerLost;
  std::string worker;       // the worker that was lost, or that ran out of memory
  int64_t micro_batch = 0;  // out of memory: the micro-batch that failed (0 = the plan's)

  static ReplanReason WorkerLost(std::string w) { return {Kind::kWorkerLost, std::move(w), 0}; }
  static ReplanReason OutOfMemory(std::string w, int64_t mb) { return {Kind::kOutOfMemory, std::move(w), mb}; }
};

struct PlanChange {
  Plan plan;
  int64_t bytes_to_move = 0;  // weights + optimizer state a worker needs but did not hold
  std::string description;    // one line, for the run's event log
};

// The cheapest change that fits `cluster`, in this order of preference: smaller micro-batch
// with more accumulation (same global batch), then recompute, then a higher ZeRO stage or
// offload, then more pipeline stages, then anything else. User-fixed [parallel] fields in `job`
// are not binding here: the run could not continue as they were.
Result<PlanChange> Replan(const Plan& current, const ModelSpec& model, const JobSpec& job, const ClusterView& cluster,
                          const ReplanReason& reason, const PlannerOptions& options = {});

// ---- The estimator's building blocks (exposed so tests and `strata plan` can show the sums) --

// How the trainer keeps model state; bytes per parameter in shard/estimator.cc.
enum class StateLayout {
  kFp32,            // fp32 weights, grads, AdamW m and v
  kBf16Autocast,    // our bf16 run: fp32 master weights/grads/moments + bf16 working copies
  kZeroPaperMixed,  // ZeRO paper: fp16 weights and grads, fp32 master + m + v in the optimizer
};

// Weights, gradients and optimizer state of `params` parameters on one rank of a `dp`-wide
// ZeRO group (stage 1 shards optimizer state, 2 also gradients, 3 also weights); `offload`
// moves optimizer state to host memory, and with the parameters also weights and gradients.
// Other fields are zero.
MemoryEstimate ModelStateBytes(int64_t params, StateLayout layout, int64_t zero, int64_t dp,
                               Offload offload = Offload::kNone, bool eight_bit_optimizer = false);

// LoRA (JobSpec::lora): `frozen_params` of the base held in the compute dtype (`compute_bytes`:
// 2 on a bf16 CUDA run, else 4), never sharded and without gradients or optimizer state, and
// `adapter_params` with ModelStateBytes' state of any unit (ZeRO's shares over `dp`) plus, where
// compute_bytes is 2, a bf16 working copy. Other fields are zero.
MemoryEstimate LoraModelStateBytes(int64_t frozen_params, int64_t adapter_params, int64_t compute_bytes, int64_t zero,
                                   int64_t dp, Offload offload = Offload::kNone, bool eight_bit_optimizer = false);

// Activations one transformer layer stores for backward, one micro-batch, no recompute: the
// tensors worker/'s blocks save (shard/estimator.cc lists them).
// sequence_parallel: the fp32 residual stream the norms save is the rank's 1/tp of the tokens.
int64_t LayerActivationBytes(const ModelSpec& model, int64_t sequence, int64_t micro_batch, int64_t tp,
                             bool fp32_activations, bool fused_attention, bool sequence_parallel = false);

// Activations of `layers` layers with `in_flight` micro-batches held: full, or with full
// recompute only each layer's fp32 input plus one layer being recomputed.
int64_t StageActivationBytes(const ModelSpec& model, int64_t sequence, int64_t micro_batch, int64_t tp,
                             bool fp32_activations, bool fused_attention, int64_t layers, int64_t in_flight,
                             bool recompute, bool sequence_parallel = false);

}  // namespace strata::shard
