// LoRA's side of the memory and step-time model (JobSpec::lora; shard/estimator.cc's header has
// the rest, and EvaluateKeeping applies these where a LoRA job differs). Every base parameter
// (embedding, norms, linears, head) is frozen: held in the compute dtype, e = 2 bytes on a bf16
// CUDA run, else 4, with no gradient buffer and no optimizer state. Only the adapters
// (A [rank, in], B [out, rank] per adapted matrix per layer: model::BlockLoraParameters) train,
// as units like any other. Per pipeline stage, a = its layers' adapter parameters, base = the
// rest of what it holds:
//   model state  base * e  +  a * (4 fp32 master + 4 fp32 gradient + 8 AdamW m and v (adamw8bit
//                2.03) + 2 bf16 working copy on a bf16 CUDA run); ZeRO 1 divides the adapters'
//                optimizer state by dp, 2 also their gradients as it does any unit's (the trainer
//                keeps the buffer whole: ModelStateBytes); the frozen base is never divided
//   activations  full training's per layer (the frozen matmuls still save their inputs for dx),
//                plus per adapted matrix per layer x A^T: tokens * rank * e (dropout(x) is x at
//                dropout 0; above it the dropped copy and its mask, tokens * in * (e + 1), counted
//                too); no recomputed layer's weight casts or base gradients; the fused loss over the
//                frozen head makes no dW (worker/nn/fused_loss.cc: need_dw), only its copy padded to
//                64 rows (e a weight)
//   matmuls      4 FLOPs per base parameter per token (forward 2, backward dx 2: no weight
//                gradient), 6 with recompute; 6 per adapter parameter per token (8 with recompute)
//   optimizer    the time per parameter of the adapters of the rank's ZeRO shard; dp's gradient
//                collectives and an offloaded optimizer's copies and host memory: adapters only
//   meshes       tp = 1, ZeRO 0-2, offload "none" or "optimizer" (spec/run_spec_lora.cc
//                CheckLoraMesh): search.cc's MeshesOf, ForEachBranch and OffloadTiers pick no other
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "shard/estimator_constants.h"
#include "shard/internal.h"

