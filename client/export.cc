#include "client/export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "common/atomic_file.h"
#include "common/float_bits.h"
#include "model/hf_checkpoint.h"
#include "model/parameters.h"
#include "model/peft_adapter.h"
#include "quant/nf4.h"
#include "shard/layout.h"
#include "spec/hf_config.h"
#include "spec/run_spec.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"

namespace strata::client {
namespace {

constexpr const char* kParamPrefix = "param/";

// Row-major [rows, cols] -> [cols, rows] of `element` bytes each.
std::vector<uint8_t> Transpose2d(const storage::Tensor& t) {
  const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
  const size_t element = storage::DTypeSize(t.dtype);
  std::vector<uint8_t> out(t.bytes.size());
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      std::memcpy(&out[(c * rows + r) * element], &t.bytes[(r * cols + c) * element], element);
    }
  }
  return out;
}

// fp32 -> bf16, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN.
std::vector<uint8_t> ToBf16(const std::vector<uint8_t>& f32) {
  std::vector<uint8_t> out(f32.size() / 2);
  for (size_t i = 0; i < f32.size() / 4; ++i) {
    float value;
    std::memcpy(&value, &f32[i * 4], 4);
    const uint16_t half = FloatToBf16(value);
    std::memcpy(&out[i * 2], &half, 2);
  }
  return out;
}

std::string ShardFileName(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}
// The parameters of a checkpoint, read from the shard stores its manifest names (opened
// read-only, so the workers may keep running): each rank wrote pieces of the parameters (its
// tensor-parallel slice, cut by data-parallel rank; shard/layout.h), assembled whole here, one
// parameter at a time, each piece checked against the manifest's checksum.
class CheckpointTensors {
 public:
  static Result<CheckpointTensors> Open(const RunSpec& spec, CheckpointManifest::Reader manifest) {
    CheckpointTensors out(spec, manifest.getRunId().cStr(), manifest.getStep());
    for (auto shard : manifest.getShards()) {
      // The shard's own store, else its copy on another host (a cluster spanning hosts), whichever
      // this machine reaches by path.
      std::string store_path = shard.getStorePath().cStr();
      std::string key_run = shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : out.run_;
      storage::StoreOptions store_options;
      store_options.create_if_missing = false;
      store_options.read_only = true;
      auto store = storage::ShardStore::Open(store_path, store_options);
      for (auto copy : shard.getCopies()) {
        if (store.ok()) break;
        store = storage::ShardStore::Open(copy.getStorePath().cStr(), store_options);
        if (store.ok()) store_path = copy.getStorePath().cStr(), key_run = copy.getKeyRun().cStr();
      }
      if (!store.ok()) return store.status();
      out.stores_.push_back({std::move(*store), store_path, key_run});
      for (auto entry : shard.getTensors()) {
        const std::string name = entry.getName().cStr();
        if (name.rfind(kParamPrefix, 0) != 0) continue;  // optimizer moments stay behind
        STRATA_ASSIGN_OR_RETURN(shard::PieceName piece, shard::ParsePiece(name));
        out.pieces_[piece.name].push_back({out.stores_.size() - 1, name, entry.getChecksum(), piece});
      }
    }
    return out;
  }

