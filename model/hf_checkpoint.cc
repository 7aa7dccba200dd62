#include "model/hf_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "model/parameters.h"
#include "storage/shard_store.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

Status AsInvalid(const Status& s) { return s.ok() ? s : InvalidArgument("model.init_from: " + s.message()); }

}  // namespace

Result<HfCheckpoint> HfCheckpoint::Open(const std::string& dir) {
  HfCheckpoint checkpoint;
  checkpoint.dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::is_regular_file(index_path, ec)) {
    checkpoint.layout_ = index_path.string();
    auto text = ReadSpecFile(index_path.string(), "safetensors index", 64 << 20);
    if (!text.ok()) return AsInvalid(text.status());
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(*text);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument("model.init_from: " + index_path.string() + " is not valid JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return InvalidArgument("model.init_from: " + index_path.string() + " has no \"weight_map\" object");
    }
    std::map<std::string, size_t> file_index;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string())
        return InvalidArgument("model.init_from: " + index_path.string() + " maps '" + tensor + "' to a non-string");
      const std::string name = file.get<std::string>();
      if (name.find('/') != std::string::npos || name == ".." || name.empty()) {
        return InvalidArgument("model.init_from: " + index_path.string() + " maps '" + tensor + "' to \"" + name +
                               "\", which is not a file name in the directory");
      }
      auto [it, inserted] = file_index.emplace(name, checkpoint.files_.size());
      if (inserted) {
        const fs::path path = fs::path(dir) / name;
        if (!fs::is_regular_file(path, ec)) {
          return InvalidArgument("model.init_from: " + index_path.string() + " names " + name +
                                 ", which is missing from " + dir + "; download or copy every shard of the model");
        }
        auto mapped = storage::MappedSafetensors::Open(path.string());
        if (!mapped.ok()) return AsInvalid(mapped.status());
        checkpoint.files_.push_back(std::move(*mapped));
      }
      const auto& tensors = checkpoint.files_[it->second]->tensors();
      if (!tensors.count(tensor)) {
        return InvalidArgument(
            "model.init_from: " + index_path.string() + " places tensor '" + tensor + "' in " + name +
            ", which does not hold it; the index and the files are from different models or versions");
      }
      checkpoint.where_[tensor] = it->second;
    }
  } else if (fs::is_regular_file(single, ec)) {
    checkpoint.layout_ = single.string();
    auto mapped = storage::MappedSafetensors::Open(single.string());
    if (!mapped.ok()) return AsInvalid(mapped.status());
    checkpoint.files_.push_back(std::move(*mapped));
    for (const auto& [name, _] : checkpoint.files_[0]->tensors()) checkpoint.where_[name] = 0;
  } else {
    return InvalidArgument("model.init_from = \"" + dir +
                           "\" holds neither model.safetensors nor model.safetensors.index.json; "
                           "point it at a directory saved by save_pretrained (safetensors) or `strata export`");
  }
  return checkpoint;
}

Result<storage::TensorView> HfCheckpoint::Find(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return NotFound(layout_ + " has no tensor '" + name + "'");
  return files_[it->second]->tensors().at(name);
}

bool HfCheckpoint::IsNf4(const std::string& name) const {
  return where_.count(name) && where_.count(name + ".quant_state.bitsandbytes__nf4");
}

