// The run spec: what a user submits (TOML), validated once at the edge. Unknown keys and bad
// values are errors whose message names the key and says how to fix it.
//
//   name = "gpt2-tiny"
//   kind = "train" | "extract" | "patch"
//   [model]     family (gpt2 | llama | mistral | qwen2 | qwen3 | olmo2 | gemma | gpt_neox), layers, hidden, heads,
//               kv_heads, head_dim, ffn, vocab, sequence, max_positions, rope_theta, rope_scaling,
//               rotary_pct, norm_eps, attention_bias, mlp_bias, tie_embeddings, sliding_window,
//               parallel_residual, activation, init_from (a Hugging Face model directory, whose
//               config.json fills every other [model] field; docs/models.md)
//   [data]      path, format = "bytes" | "u16" | "u32" | "npy", documents, sample_within_documents
//   [train]     steps, global_batch, lr, lr_schedule, warmup_steps, min_lr, weight_decay, beta1,
//               beta2, eps, grad_clip, seed, checkpoint_every, keep_checkpoints, precision,
//               cuda_graphs, optimizer
//   [parallel]  dp, pp, tp, micro_batch, zero, recompute (a train run takes dp x pp x tp workers)
//   [worker]    threads (intra-op threads per CPU worker; 0 = LibTorch's default)
//   [extract]   layers, sites, dtype, precision, batch, tokens (kind = "extract": capture
//               activations of the model over the data instead of training; parallel.dp is the
//               number of workers; the model's weights come from model.init_from, or from
//               train.seed when it is empty); logits_top_k
//   [patch]     layers, sites, ablation, source, alpha, logits (kind = "patch": run the model with those
//               sites replaced and store each row's loss; chunked as an extract run)
//   [lora]      rank, alpha, dropout, target_modules, use_rslora, base (train runs: LoRA adapters on the
//               targeted linears, every base weight frozen; docs/lora.md)
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "spec/spec_choices.h"  // the enums of the spec's choices, and their spellings

namespace strata {

// Upper bounds of the run spec's numbers. Each is far above any model or job that runs on the
// clusters Strata targets, and low enough that everything derived from them stays small: the
// planner's products (parameters, tokens per step, activation bytes) fit an int64, its searches
// (divisors, stage balancing) take milliseconds, and a per-layer or per-step list costs at most
// a few MiB. A value over a bound is refused at submit, naming the bound (README, "Run specs").
namespace spec_bounds {
inline constexpr int64_t kLayers = 1024;                     // the largest dense models run ~100-200
inline constexpr int64_t kHidden = 65536;                    // 2^16; the largest published ~25k
inline constexpr int64_t kHeads = 1024;                      // also bounds kv_heads (they divide heads)
inline constexpr int64_t kFfn = int64_t{1} << 20;            // 16 x the largest hidden
inline constexpr int64_t kVocab = int64_t{1} << 24;          // 16.7M ids; tokenizers stop near 256k
inline constexpr int64_t kSequence = int64_t{1} << 20;       // 1M tokens of context
inline constexpr int64_t kSteps = 1000000000;                // 10^9 optimizer steps (years of training)
inline constexpr int64_t kGlobalBatch = int64_t{1} << 24;    // 16.7M sequences per step
inline constexpr int64_t kWorkers = 65536;                   // dp, tp, and dp * pp * tp (workers per run)
inline constexpr double kMaxEps = 1e-2;                      // train.eps: (0, 1e-2]; larger stops being Adam
inline constexpr int64_t kThreads = 1024;                    // worker.threads; a worker clamps to its cores
inline constexpr double kSteerAlpha = 1e6;                   // |patch.alpha|: a steering vector's scale
inline constexpr int64_t kExtractBatch = 65536;              // sequences per stored chunk
inline constexpr int64_t kExtractTokens = int64_t{1} << 48;  // 281T tokens: more than any corpus
// attn_pattern rows are [heads, sequence]: a capture grows with sequence^2, so it is admitted up
// to this sequence length, and only while one chunk's records fit kExtractChunkBytes.
inline constexpr int64_t kAttnPatternSequence = 2048;
// One chunk's records are held in host memory while computed and queued for the writer (up to
// four at once, worker/extract/extractor.h): 4 GiB keeps that within a worker's host memory.
inline constexpr uint64_t kExtractChunkBytes = uint64_t{4} << 30;
inline constexpr size_t kNameLength = 64;                  // run names; ids add "-NNNNNNNN-NNN"
inline constexpr size_t kSpecFileBytes = size_t{1} << 20;  // a spec file (submit, plan): 1 MiB
}  // namespace spec_bounds

// Run names become run ids (name + "-" + 8 digits + "-" + 3 digits), which become file names
// (checkpoint data directories, profiles), log lines and terminal output. So a name is 1 to 64
// characters of [A-Za-z0-9._-], not starting with '.' or '-'. InvalidArgument names the rule.
Status ValidateRunName(const std::string& name);

// Text from a store or a peer, safe to print on a terminal: control bytes (C0, DEL, and the C1
// range as UTF-8 encodes it) and backslashes are written as \xNN; everything else is kept.
std::string EscapeForTerminal(const std::string& text);

// Reads a run spec (or another small TOML input) from `path` for `strata submit` / `plan`: only a
// regular file of at most `max_bytes`. A directory, FIFO, device (/dev/zero) or socket is refused
// without blocking on it (opened O_NONBLOCK, checked with fstat), naming the path.
Result<std::string> ReadSpecFile(const std::string& path, const std::string& what,
                                 size_t max_bytes = spec_bounds::kSpecFileBytes);

// Rotary position scaling (Hugging Face's rope_scaling): "none"; "linear" divides every
// frequency by factor; "llama3" (Llama 3.1+) divides the low frequencies by factor, keeps the
// high ones and blends in between (docs/run-spec.md has the formula).
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  bool operator==(const RopeScaling&) const = default;
};

