#include "worker/nn/hf_format.h"

#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>

#include "common/atomic_file.h"
#include "quant/nf4.h"
#include "spec/hf_config.h"
#include "storage/safetensors.h"
#include "worker/nn/tensor_bytes.h"

namespace strata::worker {
namespace {

// Drops the pages of `bytes` from this process's mapping (they stay in the page cache): what a
// rank has copied out no longer counts against its resident memory.
void ReleasePages(std::span<const uint8_t> bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

Status ExportHuggingFace(const NamedTensors& params, const ModelSpec& spec, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());
  std::vector<torch::Tensor> keep_alive;
  std::vector<storage::NamedTensorView> views;
  for (const auto& item : params) {
    auto t = item.value().detach().to(torch::kCPU, torch::kFloat);
    const model::HfTensorName hf = model::ToHuggingFace(spec, item.key());
    if (hf.transposed) t = t.t();
    t = t.contiguous();
    keep_alive.push_back(t);
    views.push_back({hf.name, ViewOf(t)});
  }
  STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(dir + "/model.safetensors", views, {{"format", "pt"}}));
  STRATA_ASSIGN_OR_RETURN(std::string config, HuggingFaceConfigJson(spec, "", "float32"));
  return WriteFileAtomically(dir + "/config.json", config, 0644);
}

Status WithHfParameter(const model::HfCheckpoint& checkpoint, const ModelSpec& spec, const model::Parameter& param,
                       const std::function<void(const torch::Tensor&)>& use) {
  const model::HfTensorName hf = model::ToHuggingFace(spec, param.name);
  if (checkpoint.IsNf4(hf.name)) {
    // A bitsandbytes NF4 matrix ([out, in] in every family): dequantized in fp32 (table value x
    // block scale, exact), which a QLoRA base quantizes back to the same codes and block scales.
    STRATA_ASSIGN_OR_RETURN(quant::Nf4Tensor q, checkpoint.FindNf4(hf.name));
    if (q.shape != param.shape) {
      return InvalidArgument("NF4 weight '" + hf.name + "' has shape " + c10::str(c10::IntArrayRef(q.shape)) +
                             " but the model needs " + c10::str(c10::IntArrayRef(param.shape)) +
                             "; check the run spec's [model] against config.json");
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<float> values, quant::DequantizeNf4(q));
    use(torch::from_blob(values.data(), param.shape, torch::kFloat));
    return Status::Ok();
  }
  STRATA_ASSIGN_OR_RETURN(storage::TensorView src, checkpoint.Find(hf.name));
  torch::ScalarType type;
  switch (src.dtype) {
    case storage::DType::kF32:
      type = torch::kFloat;
      break;
    case storage::DType::kBF16:
      type = torch::kBFloat16;
      break;
    case storage::DType::kF16:
      type = torch::kHalf;
      break;
    default:
      return InvalidArgument("tensor '" + hf.name + "' has dtype " + storage::DTypeName(src.dtype) +
                             "; expected F32, BF16 or F16");
  }
  auto t = torch::from_blob(const_cast<uint8_t*>(src.bytes.data()), src.shape, type);
  if (hf.transposed) t = t.t().contiguous();  // GPT-2's Conv1D: the one layout that needs a copy
  if (t.sizes().vec() != param.shape) {
    return InvalidArgument("tensor '" + hf.name + "' has shape " + c10::str(t.sizes()) + " but the model needs " +
                           c10::str(c10::IntArrayRef(param.shape)) +
                           "; check the run spec's [model] against config.json");
  }
  use(t);
  ReleasePages(src.bytes);
  return Status::Ok();
}

Status LoadHuggingFace(const std::string& dir, const ModelSpec& spec, const NamedTensors& params) {
  STRATA_ASSIGN_OR_RETURN(model::HfCheckpoint checkpoint, model::HfCheckpoint::Open(dir));
  std::map<std::string, model::Parameter> table;
  for (model::Parameter& p : model::Parameters(spec)) table.emplace(p.name, std::move(p));
  torch::NoGradGuard no_grad;
  for (const auto& item : params) {
    // Straight from the mapped bytes into the parameter, converting dtype and crossing to the
    // device in one copy: no host copy of the model, whatever its size.
    torch::Tensor dest = item.value();  // shares the parameter's storage
    STRATA_RETURN_IF_ERROR(
        WithHfParameter(checkpoint, spec, table.at(item.key()), [&](const torch::Tensor& t) { dest.copy_(t); }));
  }
  return Status::Ok();
}

}  // namespace strata::worker
