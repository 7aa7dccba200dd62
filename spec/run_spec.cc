#include "spec/run_spec.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "common/token_file.h"  // [data] file layouts (check_files)
#include "spec/hf_config.h"
#include "spec/run_spec_reader.h"
#include "spec/toml_text.h"

namespace strata {
using namespace run_spec_internal;  // Reader, ParseExtract, ParsePatch, ParseLora, CheckPatchSource
namespace {

namespace fs = std::filesystem;

// The [model] table. With model.init_from (and `resolve_config`), DIR/config.json supplies every
// field the spec leaves out and must agree with every one it gives (ResolveHuggingFaceConfig);
// only model.sequence, the run's window, is the spec's own.
Status ParseModel(Reader& r, const std::string& base_dir, bool resolve_config, ModelSpec* out) {
  ModelSpec& m = *out;
  const std::set<std::string> given = r.Keys("model");
  UnknownModelChoices unknown;  // refused where the family's choices are checked
  std::optional<std::string> unknown_family;
  STRATA_RETURN_IF_ERROR(r.Choice("model", "family", &m.family, &unknown_family));
  if (unknown_family) {
    return InvalidArgument("run spec: model.family = \"" + *unknown_family + "\" is not supported; use one of " +
                           FamilyList());
  }
  STRATA_RETURN_IF_ERROR(r.Int("model", "layers", &m.layers, 1, spec_bounds::kLayers));
  STRATA_RETURN_IF_ERROR(r.Int("model", "hidden", &m.hidden, 1, spec_bounds::kHidden));
  STRATA_RETURN_IF_ERROR(r.Int("model", "heads", &m.heads, 1, spec_bounds::kHeads));
  STRATA_RETURN_IF_ERROR(r.Int("model", "vocab", &m.vocab, 2, spec_bounds::kVocab));
  STRATA_RETURN_IF_ERROR(r.Int("model", "sequence", &m.sequence, 2, spec_bounds::kSequence));
  STRATA_RETURN_IF_ERROR(r.Int("model", "max_positions", &m.max_positions, 0, spec_bounds::kSequence));
  STRATA_RETURN_IF_ERROR(r.Int("model", "kv_heads", &m.kv_heads, 0, spec_bounds::kHeads));
  STRATA_RETURN_IF_ERROR(r.Int("model", "head_dim", &m.head_dim, 0, spec_bounds::kHidden));
  STRATA_RETURN_IF_ERROR(r.Int("model", "ffn", &m.ffn, 0, spec_bounds::kFfn));
  STRATA_RETURN_IF_ERROR(r.Float("model", "rope_theta", &m.rope_theta, 1.0, 1e12));
  STRATA_RETURN_IF_ERROR(r.RopeScalingTable("model", "rope_scaling", &m.rope_scaling, &unknown.rope_scaling_type));
  STRATA_RETURN_IF_ERROR(r.Float("model", "rotary_pct", &m.rotary_pct, 0.0, 1.0));
  STRATA_RETURN_IF_ERROR(r.Float("model", "norm_eps", &m.norm_eps, 0.0, 1.0));
  std::optional<bool> attention_bias, tie_embeddings;
  STRATA_RETURN_IF_ERROR(r.OptionalBool("model", "attention_bias", &attention_bias));
  STRATA_RETURN_IF_ERROR(r.Bool("model", "mlp_bias", &m.mlp_bias));
  STRATA_RETURN_IF_ERROR(r.OptionalBool("model", "tie_embeddings", &tie_embeddings));
  STRATA_RETURN_IF_ERROR(r.Int("model", "sliding_window", &m.sliding_window, 0, spec_bounds::kSequence));
  STRATA_RETURN_IF_ERROR(r.Bool("model", "parallel_residual", &m.parallel_residual));
  STRATA_RETURN_IF_ERROR(r.Choice("model", "activation", &m.activation, &unknown.activation));
  STRATA_RETURN_IF_ERROR(r.String("model", "init_from", &m.init_from));
  STRATA_RETURN_IF_ERROR(r.String("model", "adapter_from", &m.adapter_from));
  if (!m.adapter_from.empty()) {
    fs::path adapter(m.adapter_from);
    if (adapter.is_relative() && !base_dir.empty()) adapter = fs::path(base_dir) / adapter;
    m.adapter_from = adapter.lexically_normal().string();
  }
  if (m.family == Family::kGpt2 && tie_embeddings == false) {
    return InvalidArgument(
        "run spec: model.tie_embeddings = false: gpt2's head is always its token embedding; remove it");
  }
  // Family defaults for what the spec leaves out.
  m.attention_bias = attention_bias.value_or(m.family == Family::kGptNeox);
  m.tie_embeddings = tie_embeddings.value_or(m.family == Family::kGpt2 || m.family == Family::kGemma);

  // Fields that mean something to some families only: given to another, they are a mistake.
  // Families in the alphabetical order of their names, as the message lists them.
  using F = Family;
  static const std::map<std::string, std::vector<Family>> kFamilyOnly = {
      {"kv_heads", {F::kGemma, F::kLlama, F::kMistral, F::kOlmo2, F::kQwen2, F::kQwen3}},
      {"head_dim", {F::kGemma, F::kLlama, F::kMistral, F::kOlmo2, F::kQwen2, F::kQwen3}},
      {"rope_theta", {F::kGemma, F::kGptNeox, F::kLlama, F::kMistral, F::kOlmo2, F::kQwen2, F::kQwen3}},
      {"rope_scaling", {F::kLlama, F::kMistral, F::kOlmo2, F::kQwen2, F::kQwen3}},
      {"rotary_pct", {F::kGptNeox}},
      {"attention_bias", {F::kGemma, F::kGptNeox, F::kLlama, F::kOlmo2, F::kQwen3}},
      {"mlp_bias", {F::kLlama}},
      {"sliding_window", {F::kMistral}},
      {"parallel_residual", {F::kGptNeox}},
  };
  for (const auto& [field, families] : kFamilyOnly) {
    if (given.count(field) && std::find(families.begin(), families.end(), m.family) == families.end()) {
      std::string list;
      for (Family f : families) list += (list.empty() ? "" : ", ") + std::string(Name(f));
      return InvalidArgument("run spec: model." + field + " applies to families " + list + " only; remove it for " +
                             std::string(Name(m.family)));
    }
  }

  if (!m.init_from.empty()) {
    fs::path init(m.init_from);
    if (init.is_relative() && !base_dir.empty()) init = fs::path(base_dir) / init;
    m.init_from = init.lexically_normal().string();
    if (resolve_config) {
      // An unknown spelling disagrees with config.json's value, which replaces every field.
      STRATA_RETURN_IF_ERROR(ResolveHuggingFaceConfig(m.init_from, given, &m, unknown));
      unknown = {};
    }
  }
  return ValidateModelSpec(m, "run spec: ", unknown);
}

// The nonlinearity each family runs when model.activation leaves it out, and the ones it admits
// (in the alphabetical order of their names, as the message lists them).
Activation DefaultActivation(Family family) {
  switch (family) {
    case Family::kGptNeox:
      return Activation::kGelu;
    case Family::kLlama:
    case Family::kMistral:
    case Family::kQwen2:
    case Family::kQwen3:
    case Family::kOlmo2:
      return Activation::kSilu;
    case Family::kGpt2:
    case Family::kGemma:
      return Activation::kGeluTanh;
  }
  return Activation::kGeluTanh;
}

std::vector<Activation> FamilyActivations(Family family) {
  switch (family) {
    case Family::kGpt2:
      return {Activation::kGeluTanh};
    case Family::kLlama:
    case Family::kMistral:
    case Family::kQwen2:
    case Family::kQwen3:
    case Family::kOlmo2:
      return {Activation::kSilu};
    case Family::kGemma:
    case Family::kGptNeox:
      return {Activation::kGelu, Activation::kGeluTanh};
  }
  return {};
}

}  // namespace

int64_t ModelSpec::rotary_dims() const {
  if (!rotary()) return 0;
  const int64_t dims =
      static_cast<int64_t>(static_cast<double>(head_size()) * rotary_pct);  // as transformers: int(head_size * pct)
  return dims - dims % 2;
}

Status ValidateModelSpec(ModelSpec& m, const std::string& context, const UnknownModelChoices& unknown) {
  const auto msg = [&](const std::string& text) { return InvalidArgument(context + text); };
  const auto str = [](int64_t v) { return std::to_string(v); };
  const std::string family(Name(m.family));
  const bool gpt2 = m.family == Family::kGpt2, neox = m.family == Family::kGptNeox;
  const bool grouped = !gpt2 && !neox;  // families with kv_heads and head_dim
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.ffn == 0) m.ffn = 4 * m.hidden;
  if (m.norm_eps == 0.0) m.norm_eps = m.rms_norm() ? 1e-6 : 1e-5;
  if (m.activation == Activation::kFamilyDefault) m.activation = DefaultActivation(m.family);
  if (gpt2 && m.max_positions == 0) m.max_positions = m.sequence;
  if (!grouped || m.head_dim == 0) {
    if (m.hidden % m.heads != 0) {
      return msg("model.heads = " + str(m.heads) + " does not divide model.hidden = " + str(m.hidden) +
                 "; choose heads so that hidden % heads == 0" + (grouped ? " (or set model.head_dim)" : ""));
    }
    if (m.head_dim != 0 && m.head_dim != m.hidden / m.heads) {
      return msg("model.head_dim = " + str(m.head_dim) + " but " + family +
                 " heads are hidden / heads = " + str(m.hidden / m.heads));
    }
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0) {
    return msg("model.kv_heads = " + str(m.kv_heads) + " does not divide model.heads = " + str(m.heads) +
               "; each key/value head must serve a whole number of query heads");
  }
  if (!grouped && m.kv_heads != m.heads) {
    return msg("model.kv_heads applies to families llama, mistral, qwen2, qwen3, olmo2, gemma only; remove it for " +
               family);
  }
  if (m.heads * m.head_dim > spec_bounds::kFfn)
    return msg("model.heads x model.head_dim = " + str(m.heads * m.head_dim) + " is over the bound of " +
               str(spec_bounds::kFfn));
  if (m.rotary() &&
      (m.rotary_dims() < 2 || m.rotary_dims() % 2 != 0 || (m.rotary_pct == 1.0 && m.head_size() % 2 != 0))) {
    return msg("the rotary part of a head is " + str(m.rotary_dims()) + " dimensions (model.head_dim " +
               str(m.head_size()) + (neox ? " x model.rotary_pct" : "") +
               "); rotary embeddings need an even number >= 2");
  }
  const std::vector<Activation> activations = FamilyActivations(m.family);
  if (unknown.activation || std::find(activations.begin(), activations.end(), m.activation) == activations.end()) {
    std::string list;
    for (Activation a : activations) list += (list.empty() ? "\"" : ", \"") + std::string(Name(a)) + "\"";
    return msg("model.activation = \"" + unknown.activation.value_or(std::string(Name(m.activation))) +
               "\" is not supported for " + family + "; use " + list);
  }
  if (gpt2) m.tie_embeddings = true;  // its head is always the token embedding
  const RopeScaling& rs = m.rope_scaling;
  if (unknown.rope_scaling_type) {
    return msg("model.rope_scaling.type = \"" + *unknown.rope_scaling_type + "\" is not supported; use " +
               ChoiceList<RopeScalingType>());
  }
  if (rs.type == RopeScalingType::kLlama3 && !(rs.high_freq_factor > rs.low_freq_factor)) {
    return msg("model.rope_scaling.high_freq_factor must be larger than low_freq_factor (Llama 3.1: 4.0 and 1.0)");
  }
  if (m.max_positions > 0 && m.sequence > m.max_positions) {
    return msg("model.sequence = " + str(m.sequence) + " exceeds model.max_positions = " + str(m.max_positions) +
               (gpt2 ? " (gpt2's learned positions)" : " (the positions the model was trained for)") +
               "; shorten model.sequence");
  }
  return Status::Ok();
}

