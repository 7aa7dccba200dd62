// The run spec's choices (run_spec.h): each is an enum, parsed once from its TOML spelling where
// the spec enters (ParseRunSpec, a config.json), so that the code behind the edge compares
// values and a misspelt choice never reaches a comparison. Each enum's spellings are named once,
// in its Choices table below:
//   Name(e)               the spelling: what RunSpecToToml, messages, JSON documents, Cap'n Proto
//                         messages and file names write
//   ParseChoice<E>(text)  the value a spelling names; nullopt for any other text
//   ChoiceList<E>()       "a", "b" or "c": the spellings as a message lists them
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

// kind: a train run, an activation capture, or a capture with sites replaced (an extract run
// that patches).
enum class RunKind { kTrain, kExtract, kPatch };

// model.family (docs/models.md): the block maths of each is in worker/nn/family_*.cc.
//   gpt2      learned positions, LayerNorm, GELU(tanh) MLP, tied head
//   llama     RMSNorm, rotary, SwiGLU, grouped-query attention (Llama 2/3.x)
//   mistral   llama + sliding-window attention
//   qwen2     llama + q/k/v biases
//   qwen3     llama + RMSNorm over each head's q and k before RoPE (Qwen3)
//   olmo2     llama without pre-norms: x + norm(attn(x)), h + norm(mlp(h)); RMSNorm over the
//             whole q and k projections (OLMo 2)
//   gemma     llama with RMSNorm (1 + w), GeGLU(tanh), embeddings x sqrt(hidden), tied head
//   gpt_neox  Pythia: LayerNorm with bias, partial rotary, parallel attention and MLP, GELU
enum class Family { kGpt2, kLlama, kMistral, kQwen2, kGemma, kGptNeox, kQwen3, kOlmo2 };

// model.activation, the MLP's nonlinearity. kFamilyDefault ("", or absent) until
// ValidateModelSpec fills in the family's own.
enum class Activation { kFamilyDefault, kGeluTanh, kGelu, kSilu };

// model.rope_scaling.type (Hugging Face's rope_scaling; RopeScaling in run_spec.h).
enum class RopeScalingType { kNone, kLinear, kLlama3 };

// data.format (common/token_file.h): a byte per token, little-endian u16 / u32 ids, a .npy of
// integers, or text that `strata submit` tokenizes into a u32 file (workers never see kText).
enum class TokenFormat { kBytes, kU16, kU32, kNpy, kText };

// train.lr_schedule: constant, or linear warmup then cosine down to min_lr.
enum class LrSchedule { kConstant, kCosine };

// train.precision and extract.precision: fp32, or bf16 compute (autocast; CUDA workers).
enum class Precision { kFp32, kBf16 };

// train.optimizer: AdamW, or AdamW with blockwise 8-bit moments (kernels.h AdamW8bit).
enum class Optimizer { kAdamW, kAdamW8bit };

// parallel.offload: where AdamW's state lives (ParallelSpec::offload; "auto" is held in
// ParallelSpec::automatic, not here). Ordered from the simplest: the planner compares them.
enum class Offload { kNone, kOptimizer, kOptimizerAndParams };

// extract.mode: whole model per worker, a block at a time, or chosen from the device's memory.
enum class ExtractMode { kAuto, kWhole, kLayerwise };

// extract.dtype: the dtype captured activations are stored in.
enum class StoredDType { kFp32, kBf16, kFp16 };

// patch.ablation: what replaces a patched site (patch.source holds the mean's values), or, for
// "steer", what is added to it (patch.alpha times patch.source's vector).
enum class Ablation { kZero, kMean, kSteer };

// lora.base: how LoRA's frozen base is held - "dense" in the compute dtype, or "nf4": QLoRA's
// 4-bit NormalFloat blocks (quant/nf4.h), dequantized inside each matmul.
enum class LoraBase { kDense, kNf4 };

// Each enum's spellings, in the order messages list them: entry i names the value i, so the
// tables cover their enums' values in order (checked below).
template <typename E>
struct Choices;