  // The whole parameter `name` in our layout and its stored dtype.
  Result<storage::Tensor> Read(const std::string& name) {
    auto found = pieces_.find(name);
    if (found == pieces_.end())
      return Corruption("checkpoint " + std::to_string(step_) + " of run " + run_ + " has no parameter " + name);
    storage::Tensor t;
    for (const PieceRef& ref : found->second) {
      const OpenStore& from = stores_[ref.store];
      STRATA_ASSIGN_OR_RETURN(storage::Tensor read, from.store->ReadCheckpointTensor(from.key_run, step_, ref.name));
      if (read.checksum != ref.checksum) {
        return Corruption("tensor '" + ref.name + "' in " + from.path +
                          " does not match the checkpoint manifest; export an older checkpoint (`strata checkpoints " +
                          run_ + "`)");
      }
      const size_t element = storage::DTypeSize(read.dtype);
      if (read.bytes.size() != static_cast<size_t>(ref.piece.end - ref.piece.begin) * element) {
        return Corruption("tensor '" + ref.name + "' in " + from.path + " holds " + std::to_string(read.bytes.size()) +
                          " bytes, not the piece its name describes");
      }
      STRATA_RETURN_IF_ERROR(assembler_.Add(ref.piece, element, read.bytes.data()));
      t.dtype = read.dtype;
      t.shape = ref.piece.shape;
    }
    STRATA_ASSIGN_OR_RETURN(t.bytes, assembler_.Take(name));
    return t;
  }

  const std::string& run() const { return run_; }
  int64_t step() const { return step_; }

 private:
  struct OpenStore {
    std::unique_ptr<storage::ShardStore> store;
    std::string path, key_run;
  };
  struct PieceRef {
    size_t store;
    std::string name;
    uint64_t checksum;
    shard::PieceName piece;
  };
  CheckpointTensors(const RunSpec& spec, std::string run, int64_t step)
      : run_(std::move(run)), step_(step), assembler_(spec.model) {}

  std::string run_;
  int64_t step_;
  shard::TensorAssembler assembler_;
  std::vector<OpenStore> stores_;
  std::map<std::string, std::vector<PieceRef>> pieces_;  // parameter -> its pieces
};

// A float tensor's values as fp32 (F32, BF16 or F16 bytes).
Result<std::vector<float>> ToFloats(storage::DType dtype, std::span<const uint8_t> bytes, const std::string& what) {
  std::vector<float> out(bytes.size() / storage::DTypeSize(dtype));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == storage::DType::kF32) {
      std::memcpy(&out[i], &bytes[i * 4], 4);
    } else if (dtype == storage::DType::kBF16 || dtype == storage::DType::kF16) {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      out[i] = dtype == storage::DType::kF16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
    } else {
      return InvalidArgument(what + " is " + storage::DTypeName(dtype) + ", not a float tensor");
    }
  }
  return out;
}

