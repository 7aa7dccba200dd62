#include "worker/causal_lm.h"

#include <mutex>

#include "model/parameters.h"
#include "worker/hf_format.h"
#include "worker/model_family.h"

namespace strata::worker {
namespace {

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

CausalLm::CausalLm(const ModelSpec& spec, const torch::TensorOptions& options) : spec_(spec), family_(CreateModelFamily(spec)) {
  // Modules along each dotted name ("layers" -> "layers.3" -> "layers.3.self_attn" -> ...), so
  // named_parameters() gives the table's names and a block moves as one module.
  for (const model::Parameter& p : model::Parameters(spec)) {
    torch::nn::Module* node = this;
    std::string path;
    size_t begin = 0;
    for (size_t dot = p.name.find('.'); dot != std::string::npos; dot = p.name.find('.', begin)) {
      const std::string segment = p.name.substr(begin, dot - begin);
      path += (path.empty() ? "" : ".") + segment;
      auto& child = nodes_[path];
      if (!child) child = node->register_module(segment, std::make_shared<torch::nn::Module>());
      node = child.get();
      begin = dot + 1;
    }
    names_.push_back(p.name);
    params_.push_back(node->register_parameter(p.name.substr(begin), torch::empty(p.shape, options)));
  }
  auto view_of = [&](const std::vector<std::string>& wanted, const std::string& strip) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> tensors;
    for (size_t i = 0; i < names_.size(); ++i) {
      for (const auto& w : wanted) {
        if (names_[i] == w || (!strip.empty() && w == strip && StartsWith(names_[i], strip))) {
          names.push_back(names_[i].substr(strip.size()));
          tensors.push_back(params_[i]);
        }
      }
    }
    return ParamView(std::move(names), std::move(tensors));
  };
  embedding_ = std::make_unique<ParamView>(view_of(model::EmbeddingNames(spec), ""));
  final_norm_ = std::make_unique<ParamView>(view_of(model::FinalNormNames(spec), ""));
  for (int64_t layer = 0; layer < spec.layers; ++layer) {
    const std::string prefix = model::BlockPrefix(spec, layer);
    blocks_.push_back(view_of({prefix}, prefix));
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == model::HeadWeightName(spec)) head_ = params_[i];
  }
}

CausalLm::~CausalLm() = default;

void CausalLm::Initialize() {
  // GPT-2 draws its blocks first and its embeddings last (Strata always has: a seed keeps giving
  // the same model); every other family draws in table order.
  const bool gpt2 = spec_.family == "gpt2";
  auto last = [&](const std::string& name) { return gpt2 && (name == "wte.weight" || name == "wpe.weight"); };
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!last(names_[i])) family_->Initialize(names_[i], params_[i]);
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    if (last(names_[i])) family_->Initialize(names_[i], params_[i]);
  }
}

torch::Tensor CausalLm::Embed(const torch::Tensor& tokens) { return family_->Embed(*embedding_, tokens); }

BlockOutputs CausalLm::RunBlock(int64_t layer, const torch::Tensor& x) { return family_->Block(blocks_[layer], x, TensorParallel{}); }

void CausalLm::RunBlocks(const torch::Tensor& tokens, int64_t last_layer, const BlockVisitor& visit) {
  auto x = Embed(tokens);
  for (int64_t i = 0; i <= last_layer && i < num_blocks(); ++i) {
    BlockOutputs out = RunBlock(i, x);
    visit(i, out);
    x = out.resid_post;
  }
}

torch::Tensor CausalLm::Logits(const torch::Tensor& tokens) {
  auto x = Embed(tokens);
  for (int64_t i = 0; i < num_blocks(); ++i) x = RunBlock(i, x).resid_post;
  return torch::linear(family_->FinalNorm(*final_norm_, x), head_);
}

void CausalLm::MoveEmbedding(const torch::Device& device, torch::ScalarType type) {
  for (const std::string& name : model::EmbeddingNames(spec_)) nodes_.at(name.substr(0, name.find('.')))->to(device, type);
}

void CausalLm::MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type) {
  const std::string prefix = model::BlockPrefix(spec_, layer);
  nodes_.at(prefix.substr(0, prefix.size() - 1))->to(device, type);
}

std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec) {
  auto model = std::make_shared<CausalLm>(spec);
  model->Initialize();
  return model;
}

Result<std::shared_ptr<CausalLm>> BuildCausalLm(const ModelSpec& spec, int64_t seed, bool for_resume,
                                                const torch::TensorOptions& options) {
  const bool loaded = !spec.init_from.empty() && !for_resume;
  // Weights read from init_from go straight to their place; drawn ones are drawn on the host in
  // fp32 (what the seed means everywhere) and moved after.
  std::shared_ptr<CausalLm> model = std::make_shared<CausalLm>(spec, loaded ? options : torch::TensorOptions(torch::kFloat));
  if (loaded) {
    STRATA_RETURN_IF_ERROR(LoadHuggingFace(spec.init_from, spec, *model));
  } else if (!for_resume) {
    // The generator is process-global: tasks sharing a process (tests) must not interleave
    // their initialisation.
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(static_cast<uint64_t>(seed));
    model->Initialize();
  }
  if (!loaded) model->to(options.device(), options.dtype().toScalarType());
  return model;
}

torch::ScalarType ScalarTypeOf(const std::string& name) {
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kHalf;
  return torch::kFloat;  // the run spec admits only these three
}

storage::DType ToStoreDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return storage::DType::kF32;
    case torch::kHalf: return storage::DType::kF16;
    case torch::kBFloat16: return storage::DType::kBF16;
    case torch::kDouble: return storage::DType::kF64;
    case torch::kLong: return storage::DType::kI64;
    case torch::kInt: return storage::DType::kI32;
    default: return storage::DType::kU8;
  }
}

storage::TensorView ViewOf(const torch::Tensor& cpu_contiguous) {
  storage::TensorView view;
  view.dtype = ToStoreDType(cpu_contiguous.scalar_type());
  view.shape.assign(cpu_contiguous.sizes().begin(), cpu_contiguous.sizes().end());
  view.bytes = {static_cast<const uint8_t*>(cpu_contiguous.data_ptr()),
                static_cast<size_t>(cpu_contiguous.numel() * cpu_contiguous.element_size())};
  return view;
}

}  // namespace strata::worker
