// RunSpec <-> wire::RunSpec (run_spec_capnp.h). Each wire enum lists the C++ enum's values in
// order (run_spec_capnp_test.cc checks it), so a value converts by its index.
#include "spec/run_spec_capnp.h"

#include <algorithm>
#include <iterator>
#include <string>

namespace strata {

namespace {

template <SpecChoice E, typename Wire>
Wire ToWire(E value) {
  return static_cast<Wire>(static_cast<uint16_t>(value));
}

template <typename List>
void WriteInts(const std::vector<int64_t>& values, List list) {
  for (size_t i = 0; i < values.size(); ++i) list.set(i, values[i]);
}

template <typename Container, typename List>
void WriteTexts(const Container& values, List list) {
  size_t i = 0;
  for (const auto& v : values) list.set(i++, v);
}

void WriteModel(const ModelSpec& m, wire::ModelSpec::Builder w) {
  w.setFamily(ToWire<Family, wire::Family>(m.family));
  w.setLayers(m.layers);
  w.setHidden(m.hidden);
  w.setHeads(m.heads);
  w.setVocab(m.vocab);
  w.setSequence(m.sequence);
  w.setKvHeads(m.kv_heads);
  w.setFfn(m.ffn);
  w.setHeadDim(m.head_dim);
  w.setMaxPositions(m.max_positions);
  w.setRopeTheta(m.rope_theta);
  auto rs = w.initRopeScaling();
  rs.setType(ToWire<RopeScalingType, wire::RopeScalingType>(m.rope_scaling.type));
  rs.setFactor(m.rope_scaling.factor);
  rs.setLowFreqFactor(m.rope_scaling.low_freq_factor);
  rs.setHighFreqFactor(m.rope_scaling.high_freq_factor);
  rs.setOriginalMaxPositions(m.rope_scaling.original_max_positions);
  w.setRotaryPct(m.rotary_pct);
  w.setNormEps(m.norm_eps);
  w.setAttentionBias(m.attention_bias);
  w.setMlpBias(m.mlp_bias);
  w.setTieEmbeddings(m.tie_embeddings);
  w.setSlidingWindow(m.sliding_window);
  w.setParallelResidual(m.parallel_residual);
  w.setActivation(ToWire<Activation, wire::Activation>(m.activation));
  w.setInitFrom(m.init_from);
  w.setAdapterFrom(m.adapter_from);
}

void WriteTrain(const TrainSpec& t, wire::TrainSpec::Builder w) {
  w.setSteps(t.steps);
  w.setGlobalBatch(t.global_batch);
  w.setLr(t.lr);
  w.setWeightDecay(t.weight_decay);
  w.setBeta1(t.beta1);
  w.setBeta2(t.beta2);
  w.setEps(t.eps);
  w.setGradClip(t.grad_clip);
  w.setSeed(t.seed);
  w.setCheckpointEvery(t.checkpoint_every);
  w.setKeepCheckpoints(t.keep_checkpoints);
  w.setLrSchedule(ToWire<LrSchedule, wire::LrSchedule>(t.lr_schedule));
  w.setWarmupSteps(t.warmup_steps);
  w.setMinLr(t.min_lr);
  w.setPrecision(ToWire<Precision, wire::Precision>(t.precision));
  w.setCudaGraphs(t.cuda_graphs);
  w.setOptimizer(ToWire<Optimizer, wire::Optimizer>(t.optimizer));
}

void WriteParallel(const ParallelSpec& p, wire::ParallelSpec::Builder w) {
  w.setDp(p.dp);
  w.setPp(p.pp);
  w.setTp(p.tp);
  w.setMicroBatch(p.micro_batch);
  w.setZero(p.zero);
  w.setRecompute(p.recompute);
  WriteInts(p.stages, w.initStages(p.stages.size()));
  w.setOffload(ToWire<Offload, wire::Offload>(p.offload));
  w.setKeepGathered(p.keep_gathered);
  w.setSequenceParallel(p.sequence_parallel);
  w.setTpCommOverlap(p.tp_comm_overlap);
  WriteTexts(p.automatic, w.initAutomatic(p.automatic.size()));
}

// Reads one struct, keeping the first error: every field is read through it, named as the TOML
// names it, so a message says which field of `what_` was out of range.
class WireReader {
 public:
  explicit WireReader(const std::string& what) : what_(what) {}

  template <SpecChoice E, typename Wire>
  E Choice(Wire value, const char* field) {
    const auto index = static_cast<size_t>(value);
    if (index >= std::size(Choices<E>::kNames)) {
      Fail(std::string(field) + " holds value " + std::to_string(index) + ", which names no choice (" +
           ChoiceList<E>() + ")");
      return E{};
    }
    return static_cast<E>(index);
  }