storage::Tensor FloatTensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  storage::Tensor t;
  t.dtype = storage::DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * 4);
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// Writes the model of `spec` into `out_dir` as save_pretrained does, each parameter (our name)
// from `read` (our layout: [out, in] matrices), one at a time.
Result<ExportSummary> WriteHfModel(const RunSpec& spec, const std::string& run, int64_t step,
                                   const std::function<Result<storage::Tensor>(const std::string&)>& read,
                                   const std::string& out_dir, const ExportOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError("cannot create " + out_dir + ": " + ec.message());

  // One parameter at a time, in the family's order (embeddings, blocks, head, as save_pretrained
  // lays them out), assembled whole whatever the mesh was, into files of at most max_shard_bytes
  // (a larger tensor gets a file of its own). A file is written as soon as it is full, under a
  // provisional name until the count is known: host memory holds one file and one tensor.
  ExportSummary summary;
  std::vector<std::string> provisional;                          // written files, in order
  std::vector<std::vector<std::string>> names_in_file;           // their tensors
  std::vector<std::pair<std::string, storage::Tensor>> pending;  // the file being filled
  uint64_t pending_bytes = 0;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"strata_run", run}, {"strata_step", std::to_string(step)}};
  auto remove_provisional = [&] {
    for (const std::string& path : provisional) std::filesystem::remove(path, ec);
  };
  auto flush = [&]() -> Status {
    if (pending.empty()) return Status::Ok();
    const std::string path = out_dir + "/.export-" + std::to_string(provisional.size() + 1) + ".safetensors.partial";
    std::vector<storage::NamedTensorView> views;
    names_in_file.emplace_back();
    for (const auto& [hf_name, t] : pending) {
      views.push_back({hf_name, {t.dtype, t.shape, t.bytes}});
      names_in_file.back().push_back(hf_name);
    }
    provisional.push_back(path);
    STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(path, views, metadata));
    pending.clear();
    pending_bytes = 0;
    return Status::Ok();
  };
  // --quantized: the 2-D parameters of every block (transformers' bnb integration quantizes each
  // nn.Linear / Conv1D of the model but the head; the embeddings are no linears).
  std::set<std::string> quantize;
  if (options.quantized) {
    for (int64_t layer = 0; layer < spec.model.layers; ++layer)
      for (const model::Parameter& p : model::BlockParameters(spec.model))
        if (p.shape.size() == 2) quantize.insert(model::BlockPrefix(spec.model, layer) + p.name);
  }
  const bool bf16 = options.dtype == "bf16" || options.quantized;
  auto add = [&](const std::string& hf_name, storage::Tensor t) -> Status {
    const uint64_t size = t.bytes.size();
    if (!pending.empty() && pending_bytes + size > options.max_shard_bytes) STRATA_RETURN_IF_ERROR(flush());
    pending.emplace_back(hf_name, std::move(t));
    pending_bytes += size;
    summary.bytes += size;
    ++summary.tensors;
    return Status::Ok();
  };
  auto export_all = [&]() -> Status {
    for (const model::Parameter& p : model::Parameters(spec.model)) {
      STRATA_ASSIGN_OR_RETURN(storage::Tensor t, read(p.name));
      const model::HfTensorName hf = model::ToHuggingFace(spec.model, p.name);
      if (quantize.count(p.name)) {
        // Our [out, in] (also for GPT-2's Conv1D, which transformers quantizes transposed),
        // rounded to bf16 as a bf16 load would hold it, then quantize_4bit.
        if (t.dtype == storage::DType::kF32) t.bytes = ToBf16(t.bytes), t.dtype = storage::DType::kBF16;
        if (t.dtype != storage::DType::kBF16) return Internal(p.name + ": a checkpoint tensor neither fp32 nor bf16");
        std::vector<uint16_t> bits(t.bytes.size() / 2);
        std::memcpy(bits.data(), t.bytes.data(), t.bytes.size());
        auto q = quant::QuantizeNf4Bf16(bits.data(), p.shape);
        if (!q.ok()) return InvalidArgument("--quantized: " + p.name + ": " + q.status().message());
        STRATA_ASSIGN_OR_RETURN(std::vector<quant::StateEntry> entries, quant::ToBnbStateDict(*q, hf.name));
        for (quant::StateEntry& e : entries) {
          storage::Tensor part;
          part.dtype = e.dtype == "U8" ? storage::DType::kU8 : storage::DType::kF32;
          part.shape = std::move(e.shape);
          part.bytes = std::move(e.bytes);
          STRATA_RETURN_IF_ERROR(add(e.name, std::move(part)));
        }
        continue;
      }
      if (hf.transposed && t.shape.size() == 2) {
        t.bytes = Transpose2d(t);
        std::swap(t.shape[0], t.shape[1]);
      }
      if (bf16 && t.dtype == storage::DType::kF32) {
        t.bytes = ToBf16(t.bytes);
        t.dtype = storage::DType::kBF16;
      }
      STRATA_RETURN_IF_ERROR(add(hf.name, std::move(t)));
    }
    if (summary.tensors == 0)
      return NotFound("checkpoint " + std::to_string(step) + " of run " + run + " holds no parameters");
    return flush();
  };
  if (Status st = export_all(); !st.ok()) {
    remove_provisional();
    return st;
  }
  // Final names, now that the count is known, and the index.
  nlohmann::json weight_map = nlohmann::json::object();
  const size_t n = provisional.size();
  for (size_t k = 0; k < n; ++k) {
    const std::string name = n == 1 ? "model.safetensors" : ShardFileName(k + 1, n);
    std::filesystem::rename(provisional[k], out_dir + "/" + name, ec);
    if (ec) {
      remove_provisional();
      return IoError("cannot rename " + provisional[k] + " to " + out_dir + "/" + name + ": " + ec.message());
    }
    for (const std::string& tensor : names_in_file[k]) weight_map[tensor] = name;
  }
  if (n > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", summary.bytes}}}, {"weight_map", weight_map}};
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n", 0644));
  }
  summary.files = n;
  // config.json: the source model's, so rope_scaling, token ids and the rest survive.
  std::string source_config;
  const std::string& init_from = spec.model.init_from;
  if (!init_from.empty()) {
    auto text = ReadSpecFile(init_from + "/config.json", "model config", 4 << 20);
    if (text.ok()) source_config = *text;
  }
  STRATA_ASSIGN_OR_RETURN(std::string config,
                          HuggingFaceConfigJson(spec.model, source_config, bf16 ? "bfloat16" : "float32"));
  if (options.quantized) {
    // transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    // bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16).to_dict().
    nlohmann::json parsed = nlohmann::json::parse(config);
    parsed["quantization_config"] = {{"_load_in_4bit", true},
                                     {"_load_in_8bit", false},
                                     {"bnb_4bit_compute_dtype", "bfloat16"},
                                     {"bnb_4bit_quant_storage", "uint8"},
                                     {"bnb_4bit_quant_type", "nf4"},
                                     {"bnb_4bit_use_double_quant", true},
                                     {"llm_int8_enable_fp32_cpu_offload", false},
                                     {"llm_int8_has_fp16_weight", false},
                                     {"llm_int8_skip_modules", nullptr},
                                     {"llm_int8_threshold", 6.0},
                                     {"load_in_4bit", true},
                                     {"load_in_8bit", false},
                                     {"quant_method", "bitsandbytes"}};
    config = parsed.dump(2) + "\n";
  }
  STRATA_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/config.json", config, 0644));
  if (!init_from.empty()) {
    for (const std::string& name : model::CompanionFiles(init_from)) {
      std::filesystem::copy_file(init_from + "/" + name, out_dir + "/" + name,
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return IoError("cannot copy " + init_from + "/" + name + " to " + out_dir + ": " + ec.message());
      ++summary.companion_files;
    }
  }
  return summary;
}

}  // namespace

