// The run spec: what a user submits (TOML), validated once at the edge. Unknown keys and bad
// values are errors whose message names the key and says how to fix it.
//
//   name = "gpt2-tiny"
//   [model]     family = "gpt2" | "llama", layers, hidden, heads, kv_heads, ffn, vocab, sequence,
//               rope_theta (llama), norm_eps, init_from (a Hugging Face model directory)
//   [data]      path = "corpus.txt", format = "bytes" | "u16"
//   [train]     steps, global_batch, lr, lr_schedule, warmup_steps, min_lr, weight_decay, beta1,
//               beta2, grad_clip, seed, checkpoint_every, precision
//   [parallel]  dp, micro_batch, zero
//   [worker]    threads (intra-op threads per CPU worker; 0 = LibTorch's default)
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

struct ModelSpec {
  std::string family = "gpt2";
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t vocab = 256;
  int64_t sequence = 64;
  int64_t kv_heads = 0;     // llama grouped-query attention; 0 -> heads
  int64_t ffn = 0;          // MLP width; 0 -> 4 * hidden
  double rope_theta = 10000.0;
  double norm_eps = 0.0;    // 0 -> 1e-5 (gpt2 LayerNorm) or 1e-6 (llama RMSNorm)
  std::string init_from;    // start from this Hugging Face directory (config.json + model.safetensors)
};

struct DataSpec {
  std::string path;              // absolute after ParseRunSpec
  std::string format = "bytes";  // "bytes": each byte is a token; "u16": little-endian u16 ids
};

struct TrainSpec {
  int64_t steps = 100;
  int64_t global_batch = 8;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 0.0;  // 0 = off
  int64_t seed = 1234;
  int64_t checkpoint_every = 0;  // 0 = only at the end
  std::string lr_schedule = "constant";  // or "cosine": linear warmup, then cosine down to min_lr
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  std::string precision = "fp32";  // or "bf16": bf16 compute, fp32 master weights (CUDA workers)
};

struct ParallelSpec {
  int64_t dp = 1;
  int64_t micro_batch = 0;  // rows per forward/backward on a rank; 0 = the whole local batch
  int64_t zero = 0;         // ZeRO stage over the dp group: 1 shards optimizer state, 2 also gradients
};

struct WorkerSpec {
  int64_t threads = 1;
};

struct RunSpec {
  std::string name;
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  ParallelSpec parallel;
  WorkerSpec worker;
};

// Parses and validates. Relative data paths are resolved against `base_dir`. Does not touch
// the file system except to check that the data file exists when `check_files` is set.
Result<RunSpec> ParseRunSpec(const std::string& toml_text, const std::string& base_dir, bool check_files);

// Learning rate of 1-based `step`: constant, or linear warmup over warmup_steps then cosine from
// lr down to min_lr at the last step.
double LearningRate(const TrainSpec& train, int64_t step);

// Canonical TOML of a validated spec (every key written, paths absolute); parses back equal.
std::string RunSpecToToml(const RunSpec& spec);

}  // namespace strata