  int64_t Int(int64_t value, const char* field, int64_t lo, int64_t hi) {
    if (value < lo || value > hi) {
      Fail(std::string(field) + " = " + std::to_string(value) + " is outside [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
      return lo;  // the read fails; what follows (dp x pp x tp, ...) computes with a value in range
    }
    return value;
  }

  template <typename List>
  std::vector<int64_t> Ints(List list, const char* field, int64_t lo, int64_t hi, size_t max_size) {
    std::vector<int64_t> values;
    if (list.size() > max_size) {
      Fail(std::string(field) + " holds " + std::to_string(list.size()) + " entries, more than " +
           std::to_string(max_size));
      return values;
    }
    for (int64_t v : list) values.push_back(Int(v, field, lo, hi));
    return values;
  }

  template <typename List>
  std::vector<std::string> Texts(List list, const char* field, size_t max_size) {
    std::vector<std::string> values;
    if (list.size() > max_size) {
      Fail(std::string(field) + " holds " + std::to_string(list.size()) + " entries, more than " +
           std::to_string(max_size));
      return values;
    }
    for (auto v : list) values.emplace_back(v.cStr());
    return values;
  }

  // Each of `values` is one of `allowed`.
  void Known(const std::vector<std::string>& values, const std::vector<std::string>& allowed, const char* field) {
    for (const auto& v : values) {
      if (std::find(allowed.begin(), allowed.end(), v) == allowed.end())
        Fail(std::string(field) + " holds \"" + v + "\", which is not one");
    }
  }

  void Fail(const std::string& message) {
    if (status_.ok()) status_ = InvalidArgument(what_ + ": " + message);
  }
  const Status& status() const { return status_; }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  Status status_;
};

ModelSpec ReadModel(wire::ModelSpec::Reader w, WireReader& r) {
  namespace b = spec_bounds;
  ModelSpec m;
  m.family = r.Choice<Family>(w.getFamily(), "model.family");
  m.layers = r.Int(w.getLayers(), "model.layers", 1, b::kLayers);
  m.hidden = r.Int(w.getHidden(), "model.hidden", 1, b::kHidden);
  m.heads = r.Int(w.getHeads(), "model.heads", 1, b::kHeads);
  m.vocab = r.Int(w.getVocab(), "model.vocab", 1, b::kVocab);
  m.sequence = r.Int(w.getSequence(), "model.sequence", 1, b::kSequence);
  m.kv_heads = r.Int(w.getKvHeads(), "model.kv_heads", 0, b::kHeads);
  m.ffn = r.Int(w.getFfn(), "model.ffn", 0, b::kFfn);
  m.head_dim = r.Int(w.getHeadDim(), "model.head_dim", 0, b::kFfn);
  m.max_positions = r.Int(w.getMaxPositions(), "model.max_positions", 0, b::kSequence);
  m.rope_theta = w.getRopeTheta();
  auto rs = w.getRopeScaling();
  m.rope_scaling.type = r.Choice<RopeScalingType>(rs.getType(), "model.rope_scaling.type");
  m.rope_scaling.factor = rs.getFactor();
  m.rope_scaling.low_freq_factor = rs.getLowFreqFactor();
  m.rope_scaling.high_freq_factor = rs.getHighFreqFactor();
  m.rope_scaling.original_max_positions =
      r.Int(rs.getOriginalMaxPositions(), "model.rope_scaling.original_max_positions", 1, b::kSequence);
  m.rotary_pct = w.getRotaryPct();
  if (!(m.rotary_pct > 0.0 && m.rotary_pct <= 1.0)) r.Fail("model.rotary_pct is outside (0, 1]");
  m.norm_eps = w.getNormEps();
  m.attention_bias = w.getAttentionBias();
  m.mlp_bias = w.getMlpBias();
  m.tie_embeddings = w.getTieEmbeddings();
  m.sliding_window = r.Int(w.getSlidingWindow(), "model.sliding_window", 0, b::kSequence);
  m.parallel_residual = w.getParallelResidual();
  m.activation = r.Choice<Activation>(w.getActivation(), "model.activation");
  m.init_from = w.getInitFrom().cStr();
  m.adapter_from = w.getAdapterFrom().cStr();
  return m;
}

TrainSpec ReadTrain(wire::TrainSpec::Reader w, WireReader& r) {
  namespace b = spec_bounds;
  TrainSpec t;
  t.steps = r.Int(w.getSteps(), "train.steps", 1, b::kSteps);
  t.global_batch = r.Int(w.getGlobalBatch(), "train.global_batch", 1, b::kGlobalBatch);
  t.lr = w.getLr();
  t.weight_decay = w.getWeightDecay();
  t.beta1 = w.getBeta1();
  t.beta2 = w.getBeta2();
  t.eps = w.getEps();
  if (!(t.eps > 0.0 && t.eps <= b::kMaxEps)) r.Fail("train.eps is outside (0, " + std::to_string(b::kMaxEps) + "]");
  t.grad_clip = w.getGradClip();
  t.seed = w.getSeed();
  t.checkpoint_every = r.Int(w.getCheckpointEvery(), "train.checkpoint_every", TrainSpec::kAutoCheckpoints, b::kSteps);
  t.keep_checkpoints = r.Int(w.getKeepCheckpoints(), "train.keep_checkpoints", 0, b::kSteps);
  t.lr_schedule = r.Choice<LrSchedule>(w.getLrSchedule(), "train.lr_schedule");
  t.warmup_steps = r.Int(w.getWarmupSteps(), "train.warmup_steps", 0, b::kSteps);
  t.min_lr = w.getMinLr();
  t.precision = r.Choice<Precision>(w.getPrecision(), "train.precision");
  t.cuda_graphs = w.getCudaGraphs();
  t.optimizer = r.Choice<Optimizer>(w.getOptimizer(), "train.optimizer");
  return t;
}

ParallelSpec ReadParallel(wire::ParallelSpec::Reader w, const ModelSpec& model, WireReader& r) {
  namespace b = spec_bounds;
  ParallelSpec p;
  p.dp = r.Int(w.getDp(), "parallel.dp", 1, b::kWorkers);
  p.pp = r.Int(w.getPp(), "parallel.pp", 1, model.layers);
  p.tp = r.Int(w.getTp(), "parallel.tp", 1, b::kWorkers);
  if (p.dp * p.pp * p.tp > b::kWorkers) r.Fail("parallel.dp x pp x tp is over " + std::to_string(b::kWorkers));
  p.micro_batch = r.Int(w.getMicroBatch(), "parallel.micro_batch", 0, b::kGlobalBatch);
  p.zero = r.Int(w.getZero(), "parallel.zero", 0, 3);
  p.recompute = w.getRecompute();
  p.stages = r.Ints(w.getStages(), "parallel.stages", 1, model.layers, static_cast<size_t>(model.layers));
  p.offload = r.Choice<Offload>(w.getOffload(), "parallel.offload");
  p.keep_gathered = r.Int(w.getKeepGathered(), "parallel.keep_gathered", 0, b::kLayers);
  p.sequence_parallel = w.getSequenceParallel();
  p.tp_comm_overlap = w.getTpCommOverlap();
  const std::vector<std::string> automatic = r.Texts(w.getAutomatic(), "parallel.automatic", 16);
  r.Known(automatic, {"dp", "pp", "tp", "micro_batch", "zero", "recompute", "keep_gathered", "offload"},
          "parallel.automatic");
  p.automatic.insert(automatic.begin(), automatic.end());
  return p;
}

ExtractSpec ReadExtract(wire::ExtractSpec::Reader w, const ModelSpec& model, WireReader& r) {
  namespace b = spec_bounds;
  ExtractSpec e;
  e.layers = r.Ints(w.getLayers(), "extract.layers", 0, model.layers - 1, static_cast<size_t>(model.layers));
  e.sites = r.Texts(w.getSites(), "extract.sites", ExtractSites().size());
  r.Known(e.sites, ExtractSites(), "extract.sites");
  e.dtype = r.Choice<StoredDType>(w.getDtype(), "extract.dtype");
  e.precision = r.Choice<Precision>(w.getPrecision(), "extract.precision");
  e.batch = r.Int(w.getBatch(), "extract.batch", 1, b::kExtractBatch);
  e.tokens = r.Int(w.getTokens(), "extract.tokens", 0, b::kExtractTokens);
  e.mode = r.Choice<ExtractMode>(w.getMode(), "extract.mode");
  e.logits_top_k = r.Int(w.getLogitsTopK(), "extract.logits_top_k", 0, model.vocab);
  return e;
}

PatchSpec ReadPatch(wire::PatchSpec::Reader w, const ModelSpec& model, WireReader& r) {
  PatchSpec p;
  p.layers = r.Ints(w.getLayers(), "patch.layers", 0, model.layers - 1, static_cast<size_t>(model.layers));
  p.sites = r.Texts(w.getSites(), "patch.sites", PatchableSites().size());
  r.Known(p.sites, PatchableSites(), "patch.sites");
  p.ablation = r.Choice<Ablation>(w.getAblation(), "patch.ablation");
  p.source = w.getSource().cStr();
  p.logits = w.getLogits();
  p.alpha = w.getAlpha();
  return p;
}

LoraSpec ReadLora(wire::LoraSpec::Reader w, const ModelSpec& model, WireReader& r) {
  LoraSpec l;
  l.enabled = w.getEnabled();
  l.rank = r.Int(w.getRank(), "lora.rank", 1, spec_bounds::kHidden);
  l.alpha = w.getAlpha();
  l.dropout = w.getDropout();
  if (!(l.dropout >= 0.0 && l.dropout < 1.0)) r.Fail("lora.dropout is outside [0, 1)");
  const auto& modules = LoraTargetModules(model.family);
  l.target_modules = r.Texts(w.getTargetModules(), "lora.target_modules", modules.size());
  r.Known(l.target_modules, modules, "lora.target_modules");
  l.use_rslora = w.getUseRslora();
  l.base = r.Choice<LoraBase>(w.getBase(), "lora.base");
  return l;
}

}  // namespace

void WriteRunSpec(const RunSpec& spec, wire::RunSpec::Builder out) {
  out.setName(spec.name);
  out.setKind(ToWire<RunKind, wire::RunKind>(spec.kind));
  WriteModel(spec.model, out.initModel());
  auto data = out.initData();
  data.setPath(spec.data.path);
  data.setFormat(ToWire<TokenFormat, wire::TokenFormat>(spec.data.format));
  data.setDocuments(spec.data.documents);
  data.setSampleWithinDocuments(spec.data.sample_within_documents);
  data.setTokenizer(spec.data.tokenizer);
  WriteTrain(spec.train, out.initTrain());
  WriteParallel(spec.parallel, out.initParallel());
  out.initWorker().setThreads(spec.worker.threads);
  auto extract = out.initExtract();
  WriteInts(spec.extract.layers, extract.initLayers(spec.extract.layers.size()));
  WriteTexts(spec.extract.sites, extract.initSites(spec.extract.sites.size()));
  extract.setDtype(ToWire<StoredDType, wire::StoredDType>(spec.extract.dtype));
  extract.setPrecision(ToWire<Precision, wire::Precision>(spec.extract.precision));
  extract.setBatch(spec.extract.batch);
  extract.setTokens(spec.extract.tokens);
  extract.setMode(ToWire<ExtractMode, wire::ExtractMode>(spec.extract.mode));
  extract.setLogitsTopK(spec.extract.logits_top_k);
  auto patch = out.initPatch();
  WriteInts(spec.patch.layers, patch.initLayers(spec.patch.layers.size()));
  WriteTexts(spec.patch.sites, patch.initSites(spec.patch.sites.size()));
  patch.setAblation(ToWire<Ablation, wire::Ablation>(spec.patch.ablation));
  patch.setSource(spec.patch.source);
  patch.setLogits(spec.patch.logits);
  patch.setAlpha(spec.patch.alpha);
  auto lora = out.initLora();
  lora.setEnabled(spec.lora.enabled);
  lora.setRank(spec.lora.rank);
  lora.setAlpha(spec.lora.alpha);
  lora.setDropout(spec.lora.dropout);
  WriteTexts(spec.lora.target_modules, lora.initTargetModules(spec.lora.target_modules.size()));
  lora.setUseRslora(spec.lora.use_rslora);
  lora.setBase(ToWire<LoraBase, wire::LoraBase>(spec.lora.base));
}

Result<RunSpec> ReadRunSpec(wire::RunSpec::Reader in, const std::string& what) {
  WireReader r(what);
  RunSpec spec;
  spec.name = in.getName().cStr();
  spec.kind = r.Choice<RunKind>(in.getKind(), "kind");
  spec.model = ReadModel(in.getModel(), r);
  STRATA_RETURN_IF_ERROR(r.status());  // the sizes below are bounded by the model's
  auto data = in.getData();
  spec.data.path = data.getPath().cStr();
  spec.data.format = r.Choice<TokenFormat>(data.getFormat(), "data.format");
  spec.data.documents = data.getDocuments().cStr();
  spec.data.sample_within_documents = data.getSampleWithinDocuments();
  spec.data.tokenizer = data.getTokenizer().cStr();
  spec.train = ReadTrain(in.getTrain(), r);
  spec.parallel = ReadParallel(in.getParallel(), spec.model, r);
  spec.worker.threads = r.Int(in.getWorker().getThreads(), "worker.threads", 0, spec_bounds::kThreads);
  spec.extract = ReadExtract(in.getExtract(), spec.model, r);
  spec.patch = ReadPatch(in.getPatch(), spec.model, r);
  spec.lora = ReadLora(in.getLora(), spec.model, r);
  STRATA_RETURN_IF_ERROR(r.status());
  STRATA_RETURN_IF_ERROR(ValidateModelSpec(spec.model, what + ": "));
  if (!spec.is_extract()) STRATA_RETURN_IF_ERROR(ValidateParallel(spec));
  return spec;
}

Result<RunSpec> ReadRunRecordSpec(RunRecord::Reader record) {
  if (record.hasSpec()) return ReadRunSpec(record.getSpec(), "the run record's spec");
  return ParseStoredRunSpec(record.getSpecToml().cStr());
}

}  // namespace strata