Result<ExportSummary> ExportCheckpoint(const RunSpec& spec, CheckpointManifest::Reader manifest,
                                       const std::string& out_dir, const ExportOptions& options) {
  STRATA_ASSIGN_OR_RETURN(CheckpointTensors checkpoint, CheckpointTensors::Open(spec, manifest));
  const std::string run = checkpoint.run();
  if (!spec.lora.enabled) {
    return WriteHfModel(
        spec, run, checkpoint.step(), [&](const std::string& name) { return checkpoint.Read(name); }, out_dir, options);
  }
  if (!options.merge) {
    return InvalidArgument("run " + run +
                           " trained LoRA adapters (its checkpoints hold them, not the frozen base): export them "
                           "with --adapter (PEFT's layout), or the merged model with --merge");
  }
  // --merge: W + scale * B A over the base in model.init_from, in fp32, one weight at a time.
  if (spec.model.init_from.empty()) {
    return InvalidArgument("run " + run +
                           " drew its base from train.seed (no model.init_from): --merge needs the base's "
                           "weights as a Hugging Face directory; export the adapters with --adapter instead");
  }
  STRATA_ASSIGN_OR_RETURN(model::HfCheckpoint base, model::HfCheckpoint::Open(spec.model.init_from));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const model::Parameter& p : model::Parameters(spec.model)) shapes[p.name] = p.shape;
  std::set<std::string> adapted;
  for (const model::Parameter& p : model::LoraParameters(spec.model, spec.lora))
    adapted.insert(model::LoraBaseWeight(p.name));
  const double scale = spec.lora.scale();
  auto merged = [&](const std::string& name) -> Result<storage::Tensor> {
    const model::HfTensorName hf = model::ToHuggingFace(spec.model, name);
    STRATA_ASSIGN_OR_RETURN(storage::TensorView view, base.Find(hf.name));
    const std::string what = spec.model.init_from + "'s " + hf.name;
    STRATA_ASSIGN_OR_RETURN(std::vector<float> w, ToFloats(view.dtype, view.bytes, what));
    const std::vector<int64_t>& shape = shapes.at(name);
    if (hf.transposed && shape.size() == 2) {  // to our [out, in]
      std::vector<float> ours(w.size());
      const size_t out = static_cast<size_t>(shape[0]), in = static_cast<size_t>(shape[1]);
      for (size_t r = 0; r < in; ++r)
        for (size_t c = 0; c < out; ++c) ours[c * in + r] = w[r * out + c];
      w = std::move(ours);
    }
    if (!adapted.count(name)) return FloatTensor(shape, w);
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    STRATA_ASSIGN_OR_RETURN(storage::Tensor a_t, checkpoint.Read(stem + ".lora_A.weight"));
    STRATA_ASSIGN_OR_RETURN(storage::Tensor b_t, checkpoint.Read(stem + ".lora_B.weight"));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> a, ToFloats(a_t.dtype, a_t.bytes, stem + ".lora_A.weight"));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> b, ToFloats(b_t.dtype, b_t.bytes, stem + ".lora_B.weight"));
    const size_t out = static_cast<size_t>(shape[0]), in = static_cast<size_t>(shape[1]);
    const size_t rank = static_cast<size_t>(spec.lora.rank);
    for (size_t o = 0; o < out; ++o) {
      for (size_t k = 0; k < rank; ++k) {
        const float coefficient = static_cast<float>(scale * b[o * rank + k]);
        const float* a_row = &a[k * in];
        float* w_row = &w[o * in];
        for (size_t i = 0; i < in; ++i) w_row[i] += coefficient * a_row[i];
      }
    }
    return FloatTensor(shape, w);
  };
  return WriteHfModel(spec, run, checkpoint.step(), merged, out_dir, options);
}

