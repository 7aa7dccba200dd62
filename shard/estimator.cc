// The memory and step-time model. All sizes are bytes on one worker (one GPU) for one plan.
//
// Parameters (exact, matching worker/gpt2.cc and worker/llama.cc), h = hidden, f = ffn, V = vocab,
// S = model.sequence, d = h / heads, k = kv_heads:
//   GPT-2 layer  = 2*(2h) LayerNorms + (3h*h + 3h) qkv + (h*h + h) proj + (h*f + f) + (f*h + h)
//   GPT-2 model  = V*h tied embedding/head + S*h positions + layers * layer + 2h final LayerNorm
//   Llama layer  = 2h RMSNorms + h*(heads*d) q + 2*h*(k*d) k,v + (heads*d)*h o + 3*h*f gate/up/down
//   Llama model  = V*h embedding + layers * layer + h final RMSNorm + V*h untied lm_head
//
// Model state per parameter (ZeRO, Rajbhandari et al. 2020): weights W, gradients G, optimizer O
// bytes; ZeRO stage 1 divides O by dp, stage 2 also G, stage 3 also W. See BytesPerParam.
// LoRA (JobSpec::lora) freezes the base and trains adapters: shard/lora_memory.cc says what changes.
//
// Activations per layer per micro-batch: the tensors worker/'s blocks save for backward
// (family_gpt2.cc, family_llama.cc, with the fused norms, GELU, SwiGLU and RoPE of fused_ops.h
// and SDPA attention), s = sequence, b = micro-batch, t = tp, e = 2 bytes (bf16) or 4 (fp32):
//   s*b*h * (8 + e * (2 + (2q + kv + mlp + p + n) / t))
// 8: the fp32 residual stream, saved by each of the two norms (they take it in fp32; 8 / t under
// sequence parallelism, whose norms see the rank's tokens); 2: the attention's and the MLP's
// inputs (the two norms' outputs; whole on every tensor-parallel rank, gathered ones under
// sequence parallelism);
// q = heads * head_dim / h for q and again for attention's output, kv = 2 * kv_heads * head_dim / h
// for k and v (SDPA saves q, k, v and its output); mlp the wide tensors: GELU's up projection
// and activation (2f/h), SwiGLU's gate, up and their product (3f/h); p = heads * s / h, the
// softmax probabilities of unfused attention (0 with SDPA); n = q + kv / 2, the inputs qwen3's
// per-head q/k norms save (olmo2's fp32 whole-projection norms: 8 / e times that; 0 for the
// other families). GPT-2 saves 36 bytes per element in
// bf16 (Korthikanti et al. 2022 count 34 for the unfused 16-bit block). Full recompute keeps each
// layer's fp32 input (4 bytes per element) plus one layer's activations while it is recomputed;
// that layer's backward also casts its weights to bf16 again and makes their fp32 gradients.
// Pipeline 1F1B: stage i holds min(pp - i, micro-batches) micro-batches in flight. The last
// stage also holds the fused loss (see Calibration).
//
// Step time, per worker with its own share of layers and tokens (the slowest sets the pace):
//   compute = matmuls + elementwise + optimizer
//     matmuls      c * params * tokens / (peak_flops * efficiency), c = 6 (forward 2 + backward
//                  4) or 8 with recompute (one more forward); split by tp (the head's too
//                  where the vocabulary is: shard/layout.h's VocabParallel)
//     elementwise  norms, activations, residual adds, casts and attention: a time per element of
//                  tokens x hidden per layer (x4/3 with recompute), NOT split by tp (its norms
//                  and residual stream are whole on every rank; under sequence parallelism the
//                  norms' and adds' share, 0.2, is split); the loss's per logit of the rank's
//                  vocabulary rows
//     optimizer    a time per parameter of the optimizer range (this rank's ZeRO shard), and
//                  1.0 ms a step whatever its size (norm, scalars, launches: fitted on 2x H200, 2026-11-29)
//   both at the peak of an H100/H200 (989 TFLOP/s) and scaled with peak_flops. Measured on H200s
//   (docs/history/benchmarks-sessions.md, 2026-11-28: "ZeRO-3 streamed in bf16 beside the compute"
//   and "weight gradients written in fp32 by their matmul"): matmul kernels at 0.71-0.79 of peak;
//   the rest of a step, less the loss (2.3 ps a logit: GPT-2's CrossEntropyRows, the second), 115 ps
//   (GPT-2 124M, the second's profile, after the weight gradients moved into their matmuls), 84 ps
//   with the loss (Llama 886M, the second) and 191 ps (Llama 8 x 4096, the first's older code) per
//   element of tokens x hidden per layer (115 taken: the first's 165 and 7.8 ps a logit
//   predicted GPT-2's step 22% slow and Llama 886M's 12%, and ranked GPT-2's pp=2 over its
//   ZeRO-2); the fused AdamW 3.9 ps per parameter
//   (Llama; GPT-2's small units 9.2).
// Communication (not overlapped, so the prediction is conservative; but ZeRO-3 without
// recompute, whose collectives run beside the matmuls, counts what the matmuls do not hide and
// a fixed 32 us (kGatherSeconds) for each unit's forward gather and reduce-scatter per micro-batch). ZeRO 0-2's
// gradient sums now start in the last micro-batch's backward (worker/train/optimizer.h); how much of
// them that hides was not measured yet (no two-GPU machine when they were added, 2026-11-29), so
// none is credited;
// nor is tensor parallel's overlap (parallel.tp_comm_overlap, worker/train/tensor_parallel.h: the
// backward's collectives beside the weight gradients and the own tokens' dx, the forward's
// gathers beside the own tokens' matmul and its sums in chunks beside the next chunk's). On 2x
// H200 (2026-11-29, bench/results/mesh-ranking-2026-11-29-s26-h200x2.json) the wide Llama's
// tp=2 ran 1.2% faster with it than without, and 13% faster than this model predicts either
// way; crediting tp alone would rank it over ZeRO-2, which measured 1.3% faster, so the model
// is left as it is until a profile of tp=2 says where its
// time goes. The overlap adds nothing to the memory peak: the forward's
// chunks hold what the whole matmul's output and its sum held, and the put-off gradients hold the
// column-parallel matmuls' dy (Llama's
// dgate and dup, [tokens, ffn / tp] each) until f's backward, beside the input gradients' sum,
// while the MLP's activation backward just before held five such tensors (gate, up, their
// gradients, the activation's); attention's likewise:

