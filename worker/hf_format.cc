#include "worker/hf_format.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "storage/safetensors.h"

namespace strata::worker {
namespace {

bool IsConv1D(const std::string& ours) {
  for (const char* suffix : {"c_attn.weight", "attn_proj.weight", "c_fc.weight", "mlp_proj.weight"}) {
    const std::string s(suffix);
    if (ours.size() >= s.size() && ours.compare(ours.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

std::string ToHfName(const ModelSpec& spec, const std::string& ours) {
  if (spec.family == "llama") return ours == "lm_head.weight" ? ours : "model." + ours;
  std::string name = ours;
  auto replace = [&](const std::string& from, const std::string& to) {
    auto pos = name.find(from);
    if (pos != std::string::npos) name.replace(pos, from.size(), to);
  };
  replace(".c_attn.", ".attn.c_attn.");
  replace(".attn_proj.", ".attn.c_proj.");
  replace(".c_fc.", ".mlp.c_fc.");
  replace(".mlp_proj.", ".mlp.c_proj.");
  return "transformer." + name;
}

nlohmann::json Config(const ModelSpec& s) {
  if (s.family == "llama") {
    return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
            {"hidden_size", s.hidden}, {"intermediate_size", s.ffn},
            {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
            {"num_hidden_layers", s.layers}, {"vocab_size", s.vocab},
            {"max_position_embeddings", s.sequence}, {"rms_norm_eps", s.norm_eps},
            {"rope_theta", s.rope_theta}, {"hidden_act", "silu"},
            {"attention_bias", false}, {"mlp_bias", false},
            {"tie_word_embeddings", false}, {"torch_dtype", "float32"}};
  }
  return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"},
          {"n_embd", s.hidden}, {"n_head", s.heads}, {"n_layer", s.layers},
          {"n_inner", s.ffn}, {"n_positions", s.sequence}, {"n_ctx", s.sequence},
          {"vocab_size", s.vocab}, {"layer_norm_epsilon", s.norm_eps},
          {"activation_function", "gelu_new"}, {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0}, {"tie_word_embeddings", true}, {"torch_dtype", "float32"}};
}

}  // namespace

Status ExportHuggingFace(CausalLm& model, const ModelSpec& spec, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create " + dir + ": " + ec.message());
  std::vector<torch::Tensor> keep_alive;
  std::vector<storage::NamedTensorView> views;
  for (auto& item : model.named_parameters()) {
    auto t = item.value().detach().to(torch::kCPU, torch::kFloat);
    if (spec.family == "gpt2" && IsConv1D(item.key())) t = t.t();
    t = t.contiguous();
    keep_alive.push_back(t);
    storage::TensorView view;
    view.dtype = storage::DType::kF32;
    view.shape = t.sizes().vec();
    view.bytes = {static_cast<const uint8_t*>(t.data_ptr()), static_cast<size_t>(t.numel()) * 4};
    views.push_back({ToHfName(spec, item.key()), view});
  }
  STRATA_RETURN_IF_ERROR(storage::WriteSafetensors(dir + "/model.safetensors", views, {{"format", "pt"}}));
  std::ofstream(dir + "/config.json") << Config(spec).dump(2) << "\n";
  return Status::Ok();
}

Status LoadHuggingFace(const std::string& dir, const ModelSpec& spec, CausalLm& model) {
  STRATA_ASSIGN_OR_RETURN(auto file, storage::ReadSafetensors(dir + "/model.safetensors"));
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const std::string hf = ToHfName(spec, item.key());
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
    if (spec.family == "gpt2" && IsConv1D(item.key())) t = t.t();
    if (t.sizes() != item.value().sizes()) {
      return InvalidArgument("tensor '" + hf + "' has shape " + c10::str(t.sizes()) + " but the model spec needs " +
                             c10::str(item.value().sizes()) + "; check the run spec's [model] against config.json");
    }
    item.value().copy_(t);
  }
  return Status::Ok();
}

}  // namespace strata::worker
