#include "worker/hf_format.h"

#include <filesystem>
#include <fstream>

#include "storage/safetensors.h"
#include "worker/hf_layout.h"

namespace strata::worker {

Status ExportHuggingFace(CausalLm& model, const ModelSpec& spec, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());
  std::vector<torch::Tensor> keep_alive;
  std::vector<storage::NamedTensorView> views;
  for (auto& item : model.named_parameters()) {
    auto t = item.value().detach().to(torch::kCPU, torch::kFloat);
    const HfTensorName hf = ToHuggingFace(spec, item.key());
    if (hf.transposed) t = t.t();
    t = t.contiguous();
    keep_alive.push_back(t);
    views.push_back({hf.name, ViewOf(t)});
  }
  STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(dir + "/model.safetensors", views, {{"format", "pt"}}));
  std::ofstream(dir + "/config.json") << HuggingFaceConfigJson(spec);
  return Status::Ok();
}

Status LoadHuggingFace(const std::string& dir, const ModelSpec& spec, CausalLm& model) {
  STRATA_ASSIGN_OR_RETURN(auto file, storage::ReadSafetensors(dir + "/model.safetensors"));
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const HfTensorName hf_name = ToHuggingFace(spec, item.key());
    const std::string& hf = hf_name.name;
    auto it = file.tensors.find(hf);
    if (it == file.tensors.end()) return NotFound(dir + "/model.safetensors has no tensor '" + hf + "'");
    const storage::Tensor& src = it->second;
    torch::ScalarType type = src.dtype == storage::DType::kBF16   ? torch::kBFloat16
                             : src.dtype == storage::DType::kF16 ? torch::kHalf
                                                                 : torch::kFloat;
    if (src.dtype != storage::DType::kF32 && src.dtype != storage::DType::kBF16 && src.dtype != storage::DType::kF16) {
      return InvalidArgument("tensor '" + hf + "' has dtype " + storage::DTypeName(src.dtype) + "; expected a float type");
    }
    auto t = torch::from_blob(const_cast<uint8_t*>(src.bytes.data()), src.shape, type);
    if (hf_name.transposed) t = t.t();
    if (t.sizes() != item.value().sizes()) {
      return InvalidArgument("tensor '" + hf + "' has shape " + c10::str(t.sizes()) + " but the model spec needs " +
                             c10::str(item.value().sizes()) + "; check the run spec's [model] against config.json");
    }
    item.value().copy_(t);
  }
  return Status::Ok();
}

}  // namespace strata::worker