template <typename E, size_t N>
constexpr bool NamesEveryValueInOrder(const std::pair<E, std::string_view> (&names)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (static_cast<size_t>(names[i].first) != i || names[i].second.data() == nullptr) return false;
  }
  return true;
}

#define STRATA_CHOICES(E, ...)                                                \
  template <>                                                                 \
  struct Choices<E> {                                                         \
    static constexpr std::pair<E, std::string_view> kNames[] = {__VA_ARGS__}; \
  };                                                                          \
  static_assert(NamesEveryValueInOrder(Choices<E>::kNames))

STRATA_CHOICES(RunKind, {RunKind::kTrain, "train"}, {RunKind::kExtract, "extract"}, {RunKind::kPatch, "patch"});
STRATA_CHOICES(Family, {Family::kGpt2, "gpt2"}, {Family::kLlama, "llama"}, {Family::kMistral, "mistral"},
               {Family::kQwen2, "qwen2"}, {Family::kGemma, "gemma"}, {Family::kGptNeox, "gpt_neox"},
               {Family::kQwen3, "qwen3"}, {Family::kOlmo2, "olmo2"});
STRATA_CHOICES(Activation, {Activation::kFamilyDefault, ""}, {Activation::kGeluTanh, "gelu_tanh"},
               {Activation::kGelu, "gelu"}, {Activation::kSilu, "silu"});
STRATA_CHOICES(RopeScalingType, {RopeScalingType::kNone, "none"}, {RopeScalingType::kLinear, "linear"},
               {RopeScalingType::kLlama3, "llama3"});
STRATA_CHOICES(TokenFormat, {TokenFormat::kBytes, "bytes"}, {TokenFormat::kU16, "u16"}, {TokenFormat::kU32, "u32"},
               {TokenFormat::kNpy, "npy"}, {TokenFormat::kText, "text"});
STRATA_CHOICES(LrSchedule, {LrSchedule::kConstant, "constant"}, {LrSchedule::kCosine, "cosine"});
STRATA_CHOICES(Precision, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"});
STRATA_CHOICES(Optimizer, {Optimizer::kAdamW, "adamw"}, {Optimizer::kAdamW8bit, "adamw8bit"});
STRATA_CHOICES(Offload, {Offload::kNone, "none"}, {Offload::kOptimizer, "optimizer"},
               {Offload::kOptimizerAndParams, "optimizer+params"});
STRATA_CHOICES(ExtractMode, {ExtractMode::kAuto, "auto"}, {ExtractMode::kWhole, "whole"},
               {ExtractMode::kLayerwise, "layerwise"});
STRATA_CHOICES(StoredDType, {StoredDType::kFp32, "fp32"}, {StoredDType::kBf16, "bf16"}, {StoredDType::kFp16, "fp16"});
STRATA_CHOICES(Ablation, {Ablation::kZero, "zero"}, {Ablation::kMean, "mean"}, {Ablation::kSteer, "steer"});
STRATA_CHOICES(LoraBase, {LoraBase::kDense, "dense"}, {LoraBase::kNf4, "nf4"});

#undef STRATA_CHOICES

template <typename E>
concept SpecChoice = requires {
  Choices<E>::kNames;
};

// The TOML spelling of `value`: a string literal (NUL-terminated), "" for a value outside E.
template <SpecChoice E>
constexpr std::string_view Name(E value) {
  for (const auto& [v, name] : Choices<E>::kNames) {
    if (v == value) return name;
  }
  return "";
}

template <SpecChoice E>
constexpr std::optional<E> ParseChoice(std::string_view text) {
  for (const auto& [v, name] : Choices<E>::kNames) {
    if (name == text) return v;
  }
  return std::nullopt;
}

// `"a", "b" or "c"`: every spelling of E, quoted, as the "is not supported; use ..." messages
// list them.
template <SpecChoice E>
std::string ChoiceList() {
  const auto& names = Choices<E>::kNames;
  std::string list;
  for (size_t i = 0; i < std::size(names); ++i) {
    if (i > 0) list += i + 1 == std::size(names) ? " or " : ", ";
    list += "\"" + std::string(names[i].second) + "\"";
  }
  return list;
}

}  // namespace strata