// ring all-reduce of gradients 2(n-1)/n * bytes / bandwidth over dp (ZeRO-1 adds the all-gather
// of the updated fp32 shards, half as many bytes; ZeRO-2's reduce-scatter and gather together
// move one all-reduce's; x1.5 for ZeRO-3 with recompute, which all-gathers fp32 weights again in
// backward; x1 without, gathering bf16, less the backward gathers of the layers kept gathered), 4
// activation all-reduces per layer per micro-batch over tp, in bf16 on a bf16 GPU run (sequence
// parallel: 4 all-gathers and 4 reduce-scatters, the same bytes) (6 with recompute; vocab-parallel adds
// the lookup's on the first stage and the loss's dx on the last), one activation
// send and one gradient send per micro-batch between pipeline stages, and offload's
// gradient/weight copies over the host link. Pipeline bubble: a fraction (pp-1)/(m+pp-1) of the
// step, i.e. compute * (pp-1)/m.
//
// Calibration (what worker/trainer really keeps, fitted to measured allocator peaks; the fit and
// its residuals are in docs/history/benchmarks-sessions.md, "Estimate vs. measured peak"). Per rank:
//   peak = state + working copies + a * activations + recompute's layer + loss + buffers + d
//   (a and recompute's layer differ by block kind: below, and "Refit for gated-MLP blocks")
//   state         16 bytes per parameter, sharded by ZeRO: fp32 weights 4, fp32 gradient buffer 4
//                 (kept whole under ZeRO-2: the reduce-scatter runs in place), AdamW m and v 8
//                 (adamw8bit: 2.03). See BytesPerParam.
//   working       2 bytes per parameter of the units with a bf16 working copy (CUDA bf16 runs:
//                 every unit but ZeRO-3 shards, recomputed blocks and a one-stage tied embedding;
//                 worker/train/stage_model.cc), kept for the whole run.
//   activations   the layers' saved tensors above, for the micro-batches in flight.
//   recompute's   a recomputed layer's weights cast to bf16 and their fp32 gradients: 6 bytes
//   layer         per parameter of one layer.
//   loss          on the last stage (worker/nn/fused_loss.cc), whole on every tensor-parallel rank:
//                 c bytes per logit of one chunk (rows x vocab padded to 64, at most 256 MiB of
//                 bf16 logits; fp32 in fp32 runs and on CPU workers); per element of the
//                 [vocab padded, h] head weight, dW in fp32 and a chunk's partial dW in the
//                 loss's dtype (6 bytes in bf16), plus the weight padded to 64 rows
//                 (4 bytes from the fp32 master, 2 from a working copy) and, read from the fp32
//                 master, its bf16 cast (2) and under ZeRO-3 the gathered fp32 unit (4); per
//                 element of s*b*h, the final norm's fp32 input (4), its bf16 output (2) and the
//                 loss's gradient for it (2).
//   buffers       pp: a received activation and a received gradient (fp32; 1/tp of the tokens
//                 under sequence parallelism); tp: an all-reduce's copy of an activation, or an
//                 all-gather's whole one (bf16 on a bf16 GPU run, else fp32); ZeRO-3: a layer gathered whole (fp32);
//                 without recompute, the layers kept gathered for the backward (parallel.keep_gathered): each in the
//                 compute dtype, per micro-batch in flight (not calibrated: counted as the bytes they are).
//   d             cuBLAS workspaces and what else the caching allocator holds outside the step.
// Least squares on the relative error over all 44 rank-runs measured on NVIDIA H200s, bf16,
// sequence 1024, global batch 8 (2026-11-28; bench/results/calibration-2026-11-28-*.jsonl): one
// GPU (GPT-2 124M and 355M at micro-batch 1, 2, 4, 8; GPT-2 774M and Llama 886M at 2 and 8;
// recompute on and off) and two GPUs (GPT-2 124M at micro-batch 2: dp=2 ZeRO 0-3, pp=2 with the
// planner's balanced stages, tp=2; recompute on and off, tp=2 off only) gave
//   a = 1.153  (the blocks keep 15% more than the tensors counted above; not broken down),
//   c = 1.76 bytes per logit (the chunk's bf16 logits, 2),
//   d = 60 MiB.
// Every two-GPU rank-run is within 4.9% (the worst: dp=2 ZeRO-3, +4.8%); nine of the 24 one-GPU
// ones are not: -7.9% to +5.9% (the worst: GPT-2 355M at micro-batch 2 with recompute). The two
// grids disagree by more than what a rank holds explains: GPT-2 124M at micro-batch 2 peaks 3.8%
// (recompute off) and 7.1% (on) higher on one GPU than as a dp=2 ZeRO-0 rank, which holds the
// same state, working copies and micro-batch (it runs 2 micro-batches a step, not 4; the pp=2
// and tp=2 ranks run 4 and sit below the one-GPU runs too). And the one-GPU residuals grow with
// the order the runs were made in, about 48 MiB a run (correlation 0.69), where the two-GPU
// grid's ZeRO-1 and ZeRO-2 runs, which hold the same bytes, measured the same peak to the byte.
// docs/benchmarks.md has the numbers.
// Refit for gated-MLP blocks (Llama, Mistral, Qwen2, Gemma; 2026-11-28, one H200,
// one `strata up` per run: bench/results/calibration-2026-11-28-llama-widths-h200.jsonl): the
// Llama 886M and Llama 3 8B's width at 4 and 8 layers, micro-batch 2 and 8, recompute on and
// off. Differencing 8 and 4 layers of the 8B width gives 1.27 GB a layer at micro-batch 8:
// 37.9 bytes per token x hidden, the tensors counted above with nothing more (their fused
// RMSNorm, SwiGLU and RoPE kernels save no extra copies), so a = 1.0 for them; and their
// recomputed runs hold no extra layer (with it they were over by a constant 1.4 GB at the 8B
// width). With that every one of the 12 runs is within 2.4%, and so are issue #23's largest
// models (7.24-12.7B; shard/planner_test.cc). GPT-2's blocks keep a = 1.153 and the term.
// Replaced: the fit of 2026-11-26 (46 rank-runs), made before the trainer dropped its fp32
// optimizer masks, fused its loss and norms and kept bf16 working copies: it charged 11.4 bytes
// per logit, autocast's bf16 weight casts per micro-batch in flight, an unexplained Llama term
// and 2 bytes per parameter less at ZeRO-0 with dp > 1.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "model/parameters.h"
#include "shard/estimator_constants.h"
#include "shard/internal.h"
#include "shard/layout.h"