// The model families are Family (spec/spec_choices.h, which describes each).
struct ModelSpec {
  Family family = Family::kGpt2;
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t vocab = 256;
  int64_t sequence = 64;
  int64_t kv_heads = 0;       // grouped-query attention; 0 -> heads
  int64_t ffn = 0;            // MLP width; 0 -> 4 * hidden
  int64_t head_dim = 0;       // width of one attention head; 0 -> hidden / heads
  int64_t max_positions = 0;  // positions the model supports; 0 -> sequence (gpt2: its position table's rows)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rotary_pct = 1.0;      // gpt_neox: the share of each head's dimensions that rotates
  double norm_eps = 0.0;        // 0 -> 1e-5 (LayerNorm families) or 1e-6 (RMSNorm families)
  bool attention_bias = false;  // biases on q/k/v/o (llama, qwen3, olmo2, gemma, gpt_neox); qwen2 always has q/k/v ones
  bool mlp_bias = false;        // biases on gate/up/down (llama)
  bool tie_embeddings = false;  // the head reuses the token embedding (always for gpt2)
  int64_t sliding_window = 0;   // mistral: a token attends to the last N positions; 0 = all
  bool parallel_residual = true;  // gpt_neox: x + attn(ln1(x)) + mlp(ln2(x))
  // MLP nonlinearity: "gelu_tanh" | "gelu" | "silu"; kFamilyDefault ("") -> the family's
  Activation activation = Activation::kFamilyDefault;
  std::string init_from;  // start from this Hugging Face directory (config.json + safetensors)
  // A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) over the base:
  // a train run continues training it ([lora] implied, its fields from adapter_config.json); an
  // extract or patch run runs the base with the adapter merged in (W + scale * B A).
  std::string adapter_from;

  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // Dimensions of a head that rotary embeddings turn (even); 0 for gpt2.
  int64_t rotary_dims() const;
  bool rotary() const { return family != Family::kGpt2; }
  // The head is the token embedding (gpt2 always; tie_embeddings for the others).
  bool tied() const { return family == Family::kGpt2 || tie_embeddings; }
  bool rms_norm() const { return family != Family::kGpt2 && family != Family::kGptNeox; }
  bool gated_mlp() const { return rms_norm(); }
  // Biases on the attention's q/k/v, its output, and the MLP's projections.
  bool qkv_bias() const { return family == Family::kGpt2 || family == Family::kQwen2 || attention_bias; }
  bool attn_out_bias() const { return family == Family::kGpt2 || (family != Family::kQwen2 && attention_bias); }
  bool mlp_biases() const { return family == Family::kGpt2 || family == Family::kGptNeox || mlp_bias; }
  // An RMSNorm over q and k before RoPE: over each head (one weight of head_dim each; qwen3), or
  // over the whole projection (weights of heads x head_dim and kv_heads x head_dim; olmo2).
  bool qk_norm() const { return qk_norm_per_head() || family == Family::kOlmo2; }
  bool qk_norm_per_head() const { return family == Family::kQwen3; }
  // The block's norms on the sublayers' outputs, none before them: x + norm(attn(x)) (olmo2).
  bool post_norms() const { return family == Family::kOlmo2; }
  bool operator==(const ModelSpec&) const = default;
};

