// Hugging Face config.json <-> the run spec's [model] table (no LibTorch; the CLI, the
// coordinator and the worker's export share it).
//
// Reading: model_type picks the family (gpt2, llama, mistral, qwen2, gemma, gpt_neox); each
// family's fields map onto ModelSpec (docs/models.md has the table). A field that changes the
// numbers and that Strata does not implement (rope_scaling types other than linear/llama3,
// Qwen2's use_sliding_window, GPT-2 without scaled attention, ...) is refused, naming it: a
// model is never run with different maths than it was trained with. Fields that only matter
// to generation or to dropout (Strata trains without dropout) are kept for export, not used.
// Both spellings of rotary settings are read: rope_theta/rope_scaling (published checkpoints)
// and rope_parameters (transformers 5).
#pragma once

#include <set>
#include <string>

#include "common/status.h"
#include "spec/run_spec.h"

namespace strata {

// Reads DIR/config.json and sets every [model] field from it. `given` are the [model] keys the
// run spec sets itself: each must agree with config.json (InvalidArgument naming both values),
// except model.sequence (the run's window: at most max_positions; absent, min(max_positions,
// 2048)) and model.init_from. `unknown`: spellings of given choices that name no value (kept by
// the TOML parser; run_spec.h), each of which disagrees with config.json's value.
Status ResolveHuggingFaceConfig(const std::string& dir, const std::set<std::string>& given, ModelSpec* m,
                                const UnknownModelChoices& unknown = {});

// The model of a config.json text (`source` names it in messages).
Result<ModelSpec> ModelSpecFromHuggingFaceConfig(const std::string& json_text, const std::string& source);

// config.json for `m`: `source_json` (the init_from directory's config.json, or empty) with the
// fields Strata knows overwritten by m's, so rope_scaling, token ids and every other field the
// source had survive an export; `torch_dtype` is `dtype` ("float32" or "bfloat16").
Result<std::string> HuggingFaceConfigJson(const ModelSpec& m, const std::string& source_json, const std::string& dtype);

}  // namespace strata