namespace {
// `check_name`: the name rule and today's defaults for absent keys (false: a stored spec, whose
// absent keys mean what they meant when it was stored); `resolve_config`: model.init_from's
// config.json fills and checks [model].
Result<RunSpec> Parse(const std::string& toml_text, const std::string& base_dir, bool check_name, bool resolve_config);
}  // namespace

Result<RunSpec> ParseRunSpec(const std::string& toml_text, const std::string& base_dir, bool check_files) {
  STRATA_ASSIGN_OR_RETURN(RunSpec spec, Parse(toml_text, base_dir, /*check_name=*/true, /*resolve_config=*/true));
  if (check_files) STRATA_RETURN_IF_ERROR(CheckRunSpecFiles(spec));
  return spec;
}

Result<RunSpec> ParseSubmittedRunSpec(const std::string& toml_text) {
  return Parse(toml_text, "", /*check_name=*/true, /*resolve_config=*/false);
}

Result<RunSpec> ParseStoredRunSpec(const std::string& toml_text) {
  return Parse(toml_text, "", /*check_name=*/false, /*resolve_config=*/false);
}

// The files a run opens where its data is read (a worker, or `strata submit` on the user's
// machine), checked before any work starts so a missing or short file is refused naming it.
Status CheckRunSpecFiles(const RunSpec& spec) {
  if (spec.data.format == TokenFormat::kText) {
    std::error_code ec;
    if (!fs::is_regular_file(spec.data.path, ec)) {
      return InvalidArgument("run spec: data.path = \"" + spec.data.path + "\" does not exist or is not a file");
    }
    if (!fs::is_regular_file(spec.data.tokenizer + "/tokenizer.json", ec) &&
        !fs::is_regular_file(spec.data.tokenizer + "/tokenizer.model", ec)) {
      return InvalidArgument("run spec: data.tokenizer = \"" + spec.data.tokenizer +
                             "\" holds neither tokenizer.json nor tokenizer.model");
    }
  } else {
    std::error_code ec;
    if (!fs::is_regular_file(spec.data.path, ec)) {
      return InvalidArgument("run spec: data.path = \"" + spec.data.path + "\" does not exist or is not a file");
    }
    auto layout = ReadTokenFileLayout(spec.data.path, spec.data.format);
    if (!layout.ok()) return InvalidArgument("run spec: " + layout.status().message());
    if (layout->tokens < static_cast<uint64_t>(spec.model.sequence + 1)) {
      return InvalidArgument("run spec: data.path = \"" + spec.data.path + "\" holds " +
                             std::to_string(layout->tokens) + " tokens, fewer than model.sequence + 1 = " +
                             std::to_string(spec.model.sequence + 1) + "; use a larger file or a shorter sequence");
    }
    if (!spec.data.documents.empty()) {
      if (!fs::is_regular_file(spec.data.documents, ec)) {
        return InvalidArgument("run spec: data.documents = \"" + spec.data.documents +
                               "\" does not exist or is not a file");
      }
      // The size and header here; the offsets themselves when a worker loads them (TokenData).
      auto documents = ReadDocumentsLayout(spec.data.documents);
      if (!documents.ok()) return InvalidArgument("run spec: " + documents.status().message());
    }
  }

  if (spec.is_patch()) STRATA_RETURN_IF_ERROR(CheckPatchSource(spec));
  return Status::Ok();
}

