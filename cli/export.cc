#include "cli/export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/run_spec.h"
#include "shard/layout.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"
#include "worker/hf_layout.h"

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

}  // namespace

Result<ExportSummary> ExportCheckpoint(const std::string& spec_toml, CheckpointManifest::Reader manifest,
                                       const std::string& out_dir) {
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
  for (const std::string& name : assembler.names()) {
    storage::Tensor t;
    STRATA_ASSIGN_OR_RETURN(t.bytes, assembler.Take(name));
    t.dtype = dtypes[name];
    t.shape = shapes[name];
    const worker::HfTensorName hf = worker::ToHuggingFace(spec.model, name);
    if (hf.transposed && t.shape.size() == 2) {
      t.bytes = Transpose2d(t);
      std::swap(t.shape[0], t.shape[1]);
    }
    tensors[hf.name] = std::move(t);
  }
  if (tensors.empty()) return NotFound("checkpoint " + std::to_string(step) + " of run " + run + " holds no parameters");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError("cannot create " + out_dir + ": " + ec.message());
  ExportSummary summary;
  std::vector<storage::NamedTensorView> views;
  for (const auto& [name, t] : tensors) {
    views.push_back({name, {t.dtype, t.shape, t.bytes}});
    summary.bytes += t.bytes.size();
  }
  summary.tensors = views.size();
  STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(out_dir + "/model.safetensors", views,
                                                   {{"format", "pt"}, {"strata_run", run}, {"strata_step", std::to_string(step)}}));
  std::ofstream config(out_dir + "/config.json");
  config << worker::HuggingFaceConfigJson(spec.model);
  if (!config) return IoError("cannot write " + out_dir + "/config.json");
  return summary;
}

}  // namespace strata::cli
