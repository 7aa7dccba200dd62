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
//
// Activations per layer per micro-batch (Korthikanti et al. 2022), s = sequence, b = micro-batch,
// a = heads, t = tp, 16-bit activations, sequence parallel off:
//   s*b*h * (10 + (8 + mlp)/t + 5*a*s/(h*t)),  mlp = 16 for GPT-2's 4h GELU MLP
// which is the paper's sbh(34 + 5as/h) at t = 1. The 10 are replicated over tp (LayerNorm
// inputs 4, attention and MLP inputs 2 + 2, dropout masks 1 + 1); 8 are Q, K, V and the
// projection input; mlp are the wide tensors: GELU keeps two of width f (4f/h), SwiGLU four
// (gate, up, silu(gate), product: 8f/h). 5as/h is the s x s score matrix, softmax and dropout
// mask, gone with fused (flash / SDPA) attention. fp32 activations double every term. Full
// recompute keeps only each layer's input (2sbh) plus one layer's activations while it is
// recomputed. Pipeline 1F1B: stage i holds min(pp - i, micro-batches) micro-batches in flight.
// The last stage also holds the logits (see Calibration).
//
// Step time: compute = c * params * tokens / (peak_flops * efficiency), c = 6 (forward 2 +
// backward 4) or 8 with recompute (one more forward); per worker with its own share of layers
// and tokens, and the slowest worker sets the pace. Communication (not overlapped, so the
// prediction is conservative): ring all-reduce of gradients 2(n-1)/n * bytes / bandwidth over dp
// (x1.5 for ZeRO-3, which all-gathers weights again in backward), 4 activation all-reduces per
// layer per micro-batch over tp (6 with recompute), one activation send and one gradient send
// per micro-batch between pipeline stages, and offload's gradient/weight copies over the host
// link. Pipeline bubble: a fraction (pp-1)/(m+pp-1) of the step, i.e. compute * (pp-1)/m.
//
// Calibration (what worker/trainer really keeps, fitted to measured allocator peaks; the fit and
// its residuals are in docs/benchmarks.md, "Estimate vs. measured peak"). 46 rank-runs, bf16,
// sequence 1024 (2026-11-26): GPT-2 124M and 355M on H200 (1 GPU x micro-batch 1-8 x recompute
// on/off; 2 GPUs as dp=2 ZeRO 0-3, pp=2 and tp=2 at micro-batch 2), GPT-2 774M and Llama 886M on
// one H100 (micro-batch 1, 2, 8 x recompute on/off). Least squares (relative) over
//   peak = state + buffers + a * activations + c * logits + d
//          + 2 bytes x the matmul weights of every micro-batch in flight, without recompute
//          + e * s*b*h per Llama layer kept, without recompute
//          - 2 bytes x parameters under ZeRO-0 with dp > 1
// gave a = 1.074 (our unfused blocks keep ~7% more than the paper's sbh(34 + ...)),
// c = 11.4 bytes per logit (bf16 logits, their fp32 copy for the loss, log-softmax, gradient),
// d = 179 MiB (cuBLAS workspaces and step temporaries in the caching allocator),
// e = 13.3 (Llama's unfused RMSNorm keeps its fp32 input and a bf16 normed copy beside the
// linear's input, and RoPE's products; the rest of the 13.3 is not broken down).
// The bf16 weight copies: autocast caches one bf16 cast of every weight for a micro-batch's
// forward, and the matmuls save it for their backward, so without recompute each micro-batch in
// flight keeps a copy of the stage's matmul weights; a recomputed layer casts again, briefly.
// The ZeRO-0 term (taken off the gradients' share) is measured, not explained: dp=2 ZeRO-0
// peaks sit 2 bytes per parameter below dp=1 at the same micro-batch (GPT-2 124M and 355M,
// recompute on and off, 4 points), while ZeRO-1/2 match the model; left out, those points were
// over by 2-8%. Every fitted point is within 3.9% of its measured peak (the worst: dp=2 ZeRO-3).
// Measured afterwards and not fitted (4x H200): 34 rank-runs of GPT-2 774M and Llama 886M on
// dp=2 ZeRO 0-3, pp=2 (balanced stages) and tp=2, and 1 GPU at micro-batch 1 and 4: all within 1.4%.
// The trainer's state is 16 bytes per parameter: fp32 weights 4, fp32 gradient buffer 4 (kept
// whole under ZeRO-2: the reduce-scatter runs in place), AdamW m and v 8 (until 2026-11-28 also
// two fp32 masks over the optimizer range, 8 more: the fits above were made with them, and
// BytesPerParam now leaves them out; weight decay and norm ownership are spans of parameters);
// the logits are not split by tp
// (the embedding and head are replicated over tensor-parallel ranks), and the residual stream
// is fp32, so a recomputed layer keeps a 4-byte input per element.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "model/parameters.h"
#include "shard/internal.h"
#include "shard/layout.h"

