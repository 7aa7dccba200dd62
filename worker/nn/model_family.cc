#include "worker/nn/model_family.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "model/parameters.h"

namespace strata::worker {

// Defined in the family files.
std::unique_ptr<ModelFamily> CreateGpt2Family(const ModelSpec& spec);
std::unique_ptr<ModelFamily> CreateLlamaFamily(const ModelSpec& spec);
std::unique_ptr<ModelFamily> CreateGemmaFamily(const ModelSpec& spec);
std::unique_ptr<ModelFamily> CreateGptNeoxFamily(const ModelSpec& spec);

std::unique_ptr<ModelFamily> CreateModelFamily(const ModelSpec& spec) {
  if (spec.family == Family::kGpt2) return CreateGpt2Family(spec);
  if (spec.family == Family::kGemma) return CreateGemmaFamily(spec);
  if (spec.family == Family::kGptNeox) return CreateGptNeoxFamily(spec);
  return CreateLlamaFamily(spec);  // llama, mistral, qwen2, qwen3, olmo2 (the run spec admits no other)
}

torch::Tensor PlainLookup(const torch::Tensor& table, const torch::Tensor& ids) { return torch::embedding(table, ids); }

ParamView::ParamView(std::vector<std::string> names, std::vector<torch::Tensor> tensors,
                     std::vector<SunkParameter> sunk, RowLookup rows)
    : names_(std::move(names)), tensors_(std::move(tensors)), sunk_(std::move(sunk)), rows_(std::move(rows)) {
  if (!sunk_.empty()) used_.resize(names_.size());
}

size_t ParamView::IndexOf(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  return names_.size();
}

const torch::Tensor& ParamView::Get(size_t i) const {
  if (!tensors_[i].defined()) {
    throw std::runtime_error("the parameter " + names_[i] +
                             " is a table whose rows are looked up where they are held (ZeRO-3's " +
                             "embedding call): read it through ParamView::Lookup");
  }
  if (sunk_.empty() || sunk_[i].sink == nullptr) return tensors_[i];
  if (!used_[i].defined()) used_[i] = sunk_[i].sink->Use(sunk_[i].param, tensors_[i]);
  return used_[i];
}

const torch::Tensor& ParamView::operator()(const std::string& name) const {
  const size_t i = IndexOf(name);
  if (i == names_.size())
    throw std::runtime_error("the model has no parameter " + name +
                             " here (a family and its parameter table disagree)");
  return Get(i);
}

torch::Tensor ParamView::Optional(const std::string& name) const {
  const size_t i = IndexOf(name);
  return i == names_.size() ? torch::Tensor() : Get(i);
}

torch::Tensor ParamView::Lookup(const std::string& name, const torch::Tensor& ids, const TableLookup& lookup) const {
  const size_t i = IndexOf(name);
  if (i < names_.size() && !tensors_[i].defined() && rows_) return rows_(name, ids);
  return lookup((*this)(name), ids);
}

void ParamView::AddFrozen(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                          const std::string& strip, const std::vector<std::shared_ptr<Nf4Weight>>& nf4) {
  if (!nf4.empty() && nf4_.empty()) nf4_.assign(names_.size(), nullptr);
  for (size_t i = 0; i < names.size(); ++i) {
    names_.push_back(names[i].substr(strip.size()));
    tensors_.push_back(tensors[i]);
    if (!sunk_.empty()) sunk_.push_back(SunkParameter{});
    if (!nf4_.empty()) nf4_.push_back(nf4.empty() ? nullptr : nf4[i].get());
  }
  if (!sunk_.empty()) used_.resize(names_.size());
}

torch::Tensor ParamView::Linear(const torch::Tensor& x, const std::string& weight, const std::string& bias,
                                const RowsAhead* ahead) const {
  torch::Tensor y = PlainLinear(x, weight, bias, ahead);
  if (lora_ == nullptr) return y;
  const std::string stem = weight.substr(0, weight.size() - std::string(".weight").size());
  const std::string a = stem + ".lora_A.weight", b = stem + ".lora_B.weight";
  if (IndexOf(a) == names_.size()) return y;  // not a targeted module
  // PEFT: lora_B(lora_A(dropout(x))) * scaling, added to the base layer's output.
  const torch::Tensor in =
      lora_->dropout > 0 && torch::GradMode::is_enabled() ? torch::dropout(x, lora_->dropout, /*train=*/true) : x;
  const torch::Tensor up = PlainLinear(PlainLinear(in, a, "", nullptr), b, "", nullptr);
  return y + up * lora_->scale;
}

torch::Tensor ParamView::PlainLinear(const torch::Tensor& x, const std::string& weight, const std::string& bias,
                                     const RowsAhead* ahead) const {
  const torch::Tensor b = bias.empty() ? torch::Tensor() : Optional(bias);
  if (!nf4_.empty()) {
    const size_t i = IndexOf(weight);
    if (i < names_.size() && nf4_[i] != nullptr) {
      if (ahead != nullptr) ahead->wait_rest();
      return Nf4Linear(x, *nf4_[i], b);
    }
  }
  const auto [w, sunk] = Sunk(weight);
  if (sunk != nullptr) return LinearIntoGradient(x, sunk->param, w, b, sunk->sink, sunk->defer, ahead);
  // (Autocast's linear casts as it goes, which the row blocks' out= matmuls would not: every row
  // waits.)
  if (ahead != nullptr) ahead->wait_rest();
  return torch::linear(x, w, b);
}

std::pair<torch::Tensor, const SunkParameter*> ParamView::Sunk(const std::string& weight) const {
  const size_t i = IndexOf(weight);
  if (i < names_.size() && !sunk_.empty() && sunk_[i].sink != nullptr && tensors_[i].dim() == 2)
    return {tensors_[i], &sunk_[i]};
  return {(*this)(weight), nullptr};
}

// Rotary frequencies (Su et al. 2021) as transformers: inv_freq_i = theta^(-2i/d) over the d
// rotary dimensions, then rope_scaling:
//   linear   inv_freq / factor
//   llama3   wavelength w = 2 pi / inv_freq; w > L / low_freq_factor: inv_freq / factor;
//            w < L / high_freq_factor: kept; between: (1 - s) inv_freq / factor + s inv_freq
//            with s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
//            L = original_max_positions.
ModelFamily::ModelFamily(const ModelSpec& spec) : spec_(spec) {
  if (!spec.rotary()) return;
  const int64_t d = spec.rotary_dims();
  inv_freq_ = 1.0 / torch::pow(spec.rope_theta,
                               torch::arange(0, d, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(d));
  const RopeScaling& rs = spec.rope_scaling;
  if (rs.type == RopeScalingType::kLinear) inv_freq_ = inv_freq_ / rs.factor;
  if (rs.type == RopeScalingType::kLlama3) {
    const double old_context = static_cast<double>(rs.original_max_positions);
    const double low_wavelen = old_context / rs.low_freq_factor, high_wavelen = old_context / rs.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq_;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq_ / rs.factor, inv_freq_);
    auto smooth = (old_context / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
    auto medium = (wavelen < high_wavelen).logical_not().logical_and((wavelen > low_wavelen).logical_not());
    inv_freq_ = torch::where(medium, smoothed, scaled);
  }
}

torch::Tensor ModelFamily::Embed(const ParamView& p, const torch::Tensor& tokens, const TensorParallel& tp) const {
  return p.Lookup(model::TokenEmbeddingName(spec_), tokens, tp.lookup);
}

ModelFamily::InitRule ModelFamily::InitialValues(const std::string& name) const {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const bool norm = name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos;
  if (ends_with("bias")) return {.drawn = false, .constant = 0.0};
  if (norm) return {.drawn = false, .constant = spec_.family == Family::kGemma ? 0.0 : 1.0};  // Gemma: (1 + w)
  return {.drawn = true, .std = 0.02};
}

std::pair<torch::Tensor, torch::Tensor> ModelFamily::RotaryHalf(const torch::Tensor& x, int64_t length) const {
  const int64_t t = length < 0 ? x.size(1) : length;
  const std::pair<std::string, int64_t> key{x.device().str(), t};
  MutexLock lock(rotary_mutex_);
  if (auto it = rotary_tables_.find(key); it != rotary_tables_.end()) return it->second;
  // A handful of lengths in practice (the run's sequence, an extraction's batches); a caller
  // cycling through many must not grow this without bound.
  if (rotary_tables_.size() >= 16) rotary_tables_.clear();
  torch::NoGradGuard no_grad;
  auto positions = torch::arange(t, torch::TensorOptions().dtype(torch::kFloat).device(x.device()));
  auto freqs = torch::outer(positions, inv_freq_.to(x.device()));
  std::pair<torch::Tensor, torch::Tensor> tables{freqs.cos().contiguous(), freqs.sin().contiguous()};
  rotary_tables_.emplace(key, tables);
  return tables;
}

std::pair<torch::Tensor, torch::Tensor> ModelFamily::Rotary(const torch::Tensor& x, int64_t length) const {
  auto [cos, sin] = RotaryHalf(x, length);  // each half of a head turns by the same angles
  return {torch::cat({cos, cos}, -1).to(x.scalar_type()), torch::cat({sin, sin}, -1).to(x.scalar_type())};
}

torch::Tensor ModelFamily::ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                                       const torch::Tensor& sin) const {
  const int64_t d = spec_.rotary_dims();
  auto rotate = [&](const torch::Tensor& r) {
    auto halves = r.chunk(2, -1);
    return r * cos + torch::cat({-halves[1], halves[0]}, -1) * sin;
  };
  if (d == x.size(-1)) return rotate(x);
  return torch::cat({rotate(x.narrow(-1, 0, d)), x.narrow(-1, d, x.size(-1) - d)}, -1);
}

torch::Tensor ModelFamily::Activation(const torch::Tensor& x) const {
  if (spec_.activation == strata::Activation::kSilu) return torch::silu(x);
  if (spec_.activation == strata::Activation::kGelu) return torch::gelu(x);
  return torch::gelu(x, "tanh");
}

torch::Tensor ModelFamily::AttentionPattern(const torch::Tensor& q, const torch::Tensor& k, int64_t window) const {
  const int64_t t = q.size(-2);
  auto i = torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(q.device())).unsqueeze(1);
  auto j = i.transpose(0, 1);
  auto allowed = j <= i;
  if (window > 0) allowed = allowed.logical_and(j > i - window);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type()).transpose(1, 2);  // [b, t, heads, t]
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps, bool gemma_style) {
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (gemma_style) return (normed * (1.0 + weight.to(torch::kFloat))).to(x.scalar_type());
  return weight * normed.to(x.scalar_type());
}

}  // namespace strata::worker