Result<ExportSummary> ExportAdapter(const RunSpec& spec, CheckpointManifest::Reader manifest,
                                    const std::string& out_dir, const ExportOptions& options) {
  STRATA_ASSIGN_OR_RETURN(CheckpointTensors checkpoint, CheckpointTensors::Open(spec, manifest));
  if (!spec.lora.enabled) {
    return InvalidArgument("run " + checkpoint.run() +
                           " trained every weight (no [lora] table): it has no adapters; export the model without "
                           "--adapter");
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError("cannot create " + out_dir + ": " + ec.message());
  ExportSummary summary;
  std::vector<std::pair<std::string, storage::Tensor>> tensors;
  for (const model::Parameter& p : model::LoraParameters(spec.model, spec.lora)) {
    STRATA_ASSIGN_OR_RETURN(storage::Tensor t, checkpoint.Read(p.name));
    if (options.dtype == "bf16" && t.dtype == storage::DType::kF32) {
      t.bytes = ToBf16(t.bytes);
      t.dtype = storage::DType::kBF16;
    }
    summary.bytes += t.bytes.size();
    ++summary.tensors;
    tensors.emplace_back(model::PeftTensorName(spec.model, p.name), std::move(t));
  }
  std::vector<storage::NamedTensorView> views;
  for (const auto& [name, t] : tensors) views.push_back({name, {t.dtype, t.shape, t.bytes}});
  STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(
      out_dir + "/adapter_model.safetensors", views,
      {{"format", "pt"}, {"strata_run", checkpoint.run()}, {"strata_step", std::to_string(checkpoint.step())}}));
  STRATA_RETURN_IF_ERROR(
      WriteFileAtomically(out_dir + "/adapter_config.json", model::PeftAdapterConfigJson(spec.model, spec.lora), 0644));
  summary.files = 1;
  return summary;
}

}  // namespace strata::client