namespace strata::shard {
using namespace estimator_constants;  // NOLINT: this file is their other half
namespace internal {

StageCache::StageCache(const Problem& problem, const std::vector<WorkerView>& workers, bool every_rank_is_first)
    : problem_(problem), workers_(workers), every_rank_is_first_(every_rank_is_first) {
  // Nodes as numbers: Geometry compares them for every member of every group of every mesh.
  std::map<std::string, int> ids;
  for (const WorkerView& w : workers_)
    node_of_.push_back(ids.emplace(w.node, static_cast<int>(ids.size())).first->second);
}

const std::vector<LayerRange>& StageCache::For(int64_t pp) { return problem_.splits->For(problem_, pp); }

const MeshGeometry& StageCache::Geometry(int64_t dp, int64_t pp, int64_t tp) {
  const auto key = std::make_tuple(dp, pp, tp);
  auto it = geometry_.find(key);
  if (it != geometry_.end()) return it->second;
  auto rank = [&](int64_t stage, int64_t d, int64_t r) { return every_rank_is_first_ ? 0 : (stage * dp + d) * tp + r; };
  const double inf = std::numeric_limits<double>::infinity();
  // A group's slowest member's link; groups spanning nodes go over the inter-node network.
  double bandwidth = inf;
  int node = -1;
  auto start_group = [&] { bandwidth = inf, node = -1; };
  auto add_to_group = [&](int64_t i) {
    const WorkerView& w = workers_[static_cast<size_t>(i)];
    bandwidth = std::min(bandwidth, w.bandwidth);
    const int n = node_of_[static_cast<size_t>(i)];
    if (node < 0)
      node = n;
    else if (n != node)
      bandwidth = std::min(bandwidth, problem_.options.inter_node_bandwidth);
  };
  MeshGeometry g;
  g.min_budget.assign(pp, std::numeric_limits<int64_t>::max());
  g.min_peak_flops.assign(pp, inf);
  g.dp_bandwidth.assign(pp, inf);
  g.tp_bandwidth.assign(pp, inf);
  g.pp_bandwidth.assign(pp, inf);
  if (every_rank_is_first_) {  // one worker stands for every rank: no group spans nodes
    const WorkerView& w = workers_.front();
    g.min_budget.assign(
        pp, static_cast<int64_t>(static_cast<double>(w.free_bytes) * (1.0 - problem_.options.safety_margin)));
    g.min_peak_flops.assign(pp, w.peak_flops);
    if (dp > 1) g.dp_bandwidth.assign(pp, w.bandwidth);
    if (tp > 1) g.tp_bandwidth.assign(pp, w.bandwidth);
    g.pp_bandwidth.assign(pp, w.bandwidth);
    g.pp_bandwidth.back() = inf;
    return geometry_.emplace(key, std::move(g)).first->second;
  }
  for (int64_t k = 0; k < pp; ++k) {
    for (int64_t d = 0; d < dp; ++d) {
      for (int64_t r = 0; r < tp; ++r) {
        const WorkerView& w = workers_[static_cast<size_t>(rank(k, d, r))];
        g.min_budget[k] = std::min(g.min_budget[k], static_cast<int64_t>(static_cast<double>(w.free_bytes) *
                                                                         (1.0 - problem_.options.safety_margin)));
        g.min_peak_flops[k] = std::min(g.min_peak_flops[k], w.peak_flops);
      }
    }
    for (int64_t r = 0; r < tp && dp > 1; ++r) {
      start_group();
      for (int64_t d = 0; d < dp; ++d) add_to_group(rank(k, d, r));
      g.dp_bandwidth[k] = std::min(g.dp_bandwidth[k], bandwidth);
    }
    for (int64_t d = 0; d < dp && tp > 1; ++d) {
      start_group();
      for (int64_t r = 0; r < tp; ++r) add_to_group(rank(k, d, r));
      g.tp_bandwidth[k] = std::min(g.tp_bandwidth[k], bandwidth);
    }
    for (int64_t d = 0; d < dp && k + 1 < pp; ++d) {
      start_group();
      add_to_group(rank(k, d, 0));
      add_to_group(rank(k + 1, d, 0));
      g.pp_bandwidth[k] = std::min(g.pp_bandwidth[k], bandwidth);
    }
  }
  return geometry_.emplace(key, std::move(g)).first->second;
}

const UnitParams& StageCache::Units(int64_t pp, int64_t tp) {
  auto it = units_.find({pp, tp});
  if (it == units_.end()) it = units_.emplace(std::make_pair(pp, tp), CountUnits(problem_.model, pp, tp)).first;
  return it->second;
}

Candidate CandidateOf(const Plan& plan) {
  return {plan.dp, plan.pp, plan.tp, plan.zero, plan.micro_batch, plan.recompute, plan.offload};
}

namespace {

// Evaluate with `keep` layers of each ZeRO-3 stage (at most its own) kept gathered from the
// forward to the backward.
Plan EvaluateKeeping(const Problem& problem, const Candidate& c, StageCache& cache, bool with_workers, Fill* fill,
                     int64_t keep) {
  const ModelSpec& model = problem.model;
  const PlannerOptions& opt = problem.options;
  const bool fp32_acts = problem.layout == StateLayout::kFp32;
  const int64_t s = problem.job.sequence, b = c.micro_batch;
  const int64_t local_batch = problem.job.global_batch / c.dp;
  const int64_t m = local_batch / b;  // micro-batches per step per dp rank
  // Token-sized products in double (see ToBytes): s * b * hidden alone reaches 2^60 within bounds.
  const double sbh = static_cast<double>(s) * static_cast<double>(b) * static_cast<double>(model.hidden);
  // bf16 on a GPU: working copies and a bf16 loss; on CPU workers the loss computes in fp32.
  const bool bf16_cuda = problem.layout == StateLayout::kBf16Autocast && problem.cuda;
  // Sequence parallel (shard/layout.h): the residual stream between the split matmuls is 1/tp of
  // the tokens a rank, and so is what a pipeline stage sends.
  const bool sequence_parallel = SequenceParallel(problem.job.sequence_parallel, s, c.tp);
  const double held_tokens = sequence_parallel ? 1.0 / static_cast<double>(c.tp) : 1.0;
  // What crosses a pipeline boundary: the rank's residual stream, sent in fp32 whatever the
  // precision (worker/train/stage_model.cc SendTensor). A tensor-parallel collective moves an
  // activation as computed: bf16 on a bf16 GPU run (stage_model.cc AllReduced), else fp32.
  const double boundary_bytes = sbh * kResidualBytes * held_tokens;
  const double tp_activation_bytes = sbh * (bf16_cuda ? 2.0 : kResidualBytes);
  const double loss_bytes = bf16_cuda ? 2.0 : 4.0;
  const StateBytesPerParam per_param = BytesPerParam(problem.layout, problem.job.optimizer == Optimizer::kAdamW8bit);
  // LoRA (shard/lora_memory.cc): the base frozen in the compute dtype; only the adapters train.
  const bool lora = problem.job.lora.enabled;
  const UnitParams& u = cache.Units(c.pp, c.tp);
  // The head's rows on each rank (vocab-parallel, shard/layout.h: the vocabulary split over tp).
  const bool vocab_parallel = VocabParallel(model, c.tp);
  const int64_t vocab_rows = vocab_parallel ? model.vocab / c.tp : model.vocab;
  const double layer_per_rank = static_cast<double>(u.layer_sharded) / c.tp + u.layer_replicated;
  const double embedding_per_rank = static_cast<double>(u.embedding_sharded) / c.tp + u.embedding_replicated;
  const double head_per_rank = static_cast<double>(u.head_sharded) / c.tp + u.head_replicated;
  const MeshGeometry& geometry = cache.Geometry(c.dp, c.pp, c.tp);
  // One layer's saved tensors, the same on every stage (computed once: it copies the model spec).
  const double layer_activations =
      static_cast<double>(LayerActivationBytes(model, s, b, c.tp, fp32_acts, opt.fused_attention, sequence_parallel)) +
      LoraLayerActivationBytes(problem, s, b, fp32_acts);

  Plan plan;
  plan.dp = c.dp, plan.pp = c.pp, plan.tp = c.tp, plan.zero = c.zero, plan.micro_batch = b;
  plan.gradient_accumulation = m, plan.recompute = c.recompute, plan.offload = c.offload;
  plan.stages = cache.For(c.pp);
  Fill local_fill;
  local_fill.keep_room = std::numeric_limits<int64_t>::max();
  bool any_streamed = false;

  double compute = 0, dp_comm = 0, tp_comm = 0, pp_comm = 0, offload_comm = 0;
  std::vector<double> host_per_stage(static_cast<size_t>(c.pp), 0.0);  // offload: each worker's host bytes
  for (int64_t k = 0; k < c.pp; ++k) {
    const bool first = k == 0, last = k == c.pp - 1, recompute = c.recompute[static_cast<size_t>(k)];
    const int64_t layers = plan.stages[static_cast<size_t>(k)].size();
    double params = layers * layer_per_rank;
    if (first) params += embedding_per_rank;
    if (last) params += head_per_rank;
    const double flops_params = layers * layer_per_rank + (last ? static_cast<double>(vocab_rows * model.hidden) : 0);
    // LoRA: the adapters are what trains (the gradients', the optimizer's and dp's range); a frozen
    // matmul's backward makes dx only (2 FLOPs a parameter and token fewer).
    const double adapters = static_cast<double>(layers) * static_cast<double>(problem.lora.layer);
    const double trainable = lora ? adapters : params;
    const double flops =
        ((recompute ? 8.0 : 6.0) - (lora ? 2.0 : 0.0)) * flops_params * static_cast<double>(local_batch * s) +
        (recompute ? 8.0 : 6.0) * adapters * static_cast<double>(local_batch * s);

    const bool eight_bit = problem.job.optimizer == Optimizer::kAdamW8bit;
    MemoryEstimate mem = lora ? LoraModelStateBytes(ToBytes(params), ToBytes(adapters), bf16_cuda ? 2 : 4, c.zero, c.dp,
                                                    c.offload, eight_bit)
                              : ModelStateBytes(ToBytes(params), problem.layout, c.zero, c.dp, c.offload, eight_bit);
    // The bf16 working copies the matmuls read (worker/train/stage_model.h, ParamUnit::working): every
    // unit but recomputed blocks and a one-stage tied embedding, whose head reads the fp32 master.
    // The first stage's embedding keeps one though its lookup reads fp32. ZeRO-3 shards without
    // recompute keep a copy of the shard (what is gathered); with recompute none.
    const bool one_stage_tie = model.tied() && c.pp == 1;
    const bool streamed_zero3 = c.zero >= 3 && !recompute;  // gathered in bf16, kept for the backward
    // Layers kept gathered from the forward to the backward: each holds its gathered weights (in
    // the compute dtype) for every micro-batch in flight, and is gathered once per micro-batch, not twice.
    // A stage keeps its last `keep` layers; its last call keeps its gather anyway, which on a
    // stage without the head is its last layer, so there one of them costs and saves nothing.
    const int64_t kept_layers = std::min(keep, layers);
    const int64_t kept = !streamed_zero3 ? 0 : last ? kept_layers : std::max<int64_t>(kept_layers - 1, 0);
    const double gathered_bytes = bf16_cuda ? 2.0 : 4.0;
    // offload = "optimizer+params": streamed ZeRO-3 from shards in host memory (no working copy).
    const bool host_streamed = c.offload == Offload::kOptimizerAndParams;
    if (streamed_zero3 && bf16_cuda && !host_streamed) {
      mem.weights += ToBytes(kWorkingCopyBytes * params / c.dp);
    } else if (bf16_cuda && c.zero < 3 && !lora) {  // LoRA's base is the bf16 copy; its adapters' are in mem
      double working = recompute ? 0 : layers * layer_per_rank;
      if (first) working += embedding_per_rank - (one_stage_tie ? static_cast<double>(vocab_rows * model.hidden) : 0);
      if (last) working += head_per_rank;
      mem.weights += ToBytes(kWorkingCopyBytes * working);
    }
    const int64_t in_flight = c.pp > 1 ? std::min(c.pp - k, m) : 1;
    // The layers' saved tensors for the micro-batches in flight (with recompute, their fp32
    // inputs and one layer recomputed), scaled as measured; a recomputed layer's backward also
    // casts its weights to bf16 again and makes their fp32 gradients.
    const double activation_scale = model.gated_mlp() ? kGatedActivationScale : kActivationScale;
    double acts = activation_scale * StageActivationBytesOf(layer_activations, model, s, b, c.tp, layers, in_flight,
                                                            recompute, sequence_parallel);
    // (Measured on GPT-2-style blocks; the gated-MLP blocks' peaks hold none of it: the Llama grid
    // at two widths, bench/results/calibration-2026-11-28-llama-widths-h200.jsonl.)
    if (recompute && !model.gated_mlp() && !lora) acts += ((fp32_acts ? 0.0 : 2.0) + 4.0) * layer_per_rank;
    if (last) {
      // The fused loss (worker/nn/fused_loss.cc) over this rank's rows of the head (the whole
      // vocabulary, or its 1/tp slice when vocab-parallel): one chunk of logits, the head-sized
      // buffers it holds at its peak, and per token the final norm's fp32 input and its output,
      // and the loss's gradient for that output (dx).
      const double vocab = static_cast<double>((vocab_rows + 63) / 64 * 64);
      const double rows = static_cast<double>(s) * static_cast<double>(b);
      const double fit = std::floor(kLossChunkBytes / (vocab * loss_bytes));  // LinearCrossEntropyChunkRows
      const double chunk = fit >= rows ? rows : std::max(64.0, std::floor(fit / 64) * 64);
      acts += kBytesPerChunkLogit * chunk * vocab;
      // The head reads the fp32 weight, or a bf16 copy (its working copy, or ZeRO-3's gather).
      const bool master = !bf16_cuda || (c.zero >= 3 ? recompute : one_stage_tie);
      double per_weight = 4 + loss_bytes;  // dW in fp32, a chunk's partial dW
      // The gathered unit. Without recompute its fp32 gradient (ZeRO-3's, before the reduce-scatter)
      // comes after the loss's chunk buffers are gone: the measured peak (GPT-2 124M, dp=2, the
      // calibration point) holds no more of it.
      if (c.zero >= 3) per_weight += recompute ? 4 : loss_bytes;
      if (vocab_rows % 64 != 0) per_weight += master ? 4 : 2;                 // the weight padded to 64 rows
      if (master && loss_bytes == 2) per_weight += 2;                         // its cast to bf16
      if (lora) per_weight = vocab_rows % 64 != 0 ? (bf16_cuda ? 2 : 4) : 0;  // frozen: no dW, no cast
      acts += per_weight * vocab * static_cast<double>(model.hidden);
      acts += (kResidualBytes * held_tokens + 2 * loss_bytes) * sbh;
    }
    mem.activations = ToBytes(acts + static_cast<double>(kStepTemporaryBytes));
    if (lora && problem.lora.nf4_matrix_params > 0) Nf4Base(problem.lora, layers, bf16_cuda ? 2 : 4, &mem);
    const double gradient_bytes = trainable * per_param.gradients;
    double buffers = 0;                            // gradients are all-reduced in place, one unit at a time
    if (c.tp > 1) buffers += tp_activation_bytes;  // an all-reduce's copy, or an all-gather's whole activation
    if (c.pp > 1) buffers += 2 * boundary_bytes;   // a received activation and a received gradient, fp32
    if (streamed_zero3) {
      // At the backward's start: the last layer gathered again and the one before it on its way
      // (in the compute dtype), and the last layer's fp32 gradient before its reduce-scatter.
      buffers += (2 * gathered_bytes + 4) * layer_per_rank;
      buffers += static_cast<double>(kept * in_flight) * gathered_bytes * layer_per_rank;
      // Host-streamed: a bf16 gather lands in fp32 first (the shard's upload), then is cast.
      if (host_streamed && bf16_cuda) buffers += 4.0 * layer_per_rank / c.dp;
    } else if (c.zero >= 3 && c.dp > 1) {
      buffers += 4 * layer_per_rank;  // a layer gathered whole, fp32
    }
    mem.communication_buffers = ToBytes(buffers);
    mem.workspace = opt.workspace_bytes;
    if (c.offload != Offload::kNone) {
      // The offloaded optimizer's host memory (worker/train/optimizer.h): over its optimizer range m and
      // v (or their 8-bit codes and scales), the parameters' fp32 master copy and gradient buffer.
      // Host-streamed, the master copy is the shard itself, and the gradients' sums take two
      // staging buffers of the longest unit's shard (worker/train/host_copies.h, HostGradientSums).
      double host = trainable * (per_param.optimizer + 8.0) / (c.zero >= 1 ? c.dp : 1);
      if (host_streamed) {
        double longest = layers > 0 ? layer_per_rank : 0;
        if (first) longest = std::max(longest, embedding_per_rank);
        if (last) longest = std::max(longest, head_per_rank);
        host += 2.0 * 4.0 * longest / c.dp;
      }
      mem.host = ToBytes(host);
      host_per_stage[static_cast<size_t>(k)] = static_cast<double>(mem.host);
    }

    const double total = static_cast<double>(mem.total());
    local_fill.worst =
        std::max(local_fill.worst, total / static_cast<double>(std::max<int64_t>(geometry.min_budget[k], 1)));
    local_fill.stage_total.push_back(total);
    any_streamed |= streamed_zero3;
    if (streamed_zero3 && layers > (last ? 0 : 1)) {
      // More kept layers take at most half of what the budget leaves (the rest stays headroom).
      const double room = 0.5 * (static_cast<double>(geometry.min_budget[k]) - total);
      const double per_layer = static_cast<double>(in_flight) * gathered_bytes * layer_per_rank;
      const double more = room <= 0 ? 0.0 : std::floor(room / std::max(per_layer, 1.0));
      // As a keep_gathered value: the layers kept beyond the last call's, and that one.
      const int64_t keep_value = kept + static_cast<int64_t>(std::min(more, 1e15)) + (last ? 0 : 1);
      local_fill.keep_room = std::min(local_fill.keep_room, keep_value);
    }
    local_fill.largest_total = std::max(local_fill.largest_total, total);
    const double slowdown = kReferencePeakFlops / geometry.min_peak_flops[k];
    const double matmul_s = flops / (geometry.min_peak_flops[k] * opt.compute_efficiency);
    const double tokens = static_cast<double>(local_batch * s);
    // Sequence parallel: the norms' and residual adds' share runs on the rank's tokens.
    const double split_share = sequence_parallel ? kSequenceParallelShare * (1.0 - held_tokens) : 0.0;
    double elementwise_s = (recompute ? 4.0 / 3.0 : 1.0) * kElementwiseSecondsPerElement * slowdown * tokens *
                           static_cast<double>(model.hidden) * static_cast<double>(layers) * (1.0 - split_share);
    if (last) elementwise_s += kLossSecondsPerLogit * slowdown * tokens * static_cast<double>(vocab_rows);
    const double optimizer_s = kOptimizerSecondsPerParam * slowdown * trainable / (c.zero >= 1 ? c.dp : 1);
    compute = std::max(compute, matmul_s + elementwise_s + optimizer_s);
    if (with_workers) {
      for (int64_t d = 0; d < c.dp; ++d) {
        for (int64_t r = 0; r < c.tp; ++r) {
          const WorkerView& w = cache.Worker((k * c.dp + d) * c.tp + r);
          const int64_t budget = static_cast<int64_t>(static_cast<double>(w.free_bytes) * (1.0 - opt.safety_margin));
          plan.workers.push_back({w.name, k, d, r, mem, budget});
        }
      }
    }
    // Collectives: each group's time at its slowest link; the slowest group sets the pace.
    if (c.dp > 1) {
      const double t = RingAllReduceSeconds(gradient_bytes, c.dp, geometry.dp_bandwidth[k]);
      // ZeRO-0 all-reduces the gradients. ZeRO-1 too, then all-gathers the updated fp32 shards
      // (half an all-reduce's bytes more: worker/train/optimizer.cc); ZeRO-2 reduce-scatters instead,
      // so its reduce-scatter and gather move what one all-reduce does (measured on 4 H200s,
      // Llama 886M: ZeRO-2 6.7% faster than ZeRO-1; on 2, GPT-2 124M: 2.5%). ZeRO-3 gathers
      // twice and reduce-scatters: in fp32 with recompute (1.5 all-reduces' bytes), gathers in
      // bf16 without (one). Counted whole, as every collective here (planner.h).
      double exposed = c.zero == 1 ? t + RingAllReduceSeconds(trainable * 4.0, c.dp, geometry.dp_bandwidth[k]) / 2 : t;
      if (c.zero >= 3 && recompute) exposed = 1.5 * t;
      if (streamed_zero3) {
        // Beside the matmuls, but each unit's two gathers and reduce-scatter per micro-batch cost
        // a fixed time the compute does not hide (GPT-2 124M's 2 ms layers: measured 91% of 2x
        // one GPU on 2x H200, 2026-11-29 (bench/results/mesh-ranking-2026-11-29-h200x2.json), 76-81%
        // on 2026-11-28 (bench/results/mesh-ranking-h200.json); Llama 8 x 4096's 24 ms layers: 96%).
        // A kept layer saves its backward's gather: 2 (bf16) or 4 (fp32) bytes a parameter of the
        // 8 an all-reduce's time counts (the backward gathers' fixed cost is hidden: above).
        const double units = static_cast<double>(layers) + (first ? 1 : 0) + (last ? 1 : 0);
        const double saved = static_cast<double>(kept) * layer_per_rank / std::max(params, 1.0) * gathered_bytes / 8.0;
        // On CPU workers the gathers run in line with the compute (one stream): nothing hides them.
        // (problem.cuda is the cluster's: a cluster with any GPU worker is estimated as GPUs.)
        const double hidden_by = problem.cuda ? matmul_s : 0.0;
        exposed = std::max(0.0, ((bf16_cuda ? 1.0 : 1.5) - saved) * t - hidden_by) +
                  2.0 * units * static_cast<double>(m) * kGatherSeconds;
      }
      dp_comm = std::max(dp_comm, exposed);
    }
    if (c.tp > 1) {
      // Sequence parallel's all-gather and reduce-scatter move one all-reduce's bytes between them.
      const double all_reduce = RingAllReduceSeconds(tp_activation_bytes, c.tp, geometry.tp_bandwidth[k]);
      const double fp32_all_reduce = RingAllReduceSeconds(sbh * kResidualBytes, c.tp, geometry.tp_bandwidth[k]);
      // Beside the blocks', in all-reduces' worth: the head's input - vocab-parallel, its dx summed
      // (sequence parallel: gathered, and reduce-scattered back); else under sequence parallelism
      // gathered - in the activations' dtype; the first stage's fp32 embedding - vocab-parallel, the
      // lookup's sum; sequence parallel, its gradient gathered back.
      const double head = last ? (vocab_parallel ? 1.0 : sequence_parallel ? 0.5 : 0.0) : 0.0;
      const double embedding = first ? (vocab_parallel ? 1.0 : 0.0) + (sequence_parallel ? 0.5 : 0.0) : 0.0;
      tp_comm =
          std::max(tp_comm, (((recompute ? 6.0 : 4.0) * layers + head) * all_reduce + embedding * fp32_all_reduce) * m);
    }
    if (!last) pp_comm = std::max(pp_comm, 2.0 * m * boundary_bytes / geometry.pp_bandwidth[k]);
    if (c.offload == Offload::kOptimizerAndParams) {
      // Every micro-batch uploads each unit twice (its forward's gather and its backward's) and
      // downloads its gradient, in fp32, beside the matmuls; the host sums the gradients (12 bytes
      // a parameter for each micro-batch after the first), takes their norm (4) and updates (28),
      // which the next forward hides as far as its matmuls go (worker/train/optimizer.h).
      const double shard_params = params / c.dp, mb = static_cast<double>(m);
      const double uploads =
          mb * 4.0 * (2.0 * shard_params - static_cast<double>(kept) * layer_per_rank / c.dp) / opt.host_bandwidth;
      const double host_work = (28.0 + 4.0 + 12.0 * (mb - 1)) * shard_params / opt.host_adamw_bandwidth;
      const double forward = matmul_s / 3.0;
      // One rank streams too: each unit's two gathers and gradient per micro-batch cost a fixed
      // time (counted with the collectives when dp > 1).
      const double units = static_cast<double>(layers) + (first ? 1 : 0) + (last ? 1 : 0);
      const double fixed = c.dp == 1 ? (3.0 * units - static_cast<double>(kept)) * mb * kHostStreamSeconds : 0.0;
      offload_comm =
          std::max(offload_comm, std::max(0.0, uploads - matmul_s) + std::max(0.0, host_work - forward) + fixed);
    } else if (c.offload == Offload::kOptimizer) {
      // fp32 gradients out and fp32 weights back, unit by unit while the host updates the units
      // between (28 bytes a parameter): the slower of the two sets the time. It runs beside the
      // next step's forward (worker/train/optimizer.h), which hides as much of it as the forward takes
      // (its matmuls: a third of the step's without recompute) - but not where ZeRO 1/2 gather
      // the updated shards first.
      const double shard_params = trainable / (c.zero >= 1 ? c.dp : 1);
      const double copies = 2.0 * 4.0 * shard_params / opt.host_bandwidth,
                   update = 28.0 * shard_params / opt.host_adamw_bandwidth;
      const bool beside_forward = !((c.zero == 1 || c.zero == 2) && c.dp > 1);
      const double forward = beside_forward ? 2.0 * flops_params * static_cast<double>(local_batch * s) /
                                                  (geometry.min_peak_flops[k] * opt.compute_efficiency)
                                            : 0.0;
      offload_comm = std::max(offload_comm, std::max(0.0, std::max(copies, update) - forward));
    }
  }
  if (c.offload != Offload::kNone && problem.host_checked) {
    // Each node's host holds the offloaded state of all its workers: within its free memory less
    // the safety margin (every worker of a node reports the same host; the smallest counts).
    std::map<std::string, std::pair<double, double>> nodes;  // node -> (bytes needed, free)
    for (int64_t k = 0; k < c.pp; ++k) {
      const double host = host_per_stage[static_cast<size_t>(k)];
      for (int64_t r = 0; r < c.dp * c.tp; ++r) {
        const WorkerView& w = cache.Worker(k * c.dp * c.tp + r);
        auto& [need, free] = nodes[w.node];
        need += host;
        if (w.host_free_bytes > 0 && (free <= 0 || w.host_free_bytes < free))
          free = static_cast<double>(w.host_free_bytes);
      }
    }
    for (const auto& [node, need_free] : nodes) {
      if (need_free.second <= 0) continue;  // not reported
      const double ratio = need_free.first / (need_free.second * (1.0 - opt.safety_margin));
      if (ratio > local_fill.worst) local_fill.worst = ratio, local_fill.host_limited = true;
    }
  }
  // The step's fixed cost counts once, outside the bubble (which scales the micro-batches' compute).
  plan.step_time.compute_s = compute + kStepSeconds;
  plan.step_time.communication_s = dp_comm + tp_comm + pp_comm + offload_comm;
  plan.step_time.bubble_s = compute * static_cast<double>(c.pp - 1) / static_cast<double>(m);
  // keep_gathered means something only where a stage gathers again (ZeRO-3 without recompute).
  plan.keep_gathered = any_streamed ? keep : 0;
  if (local_fill.keep_room == std::numeric_limits<int64_t>::max())
    local_fill.keep_room = 0;  // no stage could keep more
  if (fill) *fill = local_fill;
  return plan;
}

}  // namespace

Plan Evaluate(const Problem& problem, const Candidate& c, StageCache& cache, bool with_workers, Fill* fill) {
  const std::optional<int64_t> fixed = problem.job.keep_gathered;
  Fill plan_fill;
  Plan plan = EvaluateKeeping(problem, c, cache, with_workers, &plan_fill, fixed.value_or(0));
  // "auto": as many layers as the budget has room for (EvaluateKeeping's keep_room), where the
  // plan fits without any; each stage keeps at most its own layers.
  const int64_t most = std::min(plan_fill.keep_room, problem.model.layers);
  if (!fixed && plan_fill.worst <= 1.0 && most > 0) {
    plan = EvaluateKeeping(problem, c, cache, with_workers, &plan_fill, most);  // and its fill
  }
  if (fill) *fill = plan_fill;
  return plan;
}

double WorstFill(const Plan& plan, double scale, size_t* worst_worker) {
  double worst = 0;
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const WorkerAssignment& w = plan.workers[i];
    const double fill =
        scale * static_cast<double>(w.memory.total()) / static_cast<double>(std::max<int64_t>(w.budget_bytes, 1));
    if (fill > worst) {
      worst = fill;
      if (worst_worker) *worst_worker = i;
    }
  }
  return worst;
}

}  // namespace internal
}  // namespace strata::shard
