// The run spec's capture and patch sites: the [extract] and [patch] tables' parsers and what a
// capture's chunks hold (run_spec.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/token_file.h"  // the .npy header of patch.source
#include "spec/run_spec.h"
#include "spec/run_spec_reader.h"

namespace strata {
namespace run_spec_internal {

namespace fs = std::filesystem;

Status ParseExtract(Reader& r, RunSpec* spec) {
  ExtractSpec& e = spec->extract;
  const int64_t layers = spec->model.layers;
  STRATA_RETURN_IF_ERROR(r.IntList("extract", "layers", &e.layers));
  if (e.layers.empty()) {
    for (int64_t i = 0; i < layers; ++i) e.layers.push_back(i);
  }
  for (int64_t layer : e.layers) {
    if (layer < 0 || layer >= layers) {
      return InvalidArgument("run spec: extract.layers holds " + std::to_string(layer) +
                             ", out of range: model.layers = " + std::to_string(layers) + ", so layers are 0.." +
                             std::to_string(layers - 1));
    }
  }
  std::sort(e.layers.begin(), e.layers.end());
  e.layers.erase(std::unique(e.layers.begin(), e.layers.end()), e.layers.end());
  STRATA_RETURN_IF_ERROR(r.StringList("extract", "sites", &e.sites));
  STRATA_RETURN_IF_ERROR(r.Int("extract", "logits_top_k", &e.logits_top_k, 0, spec->model.vocab));
  std::string site_list;
  for (const auto& site : ExtractSites()) {
    if (site != "logits_ids" && site != "loss") site_list += (site_list.empty() ? "" : ", ") + site;
  }
  if (spec->is_patch()) {
    // What a patch run stores is fixed by [patch]; [extract] only chunks it.
    if (r.Has("extract", "sites") || r.Has("extract", "layers")) {
      return InvalidArgument(
          "run spec: a patch run stores each row's loss (and logits with patch.logits = true), so "
          "extract.layers and extract.sites do not apply; remove them (the [patch] table names what is replaced)");
    }
    e.sites = {"loss"};
    if (spec->patch.logits) e.sites.push_back("logits");
    e.layers = {layers - 1};
  }
  if (e.sites.empty()) return InvalidArgument("run spec: extract.sites is empty; name at least one of " + site_list);
  for (const auto& site : e.sites) {
    if (std::find(ExtractSites().begin(), ExtractSites().end(), site) == ExtractSites().end()) {
      return InvalidArgument("run spec: extract.sites holds unknown site \"" + site + "\"; sites are " + site_list +
                             " (docs/extract.md defines each)");
    }
    if (site == "loss" && !spec->is_patch()) {
      return InvalidArgument(
          "run spec: extract.sites holds \"loss\", which patch runs store (kind = \"patch\"); remove it");
    }
    if (site == "logits_ids") {
      return InvalidArgument(
          "run spec: extract.sites holds \"logits_ids\", which is stored beside \"logits\" when "
          "extract.logits_top_k > 0; name \"logits\" and set logits_top_k instead");
    }
  }
  const bool logits = std::find(e.sites.begin(), e.sites.end(), "logits") != e.sites.end();
  if (e.logits_top_k > 0 && !logits) {
    return InvalidArgument(
        "run spec: extract.logits_top_k = " + std::to_string(e.logits_top_k) +
        " applies to the logits site; add \"logits\" to extract.sites (or patch.logits = true), or remove it");
  }
  if (e.logits_top_k > 0) e.sites.push_back("logits_ids");
  // Storage order, not the user's order: one record layout whatever the spelling.
  std::vector<std::string> ordered;
  for (const auto& site : ExtractSites()) {
    if (std::find(e.sites.begin(), e.sites.end(), site) != e.sites.end()) ordered.push_back(site);
  }
  e.sites = ordered;
  // final_norm and logits are the model's, not a block's: stored once, as layer model.layers - 1
  // (whose output they are computed from), so that layer is captured too.
  if (std::any_of(e.sites.begin(), e.sites.end(), IsModelLevelSite) &&
      !std::binary_search(e.layers.begin(), e.layers.end(), layers - 1)) {
    e.layers.push_back(layers - 1);
  }
  if (std::find(e.sites.begin(), e.sites.end(), "attn_pattern") != e.sites.end() &&
      spec->model.sequence > spec_bounds::kAttnPatternSequence) {
    return InvalidArgument(
        "run spec: extract.sites holds attn_pattern, whose rows are [heads, sequence]; model.sequence = " +
        std::to_string(spec->model.sequence) + " is over the " + std::to_string(spec_bounds::kAttnPatternSequence) +
        " it is captured up to; capture it from a run with a shorter model.sequence");
  }
  STRATA_RETURN_IF_ERROR(r.Choice("extract", "dtype", &e.dtype));
  STRATA_RETURN_IF_ERROR(r.Choice("extract", "precision", &e.precision));
  STRATA_RETURN_IF_ERROR(r.Choice("extract", "mode", &e.mode));
  STRATA_RETURN_IF_ERROR(r.Int("extract", "batch", &e.batch, 1, spec_bounds::kExtractBatch));
  STRATA_RETURN_IF_ERROR(r.Int("extract", "tokens", &e.tokens, 0, spec_bounds::kExtractTokens));
  if (e.tokens > 0 && e.tokens < spec->model.sequence) {
    return InvalidArgument("run spec: extract.tokens = " + std::to_string(e.tokens) +
                           " is less than one sequence (model.sequence = " + std::to_string(spec->model.sequence) +
                           "); raise it or set 0 for the whole file");
  }
  // Sites that grow with sequence or vocab (attn_pattern, logits) can make one chunk larger than
  // a worker's host memory holds; the residual-width sites never come near (a 4096-wide fp32 row
  // is 16 KiB), so only those two are checked.
  RunSpec large = *spec;
  large.extract.sites.clear();
  for (const auto& site : e.sites) {
    if (site == "attn_pattern" || site == "logits" || site == "logits_ids") large.extract.sites.push_back(site);
  }
  const uint64_t chunk_bytes = ExtractChunkBytes(large);
  if (chunk_bytes > spec_bounds::kExtractChunkBytes) {
    std::string sites;
    for (const auto& site : large.extract.sites) sites += (sites.empty() ? "" : " + ") + site;
    return InvalidArgument("run spec: one chunk of " + std::to_string(e.batch) + " sequences would hold " +
                           std::to_string(chunk_bytes >> 20) + " MiB of " + sites + " (over " +
                           std::to_string(e.layers.size()) + " layer(s), " + std::to_string(spec->model.sequence) +
                           " tokens each), over the " + std::to_string(spec_bounds::kExtractChunkBytes >> 20) +
                           " MiB a chunk may hold in a worker's memory; lower extract.batch" +
                           (large.extract.sites.size() == 1 && large.extract.sites[0] == "attn_pattern"
                                ? ", capture fewer layers"
                                : ", set extract.logits_top_k") +
                           " or use a shorter model.sequence");
  }
  return Status::Ok();
}

Status ParsePatch(Reader& r, const std::string& base_dir, RunSpec* spec) {
  PatchSpec& p = spec->patch;
  const int64_t layers = spec->model.layers;
  STRATA_RETURN_IF_ERROR(r.IntList("patch", "layers", &p.layers));
  STRATA_RETURN_IF_ERROR(r.StringList("patch", "sites", &p.sites));
  std::optional<std::string> unknown_ablation;  // refused once the sites are checked
  STRATA_RETURN_IF_ERROR(r.Choice("patch", "ablation", &p.ablation, &unknown_ablation));
  STRATA_RETURN_IF_ERROR(r.String("patch", "source", &p.source));
  const bool alpha_given = r.Has("patch", "alpha");
  STRATA_RETURN_IF_ERROR(r.Float("patch", "alpha", &p.alpha, -spec_bounds::kSteerAlpha, spec_bounds::kSteerAlpha));
  STRATA_RETURN_IF_ERROR(r.Bool("patch", "logits", &p.logits));
  if (p.layers.empty()) {
    return InvalidArgument(
        "run spec: patch.layers is missing or empty; name the layers whose sites are replaced, e.g. layers = [3]");
  }
  for (int64_t layer : p.layers) {
    if (layer < 0 || layer >= layers) {
      return InvalidArgument("run spec: patch.layers holds " + std::to_string(layer) +
                             ", out of range: model.layers = " + std::to_string(layers) + ", so layers are 0.." +
                             std::to_string(layers - 1));
    }
  }
  std::sort(p.layers.begin(), p.layers.end());
  p.layers.erase(std::unique(p.layers.begin(), p.layers.end()), p.layers.end());
  std::string patchable;
  for (const auto& site : PatchableSites()) patchable += (patchable.empty() ? "" : ", ") + site;
  if (p.sites.empty())
    return InvalidArgument("run spec: patch.sites is missing or empty; name at least one of " + patchable);
  for (const auto& site : p.sites) {
    if (std::find(PatchableSites().begin(), PatchableSites().end(), site) == PatchableSites().end()) {
      return InvalidArgument("run spec: patch.sites holds \"" + site +
                             "\", which cannot be replaced; patchable sites are " + patchable);
    }
  }
  std::vector<std::string> ordered;
  for (const auto& site : PatchableSites()) {
    if (std::find(p.sites.begin(), p.sites.end(), site) != p.sites.end()) ordered.push_back(site);
  }
  p.sites = ordered;
  if (unknown_ablation == "capture") {
    return InvalidArgument(
        "run spec: patch.ablation = \"capture\" is not built yet; use \"zero\", or \"mean\" with "
        "patch.source = a .npy of the values");
  }
  if (unknown_ablation) {
    return InvalidArgument("run spec: patch.ablation = \"" + *unknown_ablation + "\" is not supported; use " +
                           ChoiceList<Ablation>());
  }
  if (p.ablation == Ablation::kZero && !p.source.empty()) {
    return InvalidArgument(
        "run spec: patch.source is the .npy of values for ablation = \"mean\" or \"steer\"; remove it for "
        "ablation = \"zero\"");
  }
  if (alpha_given && p.ablation != Ablation::kSteer) {
    return InvalidArgument(
        "run spec: patch.alpha scales the vector ablation = \"steer\" adds; remove it for ablation = \"" +
        std::string(Name(p.ablation)) + "\"");
  }
  if (p.ablation == Ablation::kMean || p.ablation == Ablation::kSteer) {
    // mean: one vector replaces the site at every row (the mean of a capture, e.g. numpy's
    // np.load(activations get's .npy).mean(0), saved as fp32); steer: alpha times it is added.
    const std::string ablation = "patch.ablation = \"" + std::string(Name(p.ablation)) + "\"";
    const std::string does = p.ablation == Ablation::kMean
                                 ? " replaces one site at one layer with the values in patch.source"
                                 : " adds patch.alpha x patch.source's vector to one site at one layer";
    if (p.sites.size() != 1 || p.layers.size() != 1) {
      return InvalidArgument("run spec: " + ablation + does +
                             "; name exactly one in patch.layers and patch.sites (they hold " +
                             std::to_string(p.layers.size()) + " and " + std::to_string(p.sites.size()) + ")");
    }
    const std::vector<int64_t> shape = ExtractSiteRowShape(*spec, p.sites[0]);
    std::string want;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    if (p.source.empty()) {
      return InvalidArgument(
          "run spec: " + ablation + " needs patch.source, an fp32 .npy of shape (" + want +
          (p.ablation == Ablation::kMean
               ? ") holding the value " + p.sites[0] + " takes at every row (e.g. a capture's mean over its rows)"
               : ") holding the direction added to " + p.sites[0] +
                     " at every row (e.g. a difference of two captures' means)"));
    }
    fs::path source(p.source);
    if (source.is_relative() && !base_dir.empty()) source = fs::path(base_dir) / source;
    p.source = source.lexically_normal().string();
  }
  return Status::Ok();
}

}  // namespace run_spec_internal

const std::vector<std::string>& ExtractSites() {
  // The first three keep the places they had before the others existed.
  static const std::vector<std::string> sites = {"resid_post", "attn_out", "mlp_out",    "resid_pre",    "resid_mid",
                                                 "q",          "k",        "v",          "attn_pattern", "mlp_hidden",
                                                 "final_norm", "logits",   "logits_ids", "loss"};
  return sites;
}

const std::vector<std::string>& PatchableSites() {
  static const std::vector<std::string> sites = {"resid_pre",  "attn_out", "resid_mid",
                                                 "mlp_hidden", "mlp_out",  "resid_post"};
  return sites;
}

bool IsModelLevelSite(const std::string& site) {
  return site == "final_norm" || site == "logits" || site == "logits_ids" || site == "loss";
}

std::vector<int64_t> ExtractSiteRowShape(const RunSpec& spec, const std::string& site) {
  const ModelSpec& m = spec.model;
  if (site == "q") return {m.heads, m.head_size()};
  if (site == "k" || site == "v") return {m.kv_heads > 0 ? m.kv_heads : m.heads, m.head_size()};
  if (site == "attn_pattern") return {m.heads, m.sequence};
  if (site == "mlp_hidden") return {m.ffn > 0 ? m.ffn : 4 * m.hidden};
  if (site == "logits" || site == "logits_ids")
    return {spec.extract.logits_top_k > 0 ? spec.extract.logits_top_k : m.vocab};
  if (site == "loss") return {1};
  return {m.hidden};  // resid_pre, resid_mid, resid_post, attn_out, mlp_out, final_norm
}

std::string ExtractSiteDType(const RunSpec& spec, const std::string& site) {
  return ExtractSiteHoldsIds(site) ? "i32" : std::string(Name(spec.extract.dtype));
}

uint64_t ExtractChunkBytes(const RunSpec& spec) {
  const uint64_t rows = static_cast<uint64_t>(spec.extract.batch) * static_cast<uint64_t>(spec.model.sequence);
  uint64_t bytes = 0;
  for (const auto& site : spec.extract.sites) {
    uint64_t row = ExtractSiteHoldsIds(site) || spec.extract.dtype == StoredDType::kFp32 ? 4 : 2;  // i32, fp32
    for (int64_t d : ExtractSiteRowShape(spec, site)) row *= static_cast<uint64_t>(d);
    bytes += rows * row * (IsModelLevelSite(site) ? 1 : spec.extract.layers.size());
  }
  return bytes;
}

int64_t ExtractSequences(const RunSpec& spec, int64_t data_tokens) {
  int64_t tokens = data_tokens;
  if (spec.extract.tokens > 0) tokens = std::min(tokens, spec.extract.tokens);
  return tokens / spec.model.sequence;
}

int64_t ExtractChunks(const RunSpec& spec, int64_t data_tokens) {
  const int64_t sequences = ExtractSequences(spec, data_tokens);
  return (sequences + spec.extract.batch - 1) / spec.extract.batch;
}

namespace run_spec_internal {

Status CheckPatchSource(const RunSpec& spec) {
  const PatchSpec& p = spec.patch;
  if (p.ablation != Ablation::kMean && p.ablation != Ablation::kSteer) return Status::Ok();
  const std::vector<int64_t> shape = ExtractSiteRowShape(spec, p.sites[0]);
  std::string want;
  for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
  const std::string what = "patch.source = \"" + p.source + "\"";
  std::ifstream in(p.source, std::ios::binary);
  if (!in) return InvalidArgument("run spec: " + what + " does not exist or cannot be read");
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  auto header = ParseNpyHeader(head, what);
  if (!header.ok()) return InvalidArgument("run spec: " + header.status().message());
  std::vector<int64_t> got(header->shape.begin(), header->shape.end());
  if (header->descr != "<f4" || header->fortran_order || got != shape) {
    std::string have;
    for (int64_t d : got) have += (have.empty() ? "" : ", ") + std::to_string(d);
    return InvalidArgument("run spec: " + what + " holds a " + header->descr + " array of shape (" + have + "); " +
                           p.sites[0] + " needs fp32 ('<f4', C order) of shape (" + want + ")");
  }
  return Status::Ok();
}

}  // namespace run_spec_internal

}  // namespace strata