struct DataSpec {
  std::string path;  // absolute after ParseRunSpec
  // "bytes" (a byte per token), "u16", "u32" (little-endian ids) or "npy" (common/token_file.h), or
  // "text" (below)
  TokenFormat format = TokenFormat::kBytes;
  std::string documents;                 // document start offsets (u64, or .npy of int64/uint64); absolute; empty: none
  bool sample_within_documents = false;  // train windows never cross a document boundary (needs documents)
  // format "text": the model directory whose tokenizer (tokenizer.json or tokenizer.model) turns
  // the text into ids; absolute; empty: model.init_from. `strata submit` tokenizes the text once
  // into a cached u32 file and submits that (client/text_data.h): workers never see "text".
  std::string tokenizer;
  bool operator==(const DataSpec&) const = default;
};

struct TrainSpec {
  int64_t steps = 100;
  int64_t global_batch = 8;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;       // AdamW's denominator term: sqrt(v_hat) + eps; in (0, kMaxEps]
  double grad_clip = 0.0;  // 0 = off
  int64_t seed = 1234;
  // Steps between checkpoints; 0 = only at the end; kAutoCheckpoints ("auto", the default): a
  // tenth of the run's steps (so a worker lost late resumes within the last 10%), fewer steps
  // where the coordinator's plan predicts that a tenth would take over 30 minutes.
  static constexpr int64_t kAutoCheckpoints = -1;
  int64_t checkpoint_every = kAutoCheckpoints;
  // The steps between checkpoints this run takes (checkpoint_every, with "auto" as a tenth).
  int64_t CheckpointInterval() const {
    return checkpoint_every == kAutoCheckpoints ? (steps + 9) / 10 : checkpoint_every;
  }
  // Keep only the newest N complete checkpoints of the run (0: keep all); older ones are deleted
  // from every store once a newer one is complete. Unreadable ones are kept for inspection, and
  // so is the checkpoint a run resumed from. The default keeps 3 (a checkpoint of an 8B model's
  // fp32 state is ~96 GB).
  int64_t keep_checkpoints = 3;
  LrSchedule lr_schedule = LrSchedule::kConstant;  // or "cosine": linear warmup, then cosine down to min_lr
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  Precision precision = Precision::kFp32;  // or "bf16": bf16 compute, fp32 master weights (CUDA workers)
  // CUDA workers: replay each step's forwards and backwards as one CUDA graph where the schedule
  // is static (one pipeline stage, tp = 1, ZeRO < 3); false launches every kernel each step.
  bool cuda_graphs = true;
  // "adamw", or "adamw8bit": AdamW with its moments m and v as blockwise 8-bit codes
  // (kernels.h AdamW8bit; Dettmers et al. 2021), about a quarter of their fp32 memory.
  Optimizer optimizer = Optimizer::kAdamW;
  bool operator==(const TrainSpec&) const = default;
};

