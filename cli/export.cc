#include "cli/export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/run_spec.h"
#include "shard/layout.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"
#include "common/hf_config.h"
#include "model/hf_checkpoint.h"
#include "model/parameters.h"

namespace strata::cli {
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
    uint32_t bits;
    std::memcpy(&bits, &f32[i * 4], 4);
    uint16_t half;
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
      half = static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
    } else {
      half = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
    std::memcpy(&out[i * 2], &half, 2);
  }
  return out;
}

std::string ShardFileName(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}

}  // namespace

Result<ExportSummary> ExportCheckpoint(const std::string& spec_toml, CheckpointManifest::Reader manifest,
                                       const std::string& out_dir, const ExportOptions& options) {
  STRATA_ASSIGN_OR_RETURN(RunSpec spec, ParseStoredRunSpec(spec_toml));  // as stored, older names included
  const std::string run = manifest.getRunId().cStr();
  const int64_t step = manifest.getStep();
  std::map<std::string, storage::Tensor> tensors;  // HF name -> tensor in HF layout
  // Each rank wrote pieces of the parameters (its tensor-parallel slice, cut by data-parallel
  // rank; shard/layout.h): assemble them whole, whatever the mesh was.
  shard::TensorAssembler assembler(spec.model);
  std::map<std::string, storage::DType> dtypes;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto shard : manifest.getShards()) {
    // The shard's own store, else its copy on another host (a cluster spanning hosts), whichever
    // this machine reaches by path.
    std::string store_path = shard.getStorePath().cStr();
    std::string key_run = shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : run;
    storage::StoreOptions options;
    options.create_if_missing = false;
    options.read_only = true;
    auto store = storage::ShardStore::Open(store_path, options);
    for (auto copy : shard.getCopies()) {
      if (store.ok()) break;
      store = storage::ShardStore::Open(copy.getStorePath().cStr(), options);
      if (store.ok()) store_path = copy.getStorePath().cStr(), key_run = copy.getKeyRun().cStr();
    }
    if (!store.ok()) return store.status();
    for (auto entry : shard.getTensors()) {
      const std::string name = entry.getName().cStr();
      if (name.rfind(kParamPrefix, 0) != 0) continue;  // optimizer moments stay behind
      STRATA_ASSIGN_OR_RETURN(shard::PieceName piece, shard::ParsePiece(name));
      STRATA_ASSIGN_OR_RETURN(storage::Tensor t, (*store)->ReadCheckpointTensor(key_run, step, name));
      if (t.checksum != entry.getChecksum()) {
        return Corruption("tensor '" + name + "' in " + store_path + " does not match the checkpoint manifest; "
                          "export an older checkpoint (`strata checkpoints " + run + "`)");
      }
      const size_t element = storage::DTypeSize(t.dtype);
      if (t.bytes.size() != static_cast<size_t>(piece.end - piece.begin) * element) {
        return Corruption("tensor '" + name + "' in " + store_path + " holds " + std::to_string(t.bytes.size()) +
                          " bytes, not the piece its name describes");
      }
      STRATA_RETURN_IF_ERROR(assembler.Add(piece, element, t.bytes.data()));
      dtypes[piece.name] = t.dtype;
      shapes[piece.name] = piece.shape;
    }
  }
  // In the family's parameter order (embeddings, blocks, head), as save_pretrained lays them out.
  std::vector<std::pair<std::string, storage::Tensor>> ordered;
  for (const model::Parameter& p : model::Parameters(spec.model)) {
    if (!dtypes.count(p.name)) return Corruption("checkpoint " + std::to_string(step) + " of run " + run + " has no parameter " + p.name);
    storage::Tensor t;
    STRATA_ASSIGN_OR_RETURN(t.bytes, assembler.Take(p.name));
    t.dtype = dtypes[p.name];
    t.shape = shapes[p.name];
    const model::HfTensorName hf = model::ToHuggingFace(spec.model, p.name);
    if (hf.transposed && t.shape.size() == 2) {
      t.bytes = Transpose2d(t);
      std::swap(t.shape[0], t.shape[1]);
    }
    if (options.dtype == "bf16" && t.dtype == storage::DType::kF32) {
      t.bytes = ToBf16(t.bytes);
      t.dtype = storage::DType::kBF16;
    }
    ordered.emplace_back(hf.name, std::move(t));
  }
  if (ordered.empty()) return NotFound("checkpoint " + std::to_string(step) + " of run " + run + " holds no parameters");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError("cannot create " + out_dir + ": " + ec.message());
  // Files of at most max_shard_bytes, filled in order (a tensor larger than the limit gets a
  // file of its own), as save_pretrained shards.
  std::vector<std::vector<size_t>> files(1);
  uint64_t in_file = 0;
  ExportSummary summary;
  for (size_t i = 0; i < ordered.size(); ++i) {
    const uint64_t size = ordered[i].second.bytes.size();
    if (!files.back().empty() && in_file + size > options.max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(i);
    in_file += size;
    summary.bytes += size;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"strata_run", run}, {"strata_step", std::to_string(step)}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < files.size(); ++k) {
    const std::string name = files.size() == 1 ? "model.safetensors" : ShardFileName(k + 1, files.size());
    std::vector<storage::NamedTensorView> views;
    for (size_t i : files[k]) {
      const auto& [hf_name, t] = ordered[i];
      views.push_back({hf_name, {t.dtype, t.shape, t.bytes}});
      weight_map[hf_name] = name;
    }
    STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(out_dir + "/" + name, views, metadata));
  }
  if (files.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", summary.bytes}}}, {"weight_map", weight_map}};
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n", 0644));
  }
  summary.tensors = ordered.size();
  summary.files = files.size();
  // config.json: the source model's, so rope_scaling, token ids and the rest survive.
  std::string source_config;
  const std::string& init_from = spec.model.init_from;
  if (!init_from.empty()) {
    auto text = ReadSpecFile(init_from + "/config.json", "model config", 4 << 20);
    if (text.ok()) source_config = *text;
  }
  STRATA_ASSIGN_OR_RETURN(std::string config, HuggingFaceConfigJson(spec.model, source_config, options.dtype == "bf16" ? "bfloat16" : "float32"));
  STRATA_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/config.json", config, 0644));
  if (!init_from.empty()) {
    for (const std::string& name : model::CompanionFiles(init_from)) {
      std::filesystem::copy_file(init_from + "/" + name, out_dir + "/" + name, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return IoError("cannot copy " + init_from + "/" + name + " to " + out_dir + ": " + ec.message());
      ++summary.companion_files;
    }
  }
  return summary;
}

}  // namespace strata::cli