Result<quant::Nf4Tensor> HfCheckpoint::FindNf4(const std::string& name) const {
  // bnb's entries of one weight (quant/nf4.h ToBnbStateDict), copied out of the mapping: a
  // weight's codes are half a byte an element, the scales a few bytes a block.
  std::vector<quant::StateEntry> entries;
  for (const char* suffix :
       {"", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4"}) {
    const std::string key = name + suffix;
    if (!where_.count(key)) continue;  // FromBnbStateDict names what is missing
    STRATA_ASSIGN_OR_RETURN(storage::TensorView view, Find(key));
    quant::StateEntry e;
    e.name = key;
    e.dtype = view.dtype == storage::DType::kU8 ? "U8" : view.dtype == storage::DType::kF32 ? "F32" : "other";
    e.shape = view.shape;
    e.bytes.assign(view.bytes.begin(), view.bytes.end());
    entries.push_back(std::move(e));
  }
  auto t = quant::FromBnbStateDict(entries, name);
  if (!t.ok()) return Status(t.status().code(), layout_ + ": " + t.status().message());
  return t;
}

Status CheckHfCheckpoint(const std::string& dir, const ModelSpec& m) {
  STRATA_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, HfCheckpoint::Open(dir));
  for (const Parameter& p : Parameters(m)) {
    const HfTensorName hf = ToHuggingFace(m, p.name);
    if (checkpoint.IsNf4(hf.name)) {
      // The shape its quant state records (the codes are read, and checked whole, at load).
      STRATA_ASSIGN_OR_RETURN(storage::TensorView state, checkpoint.Find(hf.name + ".quant_state.bitsandbytes__nf4"));
      const nlohmann::json json =
          nlohmann::json::parse(state.bytes.begin(), state.bytes.end(), nullptr, /*allow_exceptions=*/false);
      std::vector<int64_t> shape;
      if (json.is_object() && json.contains("shape") && json["shape"].is_array()) {
        for (const auto& d : json["shape"])
          if (d.is_number_integer()) shape.push_back(d.get<int64_t>());
      }
      if (shape != p.shape) {  // quantized matrices are [out, in], ours
        return InvalidArgument("model.init_from: NF4 weight '" + hf.name + "' has shape " + ShapeText(shape) +
                               " in its quant_state.bitsandbytes__nf4 but config.json implies " + ShapeText(p.shape) +
                               "; the weights do not match config.json");
      }
      if (p.shape.size() != 2) {
        return InvalidArgument("model.init_from: '" + hf.name + "' is NF4 but is no matrix; Strata loads NF4 linears");
      }
      continue;
    }
    auto t = checkpoint.Find(hf.name);
    if (!t.ok()) {
      return InvalidArgument("model.init_from: " + t.status().message() + ", which a " + std::string(Name(m.family)) +
                             " model of this config needs; the weights do not match config.json");
    }
    std::vector<int64_t> expected = p.shape;
    if (hf.transposed && expected.size() == 2) std::swap(expected[0], expected[1]);
    if (t->shape != expected) {
      return InvalidArgument("model.init_from: tensor '" + hf.name + "' has shape " + ShapeText(t->shape) +
                             " but config.json implies " + ShapeText(expected) +
                             "; the weights do not match config.json");
    }
    if (t->dtype != storage::DType::kF32 && t->dtype != storage::DType::kBF16 && t->dtype != storage::DType::kF16) {
      return InvalidArgument(
          "model.init_from: tensor '" + hf.name + "' has dtype " + storage::DTypeName(t->dtype) +
          "; Strata loads F32, BF16 and F16 weights, and bitsandbytes NF4 matrices (a weight beside its "
          "quant_state.bitsandbytes__nf4)");
    }
  }
  return Status::Ok();
}

Result<std::string> BaseIdentity(const ModelSpec& m, int64_t seed) {
  std::string text;
  for (const Parameter& p : Parameters(m)) {
    text += p.name;
    for (int64_t d : p.shape) text += "," + std::to_string(d);
    text += ";";
  }
  auto hex = [](uint64_t h) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return std::string(buf);
  };
  const std::string table = hex(storage::Checksum({reinterpret_cast<const uint8_t*>(text.data()), text.size()}));
  if (m.init_from.empty()) return "seed " + std::to_string(seed) + " table " + table;
  STRATA_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, HfCheckpoint::Open(m.init_from));
  std::string fingerprint;
  for (const auto& [name, where] : checkpoint.where_) {
    STRATA_ASSIGN_OR_RETURN(storage::TensorView t, checkpoint.Find(name));
    fingerprint += name + ":" + storage::DTypeName(t.dtype);
    for (int64_t d : t.shape) fingerprint += "," + std::to_string(d);
    constexpr size_t kEdge = 4096;
    const size_t n = t.bytes.size(), head = std::min(n, kEdge), tail = std::min(n - head, kEdge);
    fingerprint +=
        ":" + hex(storage::Checksum(t.bytes.subspan(0, head))) + hex(storage::Checksum(t.bytes.subspan(n - tail)));
    fingerprint += ";";
  }
  return "init_from " +
         hex(storage::Checksum({reinterpret_cast<const uint8_t*>(fingerprint.data()), fingerprint.size()})) +
         " table " + table;
}

std::vector<std::string> CompanionFiles(const std::string& dir) {
  static const std::set<std::string> known = {
      "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
      "vocab.json",     "merges.txt",      "added_tokens.json",     "chat_template.jinja"};
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& name : known) {
    if (fs::is_regular_file(fs::path(dir) / name, ec)) out.push_back(name);
  }
  return out;
}

}  // namespace strata::model