namespace {
Result<RunSpec> Parse(const std::string& toml_text, const std::string& base_dir, bool check_name, bool resolve_config) {
  STRATA_RETURN_IF_ERROR(CheckTomlText(toml_text, "run spec"));
  toml::table root;
  try {
    root = toml::parse(toml_text);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "run spec is not valid TOML at line " << e.source().begin.line << ", column " << e.source().begin.column
        << ": " << e.description();
    return InvalidArgument(msg.str());
  }
  Reader r(root);
  STRATA_RETURN_IF_ERROR(r.CheckKeys());

  RunSpec spec;
  STRATA_RETURN_IF_ERROR(r.String("", "name", &spec.name));
  if (spec.name.empty()) spec.name = "run";
  if (check_name) STRATA_RETURN_IF_ERROR(ValidateRunName(spec.name));
  STRATA_RETURN_IF_ERROR(r.Choice("", "kind", &spec.kind));
  if (root.contains("patch") && !spec.is_patch()) {
    return InvalidArgument("run spec: a [patch] table needs kind = \"patch\" at the top of the spec");
  }
  if (root.contains("extract") && !spec.is_extract()) {
    return InvalidArgument("run spec: an [extract] table needs kind = \"extract\" at the top of the spec");
  }

  ModelSpec& m = spec.model;
  // A stored spec (ParseStoredRunSpec) carries every field already; its init_from may be gone.
  STRATA_RETURN_IF_ERROR(ParseModel(r, base_dir, resolve_config, &m));

  STRATA_RETURN_IF_ERROR(r.String("data", "path", &spec.data.path));
  std::optional<std::string> unknown_format;  // refused once data.path is checked to be given
  STRATA_RETURN_IF_ERROR(r.Choice("data", "format", &spec.data.format, &unknown_format));
  STRATA_RETURN_IF_ERROR(r.String("data", "documents", &spec.data.documents));
  STRATA_RETURN_IF_ERROR(r.Bool("data", "sample_within_documents", &spec.data.sample_within_documents));
  STRATA_RETURN_IF_ERROR(r.String("data", "tokenizer", &spec.data.tokenizer));
  const bool text = spec.data.format == TokenFormat::kText;
  if (!spec.data.tokenizer.empty() && !text) {
    return InvalidArgument(
        "run spec: data.tokenizer applies to data.format = \"text\" only; remove it, or set the format");
  }
  if (text && spec.data.tokenizer.empty()) spec.data.tokenizer = m.init_from;
  if (text && spec.data.tokenizer.empty()) {
    return InvalidArgument(
        "run spec: data.format = \"text\" needs a tokenizer: set data.tokenizer to a model directory with "
        "tokenizer.json or tokenizer.model (or model.init_from, whose tokenizer is the default)");
  }
  if (spec.data.path.empty()) {
    return InvalidArgument(
        "run spec: data.path is missing; set it to a text file (format = \"bytes\") or a token file (\"u16\", \"u32\", "
        "\"npy\")");
  }
  if (unknown_format) {
    return InvalidArgument("run spec: data.format = \"" + *unknown_format + "\" is not supported; use " +
                           kTokenFormats + ", or \"text\" with data.tokenizer");
  }
  if (spec.data.format == TokenFormat::kBytes && m.vocab < 256) {
    return InvalidArgument("run spec: model.vocab = " + std::to_string(m.vocab) +
                           " is too small for data.format = \"bytes\"; byte tokens need vocab >= 256");
  }
  if (spec.data.sample_within_documents && spec.data.documents.empty()) {
    return InvalidArgument(
        "run spec: data.sample_within_documents = true needs data.documents, a file of document start offsets "
        "(little-endian u64, or a .npy of int64)");
  }
  if (!spec.data.documents.empty() && !spec.data.sample_within_documents && !spec.is_extract()) {
    return InvalidArgument(
        "run spec: data.documents is read only with data.sample_within_documents = true (or by extract "
        "runs, to number the rows' documents); set it, or remove data.documents");
  }
  if (spec.data.sample_within_documents && spec.is_extract()) {
    return InvalidArgument(
        "run spec: data.sample_within_documents applies to train runs; an extract run captures the file's "
        "sequences in order, so remove it (data.documents alone numbers the rows' documents)");
  }
  auto absolute = [&](const std::string& path) {
    fs::path p(path);
    if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
    return p.lexically_normal().string();
  };
  spec.data.path = absolute(spec.data.path);
  if (!spec.data.documents.empty()) spec.data.documents = absolute(spec.data.documents);
  if (!spec.data.tokenizer.empty()) spec.data.tokenizer = absolute(spec.data.tokenizer);
  TrainSpec& t = spec.train;
  STRATA_RETURN_IF_ERROR(r.Int("train", "steps", &t.steps, 1, spec_bounds::kSteps));
  STRATA_RETURN_IF_ERROR(r.Int("train", "global_batch", &t.global_batch, 1, spec_bounds::kGlobalBatch));
  STRATA_RETURN_IF_ERROR(r.Float("train", "lr", &t.lr, 0.0, 10.0));
  STRATA_RETURN_IF_ERROR(r.Float("train", "weight_decay", &t.weight_decay, 0.0, 10.0));
  STRATA_RETURN_IF_ERROR(r.Float("train", "beta1", &t.beta1, 0.0, 0.999999));
  STRATA_RETURN_IF_ERROR(r.Float("train", "beta2", &t.beta2, 0.0, 0.999999));
  STRATA_RETURN_IF_ERROR(r.Float("train", "eps", &t.eps, 0.0, spec_bounds::kMaxEps));
  if (!(t.eps > 0)) {
    return InvalidArgument("run spec: train.eps = 0 must be > 0 (AdamW divides by sqrt(v) + eps); the default is 1e-8");
  }
  STRATA_RETURN_IF_ERROR(r.Float("train", "grad_clip", &t.grad_clip, 0.0, 1e9));
  STRATA_RETURN_IF_ERROR(r.Int("train", "seed", &t.seed, 0, std::numeric_limits<int64_t>::max()));
  {
    std::set<std::string> automatic;  // "auto" (or absent): TrainSpec::kAutoCheckpoints
    if (r.IsAuto("train", "checkpoint_every", &automatic)) {
      t.checkpoint_every = TrainSpec::kAutoCheckpoints;
    } else if (r.Has("train", "checkpoint_every") && r.IsString("train", "checkpoint_every")) {
      return InvalidArgument("run spec: train.checkpoint_every must be an integer (0 = only at the end) or \"auto\"");
    } else {
      STRATA_RETURN_IF_ERROR(r.Int("train", "checkpoint_every", &t.checkpoint_every, 0, spec_bounds::kSteps));
    }
  }
  // Retention: the newest N complete checkpoints are kept (0: all). A million is more than any
  // disk holds of a model worth checkpointing.
  STRATA_RETURN_IF_ERROR(r.Int("train", "keep_checkpoints", &t.keep_checkpoints, 0, 1000000));
  // A stored spec without the key (an older coordinator's) kept every checkpoint.
  if (!check_name && !r.Has("train", "keep_checkpoints")) t.keep_checkpoints = 0;
  if (t.lr <= 0) return InvalidArgument("run spec: train.lr must be > 0");
  STRATA_RETURN_IF_ERROR(r.Choice("train", "lr_schedule", &t.lr_schedule));
  STRATA_RETURN_IF_ERROR(r.Int("train", "warmup_steps", &t.warmup_steps, 0, spec_bounds::kSteps));
  STRATA_RETURN_IF_ERROR(r.Float("train", "min_lr", &t.min_lr, 0.0, 10.0));
  if (t.min_lr > t.lr) return InvalidArgument("run spec: train.min_lr must not exceed train.lr");
  STRATA_RETURN_IF_ERROR(r.Choice("train", "precision", &t.precision));
  STRATA_RETURN_IF_ERROR(r.Bool("train", "cuda_graphs", &t.cuda_graphs));
  STRATA_RETURN_IF_ERROR(r.Choice("train", "optimizer", &t.optimizer));

  STRATA_RETURN_IF_ERROR(r.Int("worker", "threads", &spec.worker.threads, 0, spec_bounds::kThreads));
  STRATA_RETURN_IF_ERROR(ParseLora(r, root.contains("lora"), resolve_config, &spec));
  ParallelSpec& p = spec.parallel;
  if (spec.is_extract()) {  // workers to capture with; not planned
    STRATA_RETURN_IF_ERROR(r.Int("parallel", "dp", &p.dp, 1, spec_bounds::kWorkers));
    if (spec.is_patch()) STRATA_RETURN_IF_ERROR(ParsePatch(r, base_dir, &spec));
    STRATA_RETURN_IF_ERROR(ParseExtract(r, &spec));
    return spec;
  }
  // Train runs: each field is fixed here or left to the planner when the run starts.
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "dp", &p.dp, 1, spec_bounds::kWorkers, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "pp", &p.pp, 1, spec_bounds::kLayers, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "tp", &p.tp, 1, spec_bounds::kHeads, &p.automatic));
  STRATA_RETURN_IF_ERROR(
      r.IntOrAuto("parallel", "micro_batch", &p.micro_batch, 0, spec_bounds::kGlobalBatch, &p.automatic));
  STRATA_RETURN_IF_ERROR(r.IntOrAuto("parallel", "zero", &p.zero, 0, std::numeric_limits<int64_t>::max(),
                                     &p.automatic));  // 0-3: ValidateParallel
  STRATA_RETURN_IF_ERROR(r.BoolOrAuto("parallel", "recompute", &p.recompute, &p.automatic));
  // A stored spec carries every field (RunSpecToToml); one stored before keep_gathered existed
  // ran with every layer gathered again: its missing key is 0, not the planner's.
  if (check_name || r.Has("parallel", "keep_gathered")) {
    STRATA_RETURN_IF_ERROR(
        r.IntOrAuto("parallel", "keep_gathered", &p.keep_gathered, 0, spec_bounds::kLayers, &p.automatic));
  }
  STRATA_RETURN_IF_ERROR(r.Bool("parallel", "sequence_parallel", &p.sequence_parallel));
  STRATA_RETURN_IF_ERROR(r.Bool("parallel", "tp_comm_overlap", &p.tp_comm_overlap));
  STRATA_RETURN_IF_ERROR(r.IntList("parallel", "stages", &p.stages, "auto"));
  // As keep_gathered: a stored spec without the key (an older coordinator's) ran offloading nothing.
  if ((check_name || r.Has("parallel", "offload")) && r.IsAuto("parallel", "offload", &p.automatic)) {
    p.offload = Offload::kNone;  // until planned (the single-worker value, as the other automatic fields)
  } else {
    std::optional<std::string> unknown;
    STRATA_RETURN_IF_ERROR(r.Choice("parallel", "offload", &p.offload, &unknown));
    if (unknown) {
      return InvalidArgument(
          "run spec: parallel.offload = \"" + *unknown +
          "\" is not supported; use \"auto\" (the default: only when nothing fits without it), \"none\", \"optimizer\" "
          "(optimizer state in host memory) or \"optimizer+params\" (parameters too, streamed to the GPU a layer at a "
          "time)");
    }
  }
  // keep_gathered applies to ZeRO-3 without recompute: left to the planner on a mesh that is fixed
  // to something else, it is 0 (and leaves nothing to plan).
  const bool zero3_streamed_possible =
      (p.automatic.count("zero") || p.zero == 3) && (p.automatic.count("recompute") || !p.recompute);
  if (p.automatic.count("keep_gathered") && !zero3_streamed_possible) {
    p.automatic.erase("keep_gathered");
    p.keep_gathered = 0;
  }
  // offload "auto" is searched with the mesh: a spec that fixes every other field runs as given
  // (its estimate is the user's call), offloading nothing unless an out-of-memory re-plan does.
  if (p.automatic.count("offload") && std::all_of(p.automatic.begin(), p.automatic.end(), [](const std::string& f) {
        return f == "offload" || f == "keep_gathered";
      })) {
    p.automatic.erase("offload");
    p.offload = Offload::kNone;
  }
  STRATA_RETURN_IF_ERROR(ValidateParallel(spec));
  return spec;
}
}  // namespace

