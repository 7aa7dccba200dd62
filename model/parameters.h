// Every parameter of a model family: names, shapes and order, and where each lives in a Hugging
// Face checkpoint. No LibTorch: the planner counts parameters with it, the worker builds its
// modules from it, the CLI exports with it.
//
// Names are Hugging Face's without the model prefix ("transformer.", "model.", "gpt_neox."),
// except GPT-2's own historical ones (docs/models.md lists them all):
//   gpt2      wte, wpe, h.N.{ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj}, ln_f  (head tied to wte)
//   llama, mistral, qwen2, qwen3, olmo2, gemma
//             embed_tokens, layers.N.{input_layernorm (not olmo2), self_attn.{q,k,v,o}_proj,
//             [qwen3, olmo2: self_attn.{q,k}_norm,] post_attention_layernorm,
//             mlp.{gate,up,down}_proj, [olmo2: post_feedforward_layernorm]}, norm, lm_head (unless tied)
//   gpt_neox  embed_in, layers.N.{input_layernorm, post_attention_layernorm,
//             attention.query_key_value, attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h},
//             final_layer_norm, embed_out
// Shapes are [out, in] for every linear weight (HF GPT-2's Conv1D stores [in, out]: transposed
// on import and export).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/run_spec.h"

namespace strata::model {

struct Parameter {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// In the order the worker builds, initialises and checkpoints them: embeddings, blocks, final
// norm, head (none when tied).
std::vector<Parameter> Parameters(const ModelSpec& m);
// One block's parameters, named relative to the block ("self_attn.q_proj.weight"); every layer
// has the same.
std::vector<Parameter> BlockParameters(const ModelSpec& m);
// "h.3." (gpt2) or "layers.3.".
std::string BlockPrefix(const ModelSpec& m, int64_t layer);
// The embedding unit (gpt2: wte and wpe), the final norm, and the head's weight: lm_head /
// embed_out, or the token embedding when tied.
std::vector<std::string> EmbeddingNames(const ModelSpec& m);
std::string TokenEmbeddingName(const ModelSpec& m);
std::vector<std::string> FinalNormNames(const ModelSpec& m);
std::string HeadWeightName(const ModelSpec& m);
int64_t ParameterCount(const ModelSpec& m);
// A shape as messages write it: "[4096, 1024]".
std::string ShapeText(const std::vector<int64_t>& shape);

// LoRA (spec.lora, run_spec.h): the adapters of one block, named relative to the block after the
// weight they adapt ("self_attn.q_proj.lora_A.weight" [rank, in], "...lora_B.weight" [out, rank]),
// in block order, A before B; empty when lora is off. GPT-2's c_proj is two matrices (attn_proj,
// mlp_proj): targeting it adapts both, as PEFT does.
std::vector<Parameter> BlockLoraParameters(const ModelSpec& m, const LoraSpec& lora);
// Every adapter of the model: BlockLoraParameters of each layer with its BlockPrefix.
std::vector<Parameter> LoraParameters(const ModelSpec& m, const LoraSpec& lora);
// The weight an adapter belongs to: "layers.3.self_attn.q_proj.weight" for
// "layers.3.self_attn.q_proj.lora_A.weight"; "" for a name that is no adapter's.
std::string LoraBaseWeight(const std::string& adapter);
int64_t LoraParameterCount(const ModelSpec& m, const LoraSpec& lora);

struct HfTensorName {
  std::string name;
  bool transposed = false;  // the HF tensor is the transpose of ours (2-D)
};
HfTensorName ToHuggingFace(const ModelSpec& m, const std::string& ours);

}  // namespace strata::model