struct ParallelSpec {
  int64_t dp = 1;           // data-parallel replicas
  int64_t pp = 1;           // pipeline stages (contiguous layer ranges, 1F1B over micro-batches)
  int64_t tp = 1;           // tensor-parallel ranks (Megatron column/row split of attention and MLP)
  int64_t micro_batch = 0;  // rows per forward/backward on a rank; 0 = the whole local batch
  // ZeRO stage over the dp group: 1 shards optimizer state, 2 also gradients, 3 also parameters
  // (gathered one layer at a time, and gathered again with its forward recomputed in backward).
  int64_t zero = 0;
  bool recompute = false;  // keep only each layer's input; recompute its forward in backward
  // Layers per pipeline stage, first to last (size pp, sum model.layers). Empty: the
  // coordinator fills in the planner's stages, balanced by compute and memory (the first stage
  // also holds the embedding, the last the head), when the run starts.
  std::vector<int64_t> stages;
  // Where AdamW's state lives: "none" (on the device), "optimizer" (m, v and the fp32 master in
  // pinned host memory, updated by the host's cores: worker/train/optimizer.h) or "optimizer+params"
  // (the parameters too, streamed to the device a layer at a time as ZeRO-3 gathers them:
  // worker/train/stage_model.h; needs zero = 3 and no recompute), or "auto" (the default): the planner
  // offloads only when no plan fits without it, the optimizer's state before the parameters
  // ("offload" in `automatic`; "none" until planned). A re-plan after an out-of-memory may turn
  // it on either way.
  Offload offload = Offload::kNone;
  // ZeRO-3 without recompute: how many of each stage's last layers keep their gathered weights
  // from the forward to the backward instead of gathering them again (FSDP's reshard_after_forward
  // = False for those layers): one all-gather fewer per layer and micro-batch, for a layer's
  // weights in the compute dtype held per micro-batch in flight. 0 = every layer is gathered
  // again; more than a stage's layers = all of them. "auto" (or absent): as many as the planner
  // finds room for (shard/estimator.cc). Other meshes ignore it (0).
  int64_t keep_gathered = 0;
  // Under tp > 1 where tp divides model.sequence: the norms, residual adds and biases between the
  // split matmuls run on each rank's 1/tp of the tokens (Megatron's sequence parallelism), each
  // all-reduce of a block becoming a reduce-scatter and an all-gather (the same bytes). false:
  // every tensor-parallel rank runs them on every token. Same checkpoints either way.
  bool sequence_parallel = true;
  // Under tp > 1 (Megatron's tensor-parallel communication overlap): f's backward collective (the
  // input gradient of the matmuls split by output rows, summed over the tensor-parallel ranks)
  // runs on a side stream while their weight gradients are computed; forward, f's gather runs
  // while the first projection multiplies the rank's own tokens, and g's sum in chunks while the
  // next chunk multiplies. false: every collective in turn. Same losses within the rounding of a
  // matmul over fewer rows and, at tp > 2, of the sums' order (bit for bit on CPU at tp = 2).
  bool tp_comm_overlap = true;
  // Train runs: the fields above that the spec leaves to the planner ("auto", or absent), from
  // {"dp", "pp", "tp", "micro_batch", "zero", "recompute", "keep_gathered", "offload"}; until the coordinator plans the
  // run they hold the single-worker values. Empty for extract runs and once planned.
  std::set<std::string> automatic;
  bool planned() const { return automatic.empty(); }
  // dp, pp and tp are fixed: the run takes that many workers, whatever else the planner fills in.
  bool mesh_fixed() const { return !automatic.count("dp") && !automatic.count("pp") && !automatic.count("tp"); }
  int64_t workers() const { return dp * pp * tp; }
  bool operator==(const ParallelSpec&) const = default;
};

// Activation capture. Rows are token positions: sequence i of the data (tokens
// [i * model.sequence, (i + 1) * model.sequence)) gives rows [i * sequence, (i + 1) * sequence).
struct ExtractSpec {
  std::vector<int64_t> layers;                      // ascending; default every layer
  std::vector<std::string> sites = {"resid_post"};  // ExtractSites(); docs/extract.md defines each
  StoredDType dtype = StoredDType::kFp32;           // stored dtype: fp32 | bf16 | fp16
  Precision precision = Precision::kFp32;           // compute: fp32, or bf16 autocast (CUDA workers)
  int64_t batch = 8;                                // sequences per chunk (the unit of storage and resume)
  int64_t tokens = 0;                               // capture at most this many tokens; 0 = the whole data file
  // "whole": each worker holds the model and captures its chunks; "layerwise": weights visit the
  // device one block at a time (models larger than the device); "auto": whole when the estimate
  // fits the device's free memory, else layerwise.
  ExtractMode mode = ExtractMode::kAuto;
  // > 0: the logits site keeps only each row's top k (values, descending) and their token ids
  // (site logits_ids, int32); 0: the whole [vocab] row.
  int64_t logits_top_k = 0;
  bool operator==(const ExtractSpec&) const = default;
};

// Patch runs (kind = "patch"): the model runs with `sites` of `layers` replaced, and stores the
// per-row next-token loss (site "loss") and, with `logits`, the logits (site "logits", top-k by
// extract.logits_top_k), chunked and scheduled as an extract run ([extract] batch, tokens, dtype,
// precision, mode apply).
struct PatchSpec {
  std::vector<int64_t> layers;          // ascending
  std::vector<std::string> sites;       // PatchableSites()
  Ablation ablation = Ablation::kZero;  // zero | mean | steer (capture: named, refused until built)
  std::string source;                   // ablation = "mean" / "steer": an fp32 .npy of the site's row shape
  double alpha = 1.0;                   // ablation = "steer": site += alpha * source's vector
  bool logits = false;
  bool operator==(const PatchSpec&) const = default;
};

