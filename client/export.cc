#include "client/export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "model/hf_checkpoint.h"
#include "model/parameters.h"
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
  // Where each parameter's pieces are: each rank wrote pieces of the parameters (its
  // tensor-parallel slice, cut by data-parallel rank; shard/layout.h). Nothing is read yet.
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
  std::vector<OpenStore> stores;
  std::map<std::string, std::vector<PieceRef>> pieces;  // parameter -> its pieces
  for (auto shard : manifest.getShards()) {
    // The shard's own store, else its copy on another host (a cluster spanning hosts), whichever
    // this machine reaches by path.
    std::string store_path = shard.getStorePath().cStr();
    std::string key_run = shard.getKeyRun().size() > 0 ? shard.getKeyRun().cStr() : run;
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
    stores.push_back({std::move(*store), store_path, key_run});
    for (auto entry : shard.getTensors()) {
      const std::string name = entry.getName().cStr();
      if (name.rfind(kParamPrefix, 0) != 0) continue;  // optimizer moments stay behind
      STRATA_ASSIGN_OR_RETURN(shard::PieceName piece, shard::ParsePiece(name));
      pieces[piece.name].push_back({stores.size() - 1, name, entry.getChecksum(), piece});
    }
  }
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
  auto export_all = [&]() -> Status {
    shard::TensorAssembler assembler(spec.model);
    for (const model::Parameter& p : model::Parameters(spec.model)) {
      auto found = pieces.find(p.name);
      if (found == pieces.end())
        return Corruption("checkpoint " + std::to_string(step) + " of run " + run + " has no parameter " + p.name);
      storage::Tensor t;
      for (const PieceRef& ref : found->second) {
        const OpenStore& from = stores[ref.store];
        STRATA_ASSIGN_OR_RETURN(storage::Tensor read, from.store->ReadCheckpointTensor(from.key_run, step, ref.name));
        if (read.checksum != ref.checksum) {
          return Corruption("tensor '" + ref.name + "' in " + from.path +
                            " does not match the checkpoint manifest; "
                            "export an older checkpoint (`strata checkpoints " +
                            run + "`)");
        }
        const size_t element = storage::DTypeSize(read.dtype);
        if (read.bytes.size() != static_cast<size_t>(ref.piece.end - ref.piece.begin) * element) {
          return Corruption("tensor '" + ref.name + "' in " + from.path + " holds " +
                            std::to_string(read.bytes.size()) + " bytes, not the piece its name describes");
        }
        STRATA_RETURN_IF_ERROR(assembler.Add(ref.piece, element, read.bytes.data()));
        t.dtype = read.dtype;
        t.shape = ref.piece.shape;
      }
      STRATA_ASSIGN_OR_RETURN(t.bytes, assembler.Take(p.name));
      const model::HfTensorName hf = model::ToHuggingFace(spec.model, p.name);
      if (hf.transposed && t.shape.size() == 2) {
        t.bytes = Transpose2d(t);
        std::swap(t.shape[0], t.shape[1]);
      }
      if (options.dtype == "bf16" && t.dtype == storage::DType::kF32) {
        t.bytes = ToBf16(t.bytes);
        t.dtype = storage::DType::kBF16;
      }
      const uint64_t size = t.bytes.size();
      if (!pending.empty() && pending_bytes + size > options.max_shard_bytes) STRATA_RETURN_IF_ERROR(flush());
      pending.emplace_back(hf.name, std::move(t));
      pending_bytes += size;
      summary.bytes += size;
      ++summary.tensors;
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
  STRATA_ASSIGN_OR_RETURN(std::string config, HuggingFaceConfigJson(spec.model, source_config,
                                                                    options.dtype == "bf16" ? "bfloat16" : "float32"));
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

}  // namespace strata::client
