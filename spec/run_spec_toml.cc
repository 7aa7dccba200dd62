// RunSpecToToml (run_spec.h): a validated spec written back as the TOML it parses from.
#include <toml++/toml.h>

#include <sstream>

#include "spec/run_spec.h"

namespace strata {

namespace {

// Every [model] key of the family (ParseModel refuses the others), values as validated.
toml::table ModelToToml(const ModelSpec& m) {
  toml::table t{{"family", Name(m.family)},
                {"layers", m.layers},
                {"hidden", m.hidden},
                {"heads", m.heads},
                {"ffn", m.ffn},
                {"vocab", m.vocab},
                {"sequence", m.sequence},
                {"norm_eps", m.norm_eps},
                {"activation", Name(m.activation)},
                {"tie_embeddings", m.tie_embeddings}};
  if (m.max_positions > 0) t.insert("max_positions", m.max_positions);
  const Family f = m.family;
  const bool grouped = f != Family::kGpt2 && f != Family::kGptNeox;
  if (grouped) {
    t.insert("kv_heads", m.kv_heads);
    t.insert("head_dim", m.head_dim);
  }
  if (m.rotary()) t.insert("rope_theta", m.rope_theta);
  if (f == Family::kLlama || f == Family::kMistral || f == Family::kQwen2 || f == Family::kQwen3 ||
      f == Family::kOlmo2) {
    const RopeScaling& rs = m.rope_scaling;
    t.insert("rope_scaling", toml::table{{"type", Name(rs.type)},
                                         {"factor", rs.factor},
                                         {"low_freq_factor", rs.low_freq_factor},
                                         {"high_freq_factor", rs.high_freq_factor},
                                         {"original_max_positions", rs.original_max_positions}});
  }
  if (f == Family::kGptNeox) {
    t.insert("rotary_pct", m.rotary_pct);
    t.insert("parallel_residual", m.parallel_residual);
  }
  if (f == Family::kLlama || f == Family::kGemma || f == Family::kGptNeox) t.insert("attention_bias", m.attention_bias);
  if (f == Family::kLlama) t.insert("mlp_bias", m.mlp_bias);
  if (f == Family::kMistral) t.insert("sliding_window", m.sliding_window);
  if (!m.init_from.empty()) t.insert("init_from", m.init_from);
  if (!m.adapter_from.empty()) t.insert("adapter_from", m.adapter_from);
  return t;
}

}  // namespace

std::string RunSpecToToml(const RunSpec& spec) {
  toml::table root;
  root.insert("name", spec.name);
  root.insert("kind", Name(spec.kind));
  root.insert("model", ModelToToml(spec.model));
  root.insert("data", toml::table{{"path", spec.data.path}, {"format", Name(spec.data.format)}});
  if (!spec.data.documents.empty()) {
    root["data"].as_table()->insert("documents", spec.data.documents);
    root["data"].as_table()->insert("sample_within_documents", spec.data.sample_within_documents);
  }
  if (!spec.data.tokenizer.empty()) root["data"].as_table()->insert("tokenizer", spec.data.tokenizer);
  root.insert("train", toml::table{{"steps", spec.train.steps},
                                   {"global_batch", spec.train.global_batch},
                                   {"lr", spec.train.lr},
                                   {"weight_decay", spec.train.weight_decay},
                                   {"beta1", spec.train.beta1},
                                   {"beta2", spec.train.beta2},
                                   {"eps", spec.train.eps},
                                   {"grad_clip", spec.train.grad_clip},
                                   {"seed", spec.train.seed},

                                   {"keep_checkpoints", spec.train.keep_checkpoints},
                                   {"lr_schedule", Name(spec.train.lr_schedule)},
                                   {"warmup_steps", spec.train.warmup_steps},
                                   {"min_lr", spec.train.min_lr},
                                   {"precision", Name(spec.train.precision)},
                                   {"cuda_graphs", spec.train.cuda_graphs},
                                   {"optimizer", Name(spec.train.optimizer)}});
  toml::table& train = *root["train"].as_table();
  if (spec.train.checkpoint_every == TrainSpec::kAutoCheckpoints)
    train.insert("checkpoint_every", "auto");
  else
    train.insert("checkpoint_every", spec.train.checkpoint_every);
  toml::table parallel{{"dp", spec.parallel.dp},
                       {"pp", spec.parallel.pp},
                       {"tp", spec.parallel.tp},
                       {"micro_batch", spec.parallel.micro_batch},
                       {"zero", spec.parallel.zero},
                       {"recompute", spec.parallel.recompute},
                       {"keep_gathered", spec.parallel.keep_gathered},
                       {"sequence_parallel", spec.parallel.sequence_parallel},
                       {"tp_comm_overlap", spec.parallel.tp_comm_overlap},
                       {"offload", Name(spec.parallel.offload)}};
  if (!spec.parallel.stages.empty()) {
    toml::array stages;
    for (int64_t n : spec.parallel.stages) stages.push_back(n);
    parallel.insert("stages", std::move(stages));
  }
  for (const auto& field : spec.parallel.automatic) parallel.insert_or_assign(field, "auto");
  root.insert("parallel", std::move(parallel));
  root.insert("worker", toml::table{{"threads", spec.worker.threads}});
  if (spec.is_extract()) {
    toml::array layers, sites;
    for (int64_t l : spec.extract.layers) layers.push_back(l);
    // logits_ids and loss follow from logits_top_k and kind; the parser adds them again.
    for (const auto& site : spec.extract.sites) {
      if (site != "logits_ids" && site != "loss") sites.push_back(site);
    }
    toml::table extract{{"dtype", Name(spec.extract.dtype)}, {"precision", Name(spec.extract.precision)},
                        {"batch", spec.extract.batch},       {"tokens", spec.extract.tokens},
                        {"mode", Name(spec.extract.mode)},   {"logits_top_k", spec.extract.logits_top_k}};
    if (!spec.is_patch()) {  // a patch run's follow from [patch]
      extract.insert("layers", layers);
      extract.insert("sites", sites);
    }
    root.insert("extract", std::move(extract));
  }
  if (spec.is_patch()) {
    toml::array layers, sites;
    for (int64_t l : spec.patch.layers) layers.push_back(l);
    for (const auto& site : spec.patch.sites) sites.push_back(site);
    root.insert("patch", toml::table{{"layers", layers},
                                     {"sites", sites},
                                     {"ablation", Name(spec.patch.ablation)},
                                     {"source", spec.patch.source},
                                     {"logits", spec.patch.logits}});
    if (spec.patch.ablation == Ablation::kSteer) root["patch"].as_table()->insert("alpha", spec.patch.alpha);
  }
  if (spec.lora.enabled) {
    toml::array modules;
    for (const auto& module : spec.lora.target_modules) modules.push_back(module);
    root.insert("lora", toml::table{{"rank", spec.lora.rank},
                                    {"alpha", spec.lora.alpha},
                                    {"dropout", spec.lora.dropout},
                                    {"target_modules", modules},
                                    {"use_rslora", spec.lora.use_rslora},
                                    {"base", Name(spec.lora.base)}});
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

}  // namespace strata