Status ValidateParallel(const RunSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  const ModelSpec& m = spec.model;
  const TrainSpec& t = spec.train;
  auto fixed = [&](const char* field) { return !p.automatic.count(field); };
  if (fixed("dp") && t.global_batch % p.dp != 0) {
    return InvalidArgument("run spec: train.global_batch = " + std::to_string(t.global_batch) +
                           " is not divisible by parallel.dp = " + std::to_string(p.dp) +
                           "; make the global batch a multiple of dp");
  }
  if (fixed("micro_batch") && p.micro_batch > 0) {
    const int64_t local_batch = fixed("dp") ? t.global_batch / p.dp : t.global_batch;
    if (local_batch % p.micro_batch != 0) {
      return InvalidArgument(
          "run spec: parallel.micro_batch = " + std::to_string(p.micro_batch) +
          " does not divide the per-rank batch train.global_batch / parallel.dp = " + std::to_string(local_batch));
    }
  }
  if (fixed("dp") && fixed("pp") && fixed("tp") &&
      p.dp * p.pp * p.tp > spec_bounds::kWorkers) {  // each <= 2^16: no overflow
    return OverBound("parallel.dp * parallel.pp * parallel.tp", std::to_string(p.dp * p.pp * p.tp),
                     std::to_string(spec_bounds::kWorkers));
  }
  if (fixed("zero") && p.zero > 3) {
    return InvalidArgument("run spec: parallel.zero = " + std::to_string(p.zero) +
                           " is outside 0-3; use 1 (sharded optimizer state), 2 (and gradients) or 3 (and parameters)");
  }
  if (fixed("keep_gathered") && p.keep_gathered > 0) {
    // Only ZeRO-3 without recompute gathers a layer again for its backward.
    if (fixed("zero") && p.zero != 3) {
      return InvalidArgument(
          "run spec: parallel.keep_gathered = " + std::to_string(p.keep_gathered) +
          " keeps ZeRO-3's gathered layers for the backward, but parallel.zero = " + std::to_string(p.zero) +
          " gathers none; set parallel.keep_gathered = 0 (or leave it out), or parallel.zero = 3");
    }
    if (fixed("recompute") && p.recompute) {
      return InvalidArgument(
          "run spec: parallel.keep_gathered = " + std::to_string(p.keep_gathered) +
          " does not combine with parallel.recompute = true (a recomputed layer gathers its fp32 weights again "
          "by design); set parallel.keep_gathered = 0 or parallel.recompute = false");
    }
  }
  if (p.offload == Offload::kOptimizerAndParams) {
    // The parameters stream from host memory as ZeRO-3 gathers them, without recompute
    // (worker/train/stage_model.h): the planner picks those when the fields are left to it.
    if (fixed("zero") && p.zero != 3) {
      return InvalidArgument(
          "run spec: parallel.offload = \"optimizer+params\" streams every layer as ZeRO-3 does, but parallel.zero = " +
          std::to_string(p.zero) + "; set parallel.zero = 3 or \"auto\"");
    }
    if (fixed("recompute") && p.recompute) {
      return InvalidArgument(
          "run spec: parallel.offload = \"optimizer+params\" does not combine with parallel.recompute = true (the "
          "streamed layers keep their activations); set parallel.recompute = false or \"auto\"");
    }
  }
  if (fixed("pp") && p.pp > m.layers) {
    return InvalidArgument("run spec: parallel.pp = " + std::to_string(p.pp) + " exceeds model.layers = " +
                           std::to_string(m.layers) + "; every pipeline stage needs at least one layer");
  }
  if (!p.stages.empty()) {
    auto listed = [&] {
      std::string text;
      for (int64_t n : p.stages) text += (text.empty() ? "" : ", ") + std::to_string(n);
      return "parallel.stages = [" + text + "]";
    };
    if (!fixed("pp") || static_cast<int64_t>(p.stages.size()) != p.pp) {
      return InvalidArgument(
          "run spec: " + listed() + " has " + std::to_string(p.stages.size()) + " stages but parallel.pp is " +
          (fixed("pp") ? std::to_string(p.pp) : std::string("\"auto\"")) +
          "; give one layer count per pipeline stage with pp fixed, or leave stages out for balanced ones");
    }
    int64_t sum = 0;
    for (int64_t n : p.stages) {
      if (n < 1)
        return InvalidArgument("run spec: " + listed() + " gives a stage no layers; every stage needs at least one");
      if (n > m.layers) {  // checked before the sum, which then cannot overflow
        return InvalidArgument("run spec: " + listed() + " gives a stage " + std::to_string(n) +
                               " layers but model.layers = " + std::to_string(m.layers) +
                               "; the counts must add up to the model's layers");
      }
      sum += n;
    }
    if (sum != m.layers) {
      return InvalidArgument("run spec: " + listed() + " covers " + std::to_string(sum) +
                             " layers but model.layers = " + std::to_string(m.layers) +
                             "; the counts must add up to the model's layers");
    }
  }
  if (fixed("tp") && (m.heads % p.tp != 0 || m.kv_heads % p.tp != 0)) {
    return InvalidArgument("run spec: parallel.tp = " + std::to_string(p.tp) +
                           " does not divide model.heads = " + std::to_string(m.heads) +
                           (m.kv_heads != m.heads ? " and model.kv_heads = " + std::to_string(m.kv_heads) : "") +
                           "; each tensor-parallel rank takes whole heads");
  }
  if (spec.lora.enabled) STRATA_RETURN_IF_ERROR(CheckLoraMesh(spec));
  if (fixed("tp") && m.ffn % p.tp != 0) {
    return InvalidArgument("run spec: parallel.tp = " + std::to_string(p.tp) + " does not divide model.ffn = " +
                           std::to_string(m.ffn) + "; each tensor-parallel rank takes an equal slice of the MLP");
  }
  return Status::Ok();
}

double LearningRate(const TrainSpec& train, int64_t step) {
  if (train.warmup_steps > 0 && step <= train.warmup_steps) {
    return train.lr * static_cast<double>(step) / static_cast<double>(train.warmup_steps);
  }
  if (train.lr_schedule != LrSchedule::kCosine) return train.lr;
  const int64_t decay_steps = train.steps - train.warmup_steps;
  if (decay_steps <= 0) return train.lr;
  const double progress = static_cast<double>(step - train.warmup_steps) / static_cast<double>(decay_steps);
  return train.min_lr + 0.5 * (train.lr - train.min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

}  // namespace strata
