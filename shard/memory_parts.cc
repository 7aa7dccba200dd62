// The per-worker memory pieces of the model in estimator.cc (its header comment has the maths):
// parameter counts, model state under ZeRO and offload, activations per layer and stage.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "model/parameters.h"
#include "shard/estimator_constants.h"
#include "shard/internal.h"
#include "shard/layout.h"

namespace strata::shard {
using namespace estimator_constants;  // NOLINT: shared with estimator.cc

int64_t ParameterCount(const ModelSpec& spec) {
  internal::UnitParams u = internal::CountUnits(spec, /*pp=*/1, /*tp=*/1);
  return u.embedding_sharded + u.embedding_replicated + Filled(spec).layers * (u.layer_sharded + u.layer_replicated) +
         u.head_sharded + u.head_replicated;
}

MemoryEstimate ModelStateBytes(int64_t params, StateLayout layout, int64_t zero, int64_t dp, Offload offload,
                               bool eight_bit_optimizer) {
  const internal::StateBytesPerParam b = internal::BytesPerParam(layout, eight_bit_optimizer);
  const double p = static_cast<double>(params);
  const double weight_share = zero >= 3 ? 1.0 / dp : 1.0;
  // The ZeRO paper frees the gradients a rank does not own; our trainer reduce-scatters in place.
  const double gradient_share = zero >= 3 || (zero == 2 && layout == StateLayout::kZeroPaperMixed) ? 1.0 / dp : 1.0;
  const double optimizer_share = zero >= 1 ? 1.0 / dp : 1.0;
  MemoryEstimate m;
  m.weights = ToBytes(p * b.weights * weight_share);
  m.gradients = ToBytes(p * b.gradients * gradient_share);
  m.optimizer_state = offload != Offload::kNone ? 0 : ToBytes(p * b.optimizer * optimizer_share);
  if (offload == Offload::kOptimizerAndParams) m.weights = m.gradients = 0;  // in host memory, streamed
  return m;
}

int64_t LayerActivationBytes(const ModelSpec& spec, int64_t sequence, int64_t micro_batch, int64_t tp,
                             bool fp32_activations, bool fused_attention, bool sequence_parallel) {
  const ModelSpec model = Filled(spec);
  const double s = sequence, b = micro_batch, h = model.hidden, t = tp;
  const double e = static_cast<double>(ActivationBytesPerElement(fp32_activations));
  const double q = static_cast<double>(model.heads * model.head_size()) / h;  // q, and attention's output
  const double kv = 2.0 * static_cast<double>(model.kv_heads * model.head_size()) / h;
  const double mlp = (model.gated_mlp() ? 3.0 : 2.0) * static_cast<double>(model.ffn) / h;
  const double scores = fused_attention ? 0.0 : static_cast<double>(model.heads) * s / h;
  // Qwen3's per-head q/k norms (fused) save their inputs, q and k before the norm; OLMo 2's
  // whole-projection norms (op by op, in fp32) about 8 bytes an element of them.
  const double qk_norm = model.qk_norm_per_head() ? q + kv / 2.0 : model.qk_norm() ? (q + kv / 2.0) * 8.0 / e : 0.0;
  // Sequence parallel: the residual stream the norms save is the rank's tokens; the attention's
  // and the MLP's inputs stay whole (the matmuls save what the all-gather made).
  const double residual = 2 * kResidualBytes / (sequence_parallel ? t : 1.0);
  const double per_sbh = residual + e * (2.0 + (2.0 * q + kv + mlp + scores + qk_norm) / t);
  return ToBytes(s * b * h * per_sbh);
}

int64_t StageActivationBytes(const ModelSpec& model, int64_t sequence, int64_t micro_batch, int64_t tp,
                             bool fp32_activations, bool fused_attention, int64_t layers, int64_t in_flight,
                             bool recompute, bool sequence_parallel) {
  const double full = static_cast<double>(
      LayerActivationBytes(model, sequence, micro_batch, tp, fp32_activations, fused_attention, sequence_parallel));
  return StageActivationBytesOf(full, model, sequence, micro_batch, tp, layers, in_flight, recompute,
                                sequence_parallel);
}

namespace internal {

UnitParams CountUnits(const ModelSpec& spec, int64_t pp, int64_t tp) {
  const ModelSpec m = Filled(spec);
  UnitParams u;
  // From the family's parameter table (model/parameters.h): a block's tensors split over tp or
  // replicated as shard/layout.h cuts them; the token embedding and the head split by vocabulary
  // rows where tp divides the vocabulary (VocabParallel), else replicated, as the positions are.
  for (const model::Parameter& p : model::BlockParameters(m)) {
    const bool replicated = TensorParallelSplit(m, model::BlockPrefix(m, 0) + p.name, p.shape, tp).replicated();
    (replicated ? u.layer_replicated : u.layer_sharded) += p.numel();
  }
  const bool vocab_parallel = VocabParallel(m, tp);
  for (const std::string& name : model::EmbeddingNames(m)) {
    if (name == "wpe.weight") {
      u.embedding_replicated += (m.max_positions > 0 ? m.max_positions : m.sequence) * m.hidden;
    } else {
      (vocab_parallel && name == model::TokenEmbeddingName(m) ? u.embedding_sharded : u.embedding_replicated) +=
          m.vocab * m.hidden;
    }
  }
  u.head_replicated = static_cast<int64_t>(model::FinalNormNames(m).size()) * m.hidden;
  // Untied: the head's own weight. Tied: the last stage keeps its own copy of the embedding.
  if (!m.tied() || pp > 1) (vocab_parallel ? u.head_sharded : u.head_replicated) += m.vocab * m.hidden;
  return u;
}

// Bytes per parameter of each kind of model state. The ZeRO paper's mixed precision keeps the
// fp32 master copy inside the optimizer's 12 bytes; our trainer's master weights are the model
// itself (a bf16 run's working copies depend on the plan: Evaluate adds them).
StateBytesPerParam BytesPerParam(StateLayout layout, bool eight_bit_optimizer) {
  // adamw8bit: m and v as one code byte each plus an fp32 scale per block of 256.
  constexpr double kEightBitMoments = 2.0 * (1.0 + 4.0 / 256.0);
  if (layout == StateLayout::kZeroPaperMixed) return {2, 2, 12};  // = 16
  // The trainer's fp32 state in fp32 and bf16 runs alike: weights, gradients, m and v (= 16).
  return {4, 4, eight_bit_optimizer ? kEightBitMoments : 8};
}

}  // namespace internal

int64_t CheckpointShardBytes(const ModelSpec& model, const Plan& plan, const WorkerAssignment& w,
                             const LoraSpec& lora) {
  constexpr double kBytesPerElement = 3 * 4;  // param, adam_m, adam_v in fp32
  const int64_t layers = w.stage < static_cast<int64_t>(plan.stages.size()) ? plan.stages[w.stage].size() : 0;
  if (lora.enabled) {  // tp = 1; the adapters are the blocks' (model/parameters.h), the same in each
    const double per_layer =
        static_cast<double>(model::LoraParameterCount(model, lora)) / static_cast<double>(model.layers);
    return ToBytes(
        std::ceil(per_layer * static_cast<double>(layers) / static_cast<double>(std::max<int64_t>(plan.dp, 1))) *
        kBytesPerElement);
  }
  // pp = 1: the checkpoint holds a tied embedding once (the last stage's copy is not written).
  const internal::UnitParams u = internal::CountUnits(model, 1, plan.tp);
  const bool first = w.stage == 0;
  const bool last = w.stage == static_cast<int64_t>(plan.stages.size()) - 1;
  const double sharded = static_cast<double>(layers) * static_cast<double>(u.layer_sharded) +
                         (first ? static_cast<double>(u.embedding_sharded) : 0.0) +
                         (last ? static_cast<double>(u.head_sharded) : 0.0);
  const double replicated = static_cast<double>(layers) * static_cast<double>(u.layer_replicated) +
                            (first ? static_cast<double>(u.embedding_replicated) : 0.0) +
                            (last ? static_cast<double>(u.head_replicated) : 0.0);
  const double elements =
      sharded / static_cast<double>(std::max<int64_t>(plan.tp, 1)) + (w.tp_rank == 0 ? replicated : 0.0);
  return ToBytes(std::ceil(elements / static_cast<double>(std::max<int64_t>(plan.dp, 1))) * kBytesPerElement);
}

}  // namespace strata::shard