// The sites an extract run can capture, in storage order: per-block sites, then the model-level
// final_norm and logits (stored under layer model.layers - 1), logits_ids (top-k only), and loss
// (patch runs only).
const std::vector<std::string>& ExtractSites();
// The sites a patch run can replace.
const std::vector<std::string>& PatchableSites();
// Sites computed once per model rather than per block; addressed as layer model.layers - 1.
bool IsModelLevelSite(const std::string& site);

struct RunSpec;

// The shape of one stored row (one token position) of `site` for this spec's model: [hidden]
// for the residual-width sites. A site's record of a chunk is [row_count, shape...]. Readers
// (activations index, Python package, export) take row widths from here, never from model.hidden.
std::vector<int64_t> ExtractSiteRowShape(const RunSpec& spec, const std::string& site);
// The dtype name a site's records are stored in: extract.dtype, except the sites of token ids
// (ExtractSiteHoldsIds: logits_ids, "i32").
std::string ExtractSiteDType(const RunSpec& spec, const std::string& site);
inline bool ExtractSiteHoldsIds(const std::string& site) { return site == "logits_ids"; }
// Bytes of one chunk's records (every captured layer and site) at the spec's extract.batch.
uint64_t ExtractChunkBytes(const RunSpec& spec);

struct WorkerSpec {
  int64_t threads = 1;
  bool operator==(const WorkerSpec&) const = default;
};

// LoRA (Hu et al. 2021) as PEFT computes it: each targeted linear y = x W^T + b becomes
//   y = x W^T + b + scale * (dropout(x) A^T) B^T,   A [rank, in], B [out, rank],
// scale = alpha / rank (alpha / sqrt(rank) with use_rslora). W and b are frozen (no gradient, no
// optimizer state, held in the compute dtype); only A and B train. A starts Kaiming-uniform
// (bound 1 / sqrt(in), PEFT's kaiming_uniform_(a = sqrt(5))) and B at zero, so step 1's loss is
// the base model's. Defaults are PEFT's LoraConfig's (r = 8, lora_alpha = 8, lora_dropout = 0).
struct LoraSpec {
  bool enabled = false;  // the spec has a [lora] table
  int64_t rank = 8;
  double alpha = 8.0;
  double dropout = 0.0;  // on the adapter's input, in training only
  // Hugging Face module names (LoraTargetModules: "q_proj", "c_attn", ...), in the family's order;
  // "all-linear" in the TOML is every one; absent: PEFT's default for the family.
  std::vector<std::string> target_modules;
  bool use_rslora = false;
  // "dense" (the base in the compute dtype) or "nf4" (QLoRA: every linear of the blocks as
  // bitsandbytes' NF4 - blocks of 64, double-quantized scales, 4.127 bits a weight - quantized as
  // it loads; the embedding, norms and head stay dense).
  LoraBase base = LoraBase::kDense;
  double scale() const;
  bool operator==(const LoraSpec&) const = default;
};

// The linears a family's adapters can target, by their Hugging Face module names, in block order
// (PEFT's "all-linear": every linear of a block; the head is not one of them), and PEFT's default
// targets when [lora] names none.
const std::vector<std::string>& LoraTargetModules(Family family);
// The LoRA settings of the PEFT adapter in `dir` (its adapter_config.json: r, lora_alpha,
// lora_dropout, target_modules in the family's order, use_rslora), for a base of `model`;
// enabled. InvalidArgument naming the file and field: not PEFT's LoRA, a module the family lacks,
// what Strata does not run (DoRA, biases, modules_to_save, a target regex).
Result<LoraSpec> ReadPeftLoraConfig(const std::string& dir, const ModelSpec& model);
// A number as the shortest text that reads back to it ("16", "0.1"): for messages.
std::string ShortestNumber(double x);
const std::vector<std::string>& DefaultLoraTargets(Family family);
// [in, out] widths of the targeted module's matrix (for GPT-2's c_proj, the attention's and the
// MLP's: both), smallest first among them: what lora.rank is checked against.
int64_t LoraNarrowestWidth(const ModelSpec& model, const std::vector<std::string>& modules);

