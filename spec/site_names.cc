#include "spec/site_names.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <utility>

#include "spec/run_spec.h"

namespace strata {
namespace {

// TransformerLens' hook (after "blocks.L.") -> Strata's site.
constexpr std::array<std::pair<const char*, const char*>, 10> kBlockHooks = {{
    {"hook_resid_pre", "resid_pre"},
    {"hook_resid_mid", "resid_mid"},
    {"hook_resid_post", "resid_post"},
    {"hook_attn_out", "attn_out"},
    {"hook_mlp_out", "mlp_out"},
    {"attn.hook_rot_q", "q"},
    {"attn.hook_rot_k", "k"},
    {"attn.hook_v", "v"},
    {"attn.hook_pattern", "attn_pattern"},
    {"mlp.hook_post", "mlp_hidden"},
}};

}  // namespace

Result<NamedSite> ParseSiteName(const std::string& name, int64_t model_layers) {
  const auto& sites = ExtractSites();
  if (std::find(sites.begin(), sites.end(), name) != sites.end()) return NamedSite{-1, name};
  if (name == "ln_final.hook_normalized") return NamedSite{model_layers > 0 ? model_layers - 1 : -1, "final_norm"};
  auto unknown = [&](const std::string& why) {
    return InvalidArgument("site \"" + name + "\" " + why +
                           "; name a Strata site (resid_pre, resid_mid, resid_post, attn_out, mlp_out, q, k, v, "
                           "attn_pattern, mlp_hidden, final_norm, logits, logits_ids) or a TransformerLens hook "
                           "such as blocks.6.hook_resid_post (docs/extract.md)");
  };
  const std::string prefix = "blocks.";
  if (name.rfind(prefix, 0) != 0) return unknown("is not a capture site");
  const size_t dot = name.find('.', prefix.size());
  int64_t layer = -1;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + (dot == std::string::npos ? name.size() : dot);
  const auto parsed = std::from_chars(first, last, layer);
  if (dot == std::string::npos || parsed.ec != std::errc() || parsed.ptr != last || layer < 0)
    return unknown("has no layer number after \"blocks.\"");
  if (model_layers > 0 && layer >= model_layers)
    return InvalidArgument("site \"" + name + "\": layer " + std::to_string(layer) + " is past the model's " +
                           std::to_string(model_layers) + " layers (0.." + std::to_string(model_layers - 1) + ")");
  const std::string hook = name.substr(dot + 1);
  for (const auto& [tl, site] : kBlockHooks)
    if (hook == tl) return NamedSite{layer, site};
  if (hook == "attn.hook_q" || hook == "attn.hook_k") {
    const std::string rot = hook == "attn.hook_q" ? "hook_rot_q" : "hook_rot_k";
    const std::string plain = hook == "attn.hook_q" ? "q" : "k";
    return InvalidArgument("site \"" + name + "\": TransformerLens' " + hook.substr(5) +
                           " is before rotary embeddings, which Strata does not capture; name blocks." +
                           std::to_string(layer) + ".attn." + rot + " (after rotary), or site " + plain +
                           " on GPT-2, which has no rotary");
  }
  return unknown("is not a TransformerLens hook Strata captures");
}

}  // namespace strata