namespace strata::shard {
namespace {

ModelSpec Filled(ModelSpec model) {
  if (model.kv_heads == 0) model.kv_heads = model.heads;
  if (model.ffn == 0) model.ffn = 4 * model.hidden;
  return model;
}

// See "Calibration" above.
constexpr double kActivationScale = 1.074;
constexpr double kLogitBytes = 11.4;
constexpr int64_t kStepTemporaryBytes = int64_t{179} << 20;
constexpr double kLlamaLayerExtraPerSbh = 13.3;
constexpr double kAutocastWeightCopyBytes = 2.0;
constexpr double kDataParallelZero0Saving = 2.0;  // bytes per parameter, measured

int64_t ActivationBytesPerElement(bool fp32_activations) { return fp32_activations ? 4 : 2; }

// Every estimate is computed in double (products such as sequence x micro-batch x hidden x layers
// x micro-batches in flight overflow an int64 long before the run spec's bounds) and rounded here,
// clamped to [0, 2^58] bytes (256 PiB): far beyond any device, so a plan at the ceiling never fits,
// and the six parts of MemoryEstimate::total() cannot overflow their int64 sum. A negative or NaN
// input (a caller's bug) counts as 0 rather than wrapping.
constexpr int64_t kCeilingBytes = int64_t{1} << 58;
int64_t ToBytes(double bytes) {
  if (!(bytes > 0)) return 0;
  if (bytes >= static_cast<double>(kCeilingBytes)) return kCeilingBytes;
  return std::llround(bytes);
}

}  // namespace

int64_t ParameterCount(const ModelSpec& spec) {
  internal::UnitParams u = internal::CountUnits(spec, /*pp=*/1);
  return u.embedding_sharded + u.embedding_replicated + Filled(spec).layers * (u.layer_sharded + u.layer_replicated) +
         u.head_sharded + u.head_replicated;
}

MemoryEstimate ModelStateBytes(int64_t params, StateLayout layout, int64_t zero, int64_t dp, bool offload, bool eight_bit_optimizer) {
  const internal::StateBytesPerParam b = internal::BytesPerParam(layout, eight_bit_optimizer);
  const double p = static_cast<double>(params);
  const double weight_share = zero >= 3 ? 1.0 / dp : 1.0;
  // The ZeRO paper frees the gradients a rank does not own; our trainer reduce-scatters in place.
  const double gradient_share = zero >= 3 || (zero == 2 && layout == StateLayout::kZeroPaperMixed) ? 1.0 / dp : 1.0;
  const double optimizer_share = zero >= 1 ? 1.0 / dp : 1.0;
  MemoryEstimate m;
  m.weights = ToBytes(p * (b.weights + b.weight_cache) * weight_share);
  m.gradients = ToBytes(p * b.gradients * gradient_share);
  m.optimizer_state = offload ? 0 : ToBytes(p * b.optimizer * optimizer_share);
  return m;
}

int64_t LayerActivationBytes(const ModelSpec& spec, int64_t sequence, int64_t micro_batch, int64_t tp,
                             bool fp32_activations, bool fused_attention) {
  const ModelSpec model = Filled(spec);
  const double s = sequence, b = micro_batch, h = model.hidden, a = model.heads, t = tp;
  const double wide_tensors = model.gated_mlp() ? 4.0 : 2.0;
  const double mlp = wide_tensors * 2.0 * model.ffn / h;  // 2 bytes per 16-bit element
  const double scores = fused_attention ? 0.0 : 5.0 * a * s / h;
  const double per_sbh = 10.0 + (8.0 + mlp + scores) / t;
  return ToBytes(s * b * h * per_sbh * (fp32_activations ? 2.0 : 1.0));
}

int64_t StageActivationBytes(const ModelSpec& model, int64_t sequence, int64_t micro_batch, int64_t tp,
                             bool fp32_activations, bool fused_attention, int64_t layers, int64_t in_flight,
                             bool recompute) {
  const double full = static_cast<double>(LayerActivationBytes(model, sequence, micro_batch, tp, fp32_activations, fused_attention));
  const double held = static_cast<double>(in_flight) * static_cast<double>(layers);
  if (!recompute) return ToBytes(held * full);
  const double layer_input = static_cast<double>(sequence) * static_cast<double>(micro_batch) *
                             static_cast<double>(model.hidden) * static_cast<double>(ActivationBytesPerElement(fp32_activations));
  return ToBytes(held * layer_input + full);
}

namespace internal {

UnitParams CountUnits(const ModelSpec& spec, int64_t pp) {
  const ModelSpec m = Filled(spec);
  UnitParams u;
  // From the family's parameter table (model/parameters.h): a block's tensors split over tp or
  // replicated as shard/layout.h cuts them; embedding and head replicated over tp.
  for (const model::Parameter& p : model::BlockParameters(m)) {
    const bool replicated = TensorParallelSplit(m, model::BlockPrefix(m, 0) + p.name, p.shape).replicated();
    (replicated ? u.layer_replicated : u.layer_sharded) += p.numel();
  }
  for (const std::string& name : model::EmbeddingNames(m)) {
    u.embedding_replicated += name == "wpe.weight" ? (m.max_positions > 0 ? m.max_positions : m.sequence) * m.hidden : m.vocab * m.hidden;
  }
  u.head_replicated = static_cast<int64_t>(model::FinalNormNames(m).size()) * m.hidden;
  // Untied: the head's own weight. Tied: the last stage keeps its own copy of the embedding.
  if (!m.tied() || pp > 1) u.head_replicated += m.vocab * m.hidden;
  return u;
}

// Bytes per parameter of each kind of model state. The ZeRO paper's mixed precision keeps the
// fp32 master copy inside the optimizer's 12 bytes; our trainer's master weights are the model
// itself, and bf16 autocast adds a cached bf16 copy of every weight during forward/backward.
StateBytesPerParam BytesPerParam(StateLayout layout, bool eight_bit_optimizer) {
  // adamw8bit: m and v as one code byte each plus an fp32 scale per block of 256.
  constexpr double kEightBitMoments = 2.0 * (1.0 + 4.0 / 256.0);
  switch (layout) {
    case StateLayout::kFp32:  // = 16: weights, gradients, m and v
      return {4, 0, 4, eight_bit_optimizer ? kEightBitMoments : 8};
    case StateLayout::kBf16Autocast:  // = 16: casts are per micro-batch (activations)
      return {4, 0, 4, eight_bit_optimizer ? kEightBitMoments : 8};
    case StateLayout::kZeroPaperMixed: return {2, 0, 2, 12};  // = 16
  }
  return {4, 0, 4, 8};
}

// Contiguous layers per stage minimising the largest stage cost, where a stage's cost is the
// larger of its share of the compute (layers + the head's matmul) and of the parameters
// (layers + embedding on stage 0, head on the last). Dynamic programming over (stage, layers).
std::vector<LayerRange> BalanceStages(const Problem& problem, int64_t pp) {
  const int64_t layers = problem.model.layers;
  const UnitParams u = CountUnits(problem.model, pp);
  const double layer = static_cast<double>(u.layer_sharded + u.layer_replicated);
  const double head_flops = static_cast<double>(problem.model.vocab * problem.model.hidden);
  const double embedding = static_cast<double>(u.embedding_sharded + u.embedding_replicated);
  const double head = static_cast<double>(u.head_sharded + u.head_replicated);
  const double total_flops = layers * layer + head_flops;
  const double total_params = layers * layer + embedding + head;
  auto cost = [&](int64_t stage, int64_t count) {
    double flops = count * layer, params = count * layer;
    if (stage == 0) params += embedding;
    if (stage == pp - 1) flops += head_flops, params += head;
    return std::max(flops / total_flops, params / total_params);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][j]: smallest max cost placing the first j layers on stages 0..k; cut[k][j]: where stage k starts.
  std::vector<std::vector<double>> best(pp, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int64_t>> cut(pp, std::vector<int64_t>(layers + 1, 0));
  for (int64_t j = 1; j <= layers; ++j) best[0][j] = cost(0, j);
  for (int64_t k = 1; k < pp; ++k) {
    for (int64_t j = k + 1; j <= layers; ++j) {
      for (int64_t i = k; i < j; ++i) {
        const double c = std::max(best[k - 1][i], cost(k, j - i));
        if (c < best[k][j]) best[k][j] = c, cut[k][j] = i;
      }
    }
  }
  std::vector<LayerRange> ranges(pp);
  int64_t end = layers;
  for (int64_t k = pp - 1; k >= 0; --k) {
    const int64_t begin = k == 0 ? 0 : cut[k][end];
    ranges[k] = {begin, end};
    end = begin;
  }
  return ranges;
}

const std::vector<LayerRange>& StageCache::For(int64_t pp) {
  auto it = by_pp_.find(pp);
  if (it == by_pp_.end()) {
    std::vector<LayerRange> ranges;
    if (static_cast<int64_t>(problem_.job.stages.size()) == pp) {
      for (int64_t k = 0; k < pp; ++k) {
        const auto [begin, end] = StageLayers(problem_.model.layers, pp, k, problem_.job.stages);
        ranges.push_back({begin, end});
      }
    } else {
      ranges = BalanceStages(problem_, pp);
    }
    it = by_pp_.emplace(pp, std::move(ranges)).first;
  }
  return it->second;
}

namespace {

// Slowest member's link; groups spanning nodes go over the inter-node network.
double GroupBandwidth(const Problem& problem, const std::vector<const WorkerView*>& group) {
  double bandwidth = std::numeric_limits<double>::infinity();
  for (const WorkerView* w : group) {
    bandwidth = std::min(bandwidth, w->bandwidth);
    if (w->node != group.front()->node) bandwidth = std::min(bandwidth, problem.options.inter_node_bandwidth);
  }
  return bandwidth;
}

double RingAllReduceSeconds(double bytes, int64_t n, double bandwidth) {
  return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * bytes / bandwidth;
}

}  // namespace

const MeshGeometry& StageCache::Geometry(int64_t dp, int64_t pp, int64_t tp) {
  const auto key = std::make_tuple(dp, pp, tp);
  auto it = geometry_.find(key);
  if (it != geometry_.end()) return it->second;
  auto at = [&](int64_t stage, int64_t d, int64_t r) -> const WorkerView& {
    return workers_[static_cast<size_t>((stage * dp + d) * tp + r)];
  };
  const double inf = std::numeric_limits<double>::infinity();
  MeshGeometry g;
  g.min_budget.assign(pp, std::numeric_limits<int64_t>::max());
  g.min_peak_flops.assign(pp, inf);
  g.dp_bandwidth.assign(pp, inf);
  g.tp_bandwidth.assign(pp, inf);
  g.pp_bandwidth.assign(pp, inf);
  std::vector<const WorkerView*> group;
  for (int64_t k = 0; k < pp; ++k) {
    for (int64_t d = 0; d < dp; ++d) {
      for (int64_t r = 0; r < tp; ++r) {
        const WorkerView& w = at(k, d, r);
        g.min_budget[k] = std::min(g.min_budget[k], static_cast<int64_t>(static_cast<double>(w.free_bytes) * (1.0 - problem_.options.safety_margin)));
        g.min_peak_flops[k] = std::min(g.min_peak_flops[k], w.peak_flops);
      }
    }
    for (int64_t r = 0; r < tp && dp > 1; ++r) {
      group.clear();
      for (int64_t d = 0; d < dp; ++d) group.push_back(&at(k, d, r));
      g.dp_bandwidth[k] = std::min(g.dp_bandwidth[k], GroupBandwidth(problem_, group));
    }
    for (int64_t d = 0; d < dp && tp > 1; ++d) {
      group.clear();
      for (int64_t r = 0; r < tp; ++r) group.push_back(&at(k, d, r));
      g.tp_bandwidth[k] = std::min(g.tp_bandwidth[k], GroupBandwidth(problem_, group));
    }
    for (int64_t d = 0; d < dp && k + 1 < pp; ++d) {
      g.pp_bandwidth[k] = std::min(g.pp_bandwidth[k], GroupBandwidth(problem_, {&at(k, d, 0), &at(k + 1, d, 0)}));
    }
  }
  return geometry_.emplace(key, std::move(g)).first->second;
}

Candidate CandidateOf(const Plan& plan) {
  return {plan.dp, plan.pp, plan.tp, plan.zero, plan.micro_batch, plan.recompute, plan.offload};
}

Plan Evaluate(const Problem& problem, const Candidate& c, StageCache& cache, bool with_workers, Fill* fill) {
  const ModelSpec& model = problem.model;
  const PlannerOptions& opt = problem.options;
  const bool fp32_acts = problem.layout == StateLayout::kFp32;
  const int64_t s = problem.job.sequence, b = c.micro_batch;
  const int64_t local_batch = problem.job.global_batch / c.dp;
  const int64_t m = local_batch / b;  // micro-batches per step per dp rank
  // Token-sized products in double (see ToBytes): s * b * hidden alone reaches 2^60 within bounds.
  const double sbh = static_cast<double>(s) * static_cast<double>(b) * static_cast<double>(model.hidden);
  const double boundary_bytes = sbh * static_cast<double>(ActivationBytesPerElement(fp32_acts));
  const double compute_bytes = problem.layout == StateLayout::kFp32 ? 4.0 : 2.0;
  const StateBytesPerParam per_param = BytesPerParam(problem.layout, problem.job.optimizer == "adamw8bit");
  const UnitParams u = CountUnits(model, c.pp);
  const double layer_per_rank = static_cast<double>(u.layer_sharded) / c.tp + u.layer_replicated;
  const MeshGeometry& geometry = cache.Geometry(c.dp, c.pp, c.tp);

  Plan plan;
  plan.dp = c.dp, plan.pp = c.pp, plan.tp = c.tp, plan.zero = c.zero, plan.micro_batch = b;
  plan.gradient_accumulation = m, plan.recompute = c.recompute, plan.offload = c.offload;
  plan.stages = cache.For(c.pp);
  Fill local_fill;

  double compute = 0, dp_comm = 0, tp_comm = 0, pp_comm = 0, offload_comm = 0;
  for (int64_t k = 0; k < c.pp; ++k) {
    const bool first = k == 0, last = k == c.pp - 1, recompute = c.recompute[static_cast<size_t>(k)];
    const int64_t layers = plan.stages[static_cast<size_t>(k)].size();
    double params = layers * layer_per_rank;
    if (first) params += static_cast<double>(u.embedding_sharded) / c.tp + u.embedding_replicated;
    if (last) params += static_cast<double>(u.head_sharded) / c.tp + u.head_replicated;
    const double flops_params = layers * layer_per_rank + (last ? static_cast<double>(model.vocab * model.hidden) / c.tp : 0);
    const double flops = (recompute ? 8.0 : 6.0) * flops_params * static_cast<double>(local_batch * s);

    MemoryEstimate mem = ModelStateBytes(ToBytes(params), problem.layout, c.zero, c.dp, c.offload, problem.job.optimizer == "adamw8bit");
    if (c.zero == 0 && c.dp > 1 && problem.layout == StateLayout::kBf16Autocast) {
      mem.gradients = ToBytes(static_cast<double>(mem.gradients) - kDataParallelZero0Saving * params);  // see Calibration: measured
    }
    const int64_t in_flight = c.pp > 1 ? std::min(c.pp - k, m) : 1;
    // The paper's layers (a recomputed layer keeps its fp32 residual input), scaled as measured,
    // the logits on the last stage (vocab padded to 64 as the trainer does), step temporaries.
    double acts = StageActivationBytes(model, s, b, c.tp, fp32_acts, opt.fused_attention, layers, in_flight, recompute);
    if (recompute && !fp32_acts) acts += static_cast<double>(in_flight * layers) * sbh * 2;
    acts *= kActivationScale;
    if (last) acts += kLogitBytes * static_cast<double>(s) * static_cast<double>(b) * static_cast<double>((model.vocab + 63) / 64 * 64);
    if (model.rms_norm()) {
      acts += kLlamaLayerExtraPerSbh * static_cast<double>(recompute ? 1 : in_flight * layers) * sbh;
    }
    if (!recompute && problem.layout == StateLayout::kBf16Autocast) {
      const double matmul_weights = layers * static_cast<double>(u.layer_sharded) / c.tp + (last ? static_cast<double>(model.vocab * model.hidden) : 0);
      acts += kAutocastWeightCopyBytes * static_cast<double>(in_flight) * matmul_weights;
    }
    mem.activations = ToBytes(acts + static_cast<double>(kStepTemporaryBytes));
    const double gradient_bytes = params * per_param.gradients;
    double buffers = 0;  // gradients are all-reduced in place, one unit at a time
    if (c.tp > 1) buffers += 2 * boundary_bytes;
    if (c.pp > 1) buffers += 2 * boundary_bytes;  // one send and one receive buffer
    if (c.zero >= 3 && c.dp > 1) buffers += 2 * layer_per_rank * compute_bytes;  // gathered layer + prefetch
    mem.communication_buffers = ToBytes(buffers);
    mem.workspace = opt.workspace_bytes;

    const double total = static_cast<double>(mem.total());
    local_fill.worst = std::max(local_fill.worst, total / static_cast<double>(std::max<int64_t>(geometry.min_budget[k], 1)));
    local_fill.largest_total = std::max(local_fill.largest_total, total);
    compute = std::max(compute, flops / (geometry.min_peak_flops[k] * opt.compute_efficiency));
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
      dp_comm = std::max(dp_comm, t * (c.zero >= 3 ? 1.5 : 1.0));
    }
    if (c.tp > 1) {
      const double per_layer = (recompute ? 6.0 : 4.0) * RingAllReduceSeconds(boundary_bytes, c.tp, geometry.tp_bandwidth[k]);
      tp_comm = std::max(tp_comm, per_layer * layers * m);
    }
    if (!last) pp_comm = std::max(pp_comm, 2.0 * m * boundary_bytes / geometry.pp_bandwidth[k]);
    if (c.offload) {
      const double shard = params * 4.0 / (c.zero >= 1 ? c.dp : 1);  // fp32 grads out, fp32 weights back
      offload_comm = std::max(offload_comm, 2.0 * shard / opt.host_bandwidth);
    }
  }
  plan.step_time.compute_s = compute;
  plan.step_time.communication_s = dp_comm + tp_comm + pp_comm + offload_comm;
  plan.step_time.bubble_s = compute * static_cast<double>(c.pp - 1) / static_cast<double>(m);
  if (fill) *fill = local_fill;
  return plan;
}

double WorstFill(const Plan& plan, double scale, size_t* worst_worker) {
  double worst = 0;
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const WorkerAssignment& w = plan.workers[i];
    const double fill = scale * static_cast<double>(w.memory.total()) / static_cast<double>(std::max<int64_t>(w.budget_bytes, 1));
    if (fill > worst) {
      worst = fill;
      if (worst_worker) *worst_worker = i;
    }
  }
  return worst;
}

std::string FormatBytes(double bytes) {
  char text[32];
  if (bytes >= double(1 << 30)) {
    std::snprintf(text, sizeof text, "%.1f GiB", bytes / double(1 << 30));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / double(1 << 20));
  }
  return text;
}

std::string Describe(const Plan& plan) {
  const auto recomputed = std::count(plan.recompute.begin(), plan.recompute.end(), true);
  char text[200];
  std::snprintf(text, sizeof text, "dp=%lld pp=%lld tp=%lld, ZeRO-%lld, micro_batch %lld x %lld accumulation, recompute on %lld of %lld stages, %s",
                static_cast<long long>(plan.dp), static_cast<long long>(plan.pp), static_cast<long long>(plan.tp),
                static_cast<long long>(plan.zero), static_cast<long long>(plan.micro_batch),
                static_cast<long long>(plan.gradient_accumulation), static_cast<long long>(recomputed),
                static_cast<long long>(plan.pp), plan.offload ? "optimizer offloaded" : "no offload");
  return text;
}

}  // namespace internal
}  // namespace strata::shard