// The intra-op thread count a worker with `cores` cores applies for worker.threads: at most its
// cores (more only oversubscribes them; 100000 hung a worker), 0 kept (LibTorch's default).
// The worker logs the clamp.
inline int64_t ClampWorkerThreads(int64_t threads, int64_t cores) {
  return std::min(threads, std::max<int64_t>(cores, 1));
}

struct RunSpec {
  std::string name;
  RunKind kind = RunKind::kTrain;  // or "extract", or "patch" (an extract run that patches)
  bool is_extract() const { return kind == RunKind::kExtract || kind == RunKind::kPatch; }
  bool is_patch() const { return kind == RunKind::kPatch; }
  // Train runs: sequences per data-parallel rank per step, and per forward/backward on a rank
  // (parallel.micro_batch, 0 = all of them).
  int64_t local_batch() const { return train.global_batch / std::max<int64_t>(parallel.dp, 1); }
  int64_t micro_batch_rows() const { return parallel.micro_batch > 0 ? parallel.micro_batch : local_batch(); }
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  ParallelSpec parallel;
  WorkerSpec worker;
  ExtractSpec extract;
  PatchSpec patch;
  LoraSpec lora;
  bool operator==(const RunSpec&) const = default;
};

// Spellings of [model] choices that name no value (model.activation = "relu"), which the TOML
// parser keeps to refuse them where the family's choices are checked (ValidateModelSpec, and
// ResolveHuggingFaceConfig's comparison with config.json), with the messages those give. The
// field itself holds its default meanwhile. Empty for a spec built in code.
struct UnknownModelChoices {
  std::optional<std::string> activation;
  std::optional<std::string> rope_scaling_type;
};

// Fills a model's defaults (kv_heads, ffn, head_dim, norm_eps, activation, gpt2's max_positions)
// and checks the fields against each other; messages start with `context`.
Status ValidateModelSpec(ModelSpec& m, const std::string& context, const UnknownModelChoices& unknown = {});

// Parses and validates. Relative data paths are resolved against `base_dir`. Does not touch
// the file system except to check the run's files (CheckRunSpecFiles) when `check_files` is set,
// and to read model.init_from's config.json (spec/hf_config.h), which fills the [model] table.
// Every number is checked against its bound (spec_bounds) and the name against ValidateRunName.
Result<RunSpec> ParseRunSpec(const std::string& toml_text, const std::string& base_dir, bool check_files);

// The canonical TOML `strata submit` sends (RunSpecToToml of a spec it parsed and checked): as
// ParseRunSpec, but model.init_from's config.json is not read again (every [model] field is
// written out) and no file is checked, so the coordinator, which opens none of a run's files,
// accepts a run whose files only its workers' hosts hold.
Result<RunSpec> ParseSubmittedRunSpec(const std::string& toml_text);

// The files a run reads, checked where they are opened (`strata submit`, each worker) so that a
// missing, short or malformed one is refused naming its key and path: data.path (its token layout
// and length), data.documents, data.tokenizer for text data, and patch.source.
Status CheckRunSpecFiles(const RunSpec& spec);

// A spec the coordinator stored (its canonical TOML, paths absolute): as ParseRunSpec without
// file checks, except that the name is not checked, so runs stored before the name rule (names
// with control bytes, long names) still load and print (through EscapeForTerminal).
Result<RunSpec> ParseStoredRunSpec(const std::string& toml_text);

// Checks the fixed [parallel] fields of a train run against its model and batch (ParseRunSpec
// does; the coordinator again after the planner fills the automatic ones).
Status ValidateParallel(const RunSpec& spec);

// Learning rate of 1-based `step`: constant, or linear warmup over warmup_steps then cosine from
// lr down to min_lr at the last step.
double LearningRate(const TrainSpec& train, int64_t step);

// Extract runs: sequences (of model.sequence tokens) the run captures, given the data file's
// token count, and the number of chunks (extract.batch sequences each, the last may be short).
int64_t ExtractSequences(const RunSpec& spec, int64_t data_tokens);
int64_t ExtractChunks(const RunSpec& spec, int64_t data_tokens);

// Canonical TOML of a validated spec (every key written, paths absolute); parses back equal.
std::string RunSpecToToml(const RunSpec& spec);

}  // namespace strata
