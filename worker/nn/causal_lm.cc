#include "worker/nn/causal_lm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <tuple>

#include "common/token_file.h"
#include "kernels/kernels.h"
#include "model/parameters.h"
#include "worker/nn/hf_format.h"
#include "worker/nn/kernel_place.h"
#include "worker/nn/lora.h"
#include "worker/nn/model_family.h"

namespace strata::worker {
namespace {

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

CausalLm::CausalLm(const ModelSpec& spec, const torch::TensorOptions& options)
    : spec_(spec), family_(CreateModelFamily(spec)) {
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

void CausalLm::Initialize(int64_t seed) {
  const ParameterDraw draw(spec_, seed);
  for (size_t i = 0; i < names_.size(); ++i) draw.Fill(names_[i], params_[i]);
}

namespace {

// SplitMix64's finaliser: distinct (seed, name, run) give unrelated generator seeds.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t NameHash(const std::string& name) {  // FNV-1a: stable across builds and platforms
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

ParameterDraw::ParameterDraw(const ModelSpec& spec, int64_t seed) : family_(CreateModelFamily(spec)), seed_(seed) {}
ParameterDraw::~ParameterDraw() = default;

torch::Tensor ParameterDraw::operator()(const model::Parameter& p, torch::Device device) const {
  torch::Tensor t = torch::empty(p.shape, torch::TensorOptions().dtype(torch::kFloat).device(device));
  Fill(p.name, t);
  return t;
}

void ParameterDraw::Fill(const std::string& name, torch::Tensor& t) const {
  TORCH_CHECK(t.is_contiguous() && t.scalar_type() == torch::kFloat, name,
              ": ParameterDraw fills a contiguous fp32 tensor");
  torch::NoGradGuard no_grad;
  const ModelFamily::InitRule rule = family_->InitialValues(name);
  if (!rule.drawn) {
    t.fill_(rule.constant);
    return;
  }
  const uint64_t stream = Mix(static_cast<uint64_t>(seed_) ^ Mix(NameHash(name)));
  kernels::DrawNormal(KernelPlace(t.device()), stream, /*first=*/0, 0.0f, static_cast<float>(rule.std),
                      t.data_ptr<float>(), t.numel(), at::get_num_threads());
}

torch::Tensor CausalLm::Embed(const torch::Tensor& tokens) {
  return family_->Embed(*embedding_, tokens, TensorParallel{});
}

BlockOutputs CausalLm::RunBlock(int64_t layer, const torch::Tensor& x, const BlockRequest& request) {
  return family_->Block(blocks_[layer], x, TensorParallel{}, request);
}

torch::Tensor CausalLm::RunBlocks(const torch::Tensor& tokens, int64_t last_layer, const BlockVisitor& visit,
                                  const BlockRequestFn& request) {
  auto x = Embed(tokens);
  for (int64_t i = 0; i <= last_layer && i < num_blocks(); ++i) {
    BlockOutputs out = RunBlock(i, x, request ? request(i) : BlockRequest{});
    visit(i, out);
    x = out.resid_post;
  }
  return x;
}

torch::Tensor CausalLm::FinalNorm(const torch::Tensor& x) { return family_->FinalNorm(*final_norm_, x); }

torch::Tensor CausalLm::Head(const torch::Tensor& normed) { return torch::linear(normed, head_); }

const torch::Tensor& BlockOutputs::Site(const std::string& site) const {
  static const torch::Tensor none;
  if (site == "resid_pre") return resid_pre;
  if (site == "attn_out") return attn_out;
  if (site == "resid_mid") return resid_mid;
  if (site == "q") return q;
  if (site == "k") return k;
  if (site == "v") return v;
  if (site == "attn_pattern") return attn_pattern;
  if (site == "mlp_hidden") return mlp_hidden;
  if (site == "mlp_out") return mlp_out;
  if (site == "resid_post") return resid_post;
  return none;
}

torch::Tensor CausalLm::Logits(const torch::Tensor& tokens) {
  auto x = Embed(tokens);
  for (int64_t i = 0; i < num_blocks(); ++i) x = RunBlock(i, x).resid_post;
  return torch::linear(family_->FinalNorm(*final_norm_, x), head_);
}

void CausalLm::MoveEmbedding(const torch::Device& device, torch::ScalarType type) {
  for (const std::string& name : model::EmbeddingNames(spec_))
    nodes_.at(name.substr(0, name.find('.')))->to(device, type);
}

void CausalLm::MoveFinal(const torch::Device& device, torch::ScalarType type) {
  std::vector<std::string> names = model::FinalNormNames(spec_);
  names.push_back(model::HeadWeightName(spec_));
  for (const std::string& name : names) nodes_.at(name.substr(0, name.find('.')))->to(device, type);
}

void CausalLm::MoveBlock(int64_t layer, const torch::Device& device, torch::ScalarType type) {
  const std::string prefix = model::BlockPrefix(spec_, layer);
  nodes_.at(prefix.substr(0, prefix.size() - 1))->to(device, type);
}

std::vector<std::pair<int64_t, std::string>> ExtractRecordNames(const RunSpec& spec) {
  std::vector<std::pair<int64_t, std::string>> names;
  for (int64_t layer : spec.extract.layers) {
    for (const std::string& site : spec.extract.sites) {
      if (!IsModelLevelSite(site) || layer == spec.model.layers - 1) names.emplace_back(layer, site);
    }
  }
  return names;
}

namespace {

// patch.source for ablation = "mean": an fp32 .npy of the site's row shape (checked at submit;
// checked again here, since the file may have changed since).
torch::Tensor ReadMeanValues(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "patch.source = \"", path, "\" cannot be read");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto header = ParseNpyHeader(bytes, "patch.source = \"" + path + "\"");
  TORCH_CHECK(header.ok(), header.status().message());
  TORCH_CHECK(header->descr == "<f4" && !header->fortran_order, "patch.source = \"", path,
              "\" is not a C-order fp32 .npy");
  std::vector<int64_t> shape(header->shape.begin(), header->shape.end());
  auto values = torch::empty(shape, torch::kFloat);
  const size_t size = static_cast<size_t>(values.numel()) * sizeof(float);
  TORCH_CHECK(bytes.size() >= header->data_offset + size, "patch.source = \"", path,
              "\" is shorter than its header says");
  std::memcpy(values.data_ptr<float>(), bytes.data() + header->data_offset, size);
  return values;
}

}  // namespace

BlockRequest ExtractRequest(const RunSpec& spec, int64_t layer) {
  BlockRequest request;
  const auto& layers = spec.extract.layers;
  const auto& sites = spec.extract.sites;
  request.attn_pattern = std::binary_search(layers.begin(), layers.end(), layer) &&
                         std::find(sites.begin(), sites.end(), "attn_pattern") != sites.end();
  if (spec.is_patch() && std::binary_search(spec.patch.layers.begin(), spec.patch.layers.end(), layer)) {
    const std::vector<std::string> patched = spec.patch.sites;
    // zero: the site's value replaced by zeros of its shape and dtype; mean: every row by the
    // given vector (broadcast over batch and time), cast to the compute dtype; steer: alpha times
    // the vector added to every row, value + (alpha * v) with alpha * v in fp32, then cast.
    torch::Tensor vector;
    const Ablation ablation = spec.patch.ablation;
    if (ablation == Ablation::kMean || ablation == Ablation::kSteer) vector = ReadMeanValues(spec.patch.source);
    if (ablation == Ablation::kSteer) vector = vector * spec.patch.alpha;
    request.patch = [patched, vector, ablation](const std::string& site, const torch::Tensor& value) {
      if (std::find(patched.begin(), patched.end(), site) == patched.end()) return value;
      if (ablation == Ablation::kZero) return torch::zeros_like(value);
      if (ablation == Ablation::kSteer) return value + vector.to(value.options());
      return vector.to(value.options()).expand_as(value);
    };
  }
  return request;
}

std::vector<torch::Tensor> ExtractRows(CausalLm& model, const RunSpec& spec, int64_t layer, const BlockOutputs& block,
                                       const torch::Tensor& tokens) {
  std::vector<torch::Tensor> rows;
  const auto& layers = spec.extract.layers;
  if (!std::binary_search(layers.begin(), layers.end(), layer)) return rows;
  const torch::ScalarType stored = ScalarTypeOf(spec.extract.dtype);
  auto shaped = [&](const torch::Tensor& value, const std::string& site) {
    std::vector<int64_t> shape = {-1};
    for (int64_t d : ExtractSiteRowShape(spec, site)) shape.push_back(d);
    return value.reshape(shape);
  };
  torch::Tensor normed, logits, top_values, top_ids;
  for (const std::string& site : spec.extract.sites) {
    if (!IsModelLevelSite(site)) {
      rows.push_back(shaped(block.Site(site), site).to(stored));
      continue;
    }
    if (layer != spec.model.layers - 1) continue;
    if (!normed.defined()) normed = model.FinalNorm(block.resid_post);
    if (site == "final_norm") {
      rows.push_back(shaped(normed, site).to(stored));
      continue;
    }
    if (!logits.defined()) logits = model.Head(normed);
    if (site == "logits" && spec.extract.logits_top_k == 0) {
      rows.push_back(shaped(logits, site).to(stored));
    } else if (site == "logits" || site == "logits_ids") {
      if (!top_values.defined()) std::tie(top_values, top_ids) = torch::topk(logits, spec.extract.logits_top_k, -1);
      rows.push_back(site == "logits" ? shaped(top_values, site).to(stored) : shaped(top_ids, site).to(torch::kInt));
    } else if (site == "loss") {
      const int64_t t = logits.size(1);
      auto logp = torch::log_softmax(logits.narrow(1, 0, t - 1).to(torch::kFloat), -1);
      auto next = tokens.to(logits.device()).narrow(1, 1, t - 1).unsqueeze(-1);
      auto loss = -logp.gather(-1, next);  // [b, t - 1, 1]
      auto last = torch::full({loss.size(0), 1, 1}, std::numeric_limits<float>::quiet_NaN(), loss.options());
      rows.push_back(shaped(torch::cat({loss, last}, 1), site).to(stored));
    }
  }
  return rows;
}

std::shared_ptr<CausalLm> CreateCausalLm(const ModelSpec& spec, int64_t seed) {
  auto model = std::make_shared<CausalLm>(spec);
  model->Initialize(seed);
  return model;
}

Result<std::shared_ptr<CausalLm>> BuildCausalLm(const ModelSpec& spec, int64_t seed, bool for_resume,
                                                const torch::TensorOptions& options) {
  const bool loaded = !spec.init_from.empty() && !for_resume;
  // Weights read from init_from go straight to their place; drawn ones are drawn on the host in
  // fp32 (what the seed means everywhere) and moved after.
  std::shared_ptr<CausalLm> model =
      std::make_shared<CausalLm>(spec, loaded ? options : torch::TensorOptions(torch::kFloat));
  if (loaded) {
    STRATA_RETURN_IF_ERROR(LoadHuggingFace(spec.init_from, spec, model->named_parameters()));
  } else if (!for_resume) {
    model->Initialize(seed);
  }
  if (!loaded) model->to(options.device(), options.dtype().toScalarType());
  // An adapter over the base (extract and patch runs; a LoRA train run trains it instead, and a
  // resume loads weights that already hold it).
  if (!spec.adapter_from.empty() && !for_resume)
    STRATA_RETURN_IF_ERROR(MergePeftAdapter(spec.adapter_from, spec, model->named_parameters()));
  return model;
}

}  // namespace strata::worker
