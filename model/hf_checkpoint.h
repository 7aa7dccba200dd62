// A Hugging Face model directory's weights as published: one model.safetensors, or
// model.safetensors.index.json mapping each tensor to one of several files (every 7B+ model).
// Files are memory-mapped, so opening reads headers only and a rank that copies out its slices
// (pipeline stage, tensor-parallel part) reads just those pages: host memory stays near one
// rank's share however large the model (docs/models.md).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "quant/nf4.h"
#include "spec/run_spec.h"
#include "storage/safetensors.h"

namespace strata::model {

class HfCheckpoint {
 public:
  // InvalidArgument naming the directory, the index or the file: no weights, an index that is
  // not JSON or names a missing file, a truncated or malformed file, a tensor the index places
  // in a file that does not hold it.
  static Result<HfCheckpoint> Open(const std::string& dir);

  // The tensor of Hugging Face name `name` (a view into its file's mapping), or NotFound naming
  // where it should have been.
  Result<storage::TensorView> Find(const std::string& name) const;
  // A weight stored by bitsandbytes in NF4 (a `*-bnb-4bit` checkpoint, or `strata export
  // --quantized`): `name` beside `name`.quant_state.bitsandbytes__nf4. Its shape is the matrix's
  // [out, in] for every family (transformers quantizes GPT-2's Conv1D weights transposed).
  bool IsNf4(const std::string& name) const;
  // That weight's codes and scales (quant::FromBnbStateDict over the entries beside it);
  // Corruption / NotFound name the entry.
  Result<quant::Nf4Tensor> FindNf4(const std::string& name) const;
  const std::string& dir() const { return dir_; }
  size_t file_count() const { return files_.size(); }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<storage::MappedSafetensors>> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
  std::string layout_;                   // "model.safetensors" or the index's name, for messages
  friend Result<std::string> BaseIdentity(const ModelSpec& m, int64_t seed);
};

// The submit-time check of model.init_from's weights (headers only, and the quantization state
// of NF4 weights): every parameter of `m` is present with its shape and a float dtype (F32,
// BF16, F16), or NF4 (IsNf4) for a 2-D one. InvalidArgument names the tensor,
// the file and what to do.
Status CheckHfCheckpoint(const std::string& dir, const ModelSpec& m);

// What a run's weights start from, for a resume to check that a LoRA checkpoint (adapters only)
// goes back onto the base it was trained over: "seed S" and a hash of the parameter table for a
// base drawn from train.seed, or "init_from" and a fingerprint of model.init_from's weights - an
// xxhash64 over each tensor's name, dtype, shape and its first and last 4 KiB, by name (headers
// and a few pages: another model, or the same one retrained, differs; 140 GB are not read).
Result<std::string> BaseIdentity(const ModelSpec& m, int64_t seed);

// Files published beside the weights that an export carries along: tokenizer files,
// generation_config.json, special_tokens_map.json, ...
std::vector<std::string> CompanionFiles(const std::string& dir);

}  // namespace strata::model