namespace strata::shard {
using namespace estimator_constants;  // NOLINT: estimator.cc's other half

MemoryEstimate LoraModelStateBytes(int64_t frozen_params, int64_t adapter_params, int64_t compute_bytes, int64_t zero,
                                   int64_t dp, Offload offload, bool eight_bit_optimizer) {
  // The adapters' state is the trainer's fp32 state of any unit (4 + 4 + 8), in fp32 and bf16 runs alike.
  MemoryEstimate m =
      ModelStateBytes(adapter_params, StateLayout::kBf16Autocast, zero, dp, offload, eight_bit_optimizer);
  const double working = compute_bytes == 2 ? kWorkingCopyBytes : 0.0;
  m.weights =
      ToBytes(static_cast<double>(m.weights) + static_cast<double>(frozen_params) * static_cast<double>(compute_bytes) +
              static_cast<double>(adapter_params) * working);
  return m;
}

namespace internal {

void Nf4Base(const LoraCounts& counts, int64_t layers, int64_t compute_bytes, MemoryEstimate* m) {
  // The block linears leave the dense base (compute_bytes a weight) for NF4's 4.127 bits; the
  // largest one is dequantized inside its matmul, forward and backward (one at a time), into a
  // compute-dtype copy and nothing else (kernels::Nf4Dequantize).
  const double matrices = static_cast<double>(counts.nf4_matrix_params) * static_cast<double>(layers);
  m->weights = ToBytes(static_cast<double>(m->weights) - matrices * static_cast<double>(compute_bytes) +
                       matrices * kNf4BytesPerWeight);
  m->activations = ToBytes(static_cast<double>(m->activations) +
                           static_cast<double>(counts.nf4_largest) * static_cast<double>(compute_bytes));
}

LoraCounts CountLora(const ModelSpec& model, const LoraSpec& lora) {
  LoraCounts counts;
  if (!lora.enabled) return counts;
  for (const model::Parameter& p : model::BlockLoraParameters(Filled(model), lora)) {
    counts.layer += p.numel();
    if (p.name.ends_with(".lora_A.weight")) ++counts.matrices, counts.inputs += p.shape[1];
  }
  if (lora.base == LoraBase::kNf4) {
    for (const model::Parameter& p : model::BlockParameters(Filled(model))) {
      if (p.shape.size() != 2) continue;
      counts.nf4_matrix_params += p.numel();
      counts.nf4_largest = std::max(counts.nf4_largest, p.numel());
    }
  }
  return counts;
}

Status ValidateLora(const ModelSpec& spec, const JobSpec& job) {
  const LoraSpec& lora = job.lora;
  if (!lora.enabled) return Status::Ok();
  const ModelSpec m = Filled(spec);
  const std::vector<std::string>& modules = LoraTargetModules(m.family);
  if (lora.target_modules.empty()) {
    return InvalidArgument("lora.target_modules is empty; name at least one of " + std::string(Name(m.family)) +
                           "'s linears (or \"all-linear\")");
  }
  for (const std::string& name : lora.target_modules) {
    if (std::find(modules.begin(), modules.end(), name) == modules.end()) {
      return InvalidArgument("lora.target_modules holds \"" + name + "\", which " + std::string(Name(m.family)) +
                             " has no linear named");
    }
  }
  const int64_t narrowest = LoraNarrowestWidth(m, lora.target_modules);
  if (lora.rank < 1 || lora.rank > narrowest) {
    return InvalidArgument("lora.rank = " + std::to_string(lora.rank) + "; it must be in [1, " +
                           std::to_string(narrowest) + "] (the narrowest targeted matrix's width)");
  }
  if (job.tp && *job.tp > 1) {
    return InvalidArgument("parallel.tp = " + std::to_string(*job.tp) +
                           ": LoRA under tensor parallelism is not built yet; use parallel.tp = 1 (or \"auto\")");
  }
  if (job.zero && *job.zero == 3) {
    return InvalidArgument(
        "parallel.zero = 3: LoRA with sharded parameters is not built yet; use parallel.zero = 0-2 "
        "(or \"auto\")");
  }
  if (job.offload == Offload::kOptimizerAndParams) {
    return InvalidArgument(
        "parallel.offload = \"optimizer+params\" streams ZeRO-3 parameters, which LoRA does not run on yet; use "
        "\"none\" or \"optimizer\" (or \"auto\")");
  }
  return Status::Ok();
}

double LoraLayerActivationBytes(const Problem& problem, int64_t sequence, int64_t micro_batch, bool fp32_activations) {
  const LoraSpec& lora = problem.job.lora;
  if (!lora.enabled) return 0;
  const double tokens = static_cast<double>(sequence) * static_cast<double>(micro_batch);
  const double e = static_cast<double>(ActivationBytesPerElement(fp32_activations));
  double bytes = tokens * static_cast<double>(problem.lora.matrices) * static_cast<double>(lora.rank) * e;
  if (lora.dropout > 0) bytes += tokens * static_cast<double>(problem.lora.inputs) * (e + 1.0);
  return bytes;
}

namespace {

std::string Count(double n) {
  char text[32];
  if (n >= 1e9)
    std::snprintf(text, sizeof text, "%.2fB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(text, sizeof text, "%.1fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(text, sizeof text, "%.1fK", n / 1e3);
  else
    std::snprintf(text, sizeof text, "%.0f", n);
  return text;
}

}  // namespace

std::string LoraNote(const Problem& problem) {
  const LoraSpec& lora = problem.job.lora;
  if (!lora.enabled) return "";
  const ModelSpec m = Filled(problem.model);
  const double adapters = static_cast<double>(problem.lora.layer) * static_cast<double>(m.layers);
  const double all = static_cast<double>(ParameterCount(m)) + adapters;  // as PEFT counts "all params"
  std::string modules;
  if (lora.target_modules == LoraTargetModules(m.family)) {
    modules = "every linear";
  } else {
    for (const std::string& module : lora.target_modules) modules += (modules.empty() ? "" : ", ") + module;
  }
  const bool bf16 = problem.layout == StateLayout::kBf16Autocast && problem.cuda;
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.2g%%", 100.0 * adapters / std::max(all, 1.0));
  const std::string dense = bf16 ? "bf16 (2" : "fp32 (4";
  const std::string frozen =
      lora.base == LoraBase::kNf4
          ? "the blocks' linears frozen in NF4 (4.127 bits a weight), the rest in " + dense + " bytes a parameter)"
          : "the base frozen in " + dense + " bytes a parameter)";
  return std::string(lora.base == LoraBase::kNf4 ? "QLoRA" : "LoRA") + " r=" + std::to_string(lora.rank) + " on " +
         modules + ": " + Count(adapters) + " trainable of " + Count(all) + " (" + percent + "), " + frozen +
         ", no gradients or optimizer state for it.";
}

}  // namespace internal
}  // namespace strata::shard
