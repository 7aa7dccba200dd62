// TransformerLens' hook names for Strata's capture sites, so a site can be named as a
// TransformerLens user names it: "blocks.6.hook_resid_post" is layer 6's resid_post. The table
// (docs/extract.md, "TransformerLens' names"):
//   blocks.L.hook_resid_pre     resid_pre        blocks.L.attn.hook_rot_q   q (after rotary)
//   blocks.L.hook_resid_mid     resid_mid        blocks.L.attn.hook_rot_k   k (after rotary)
//   blocks.L.hook_resid_post    resid_post       blocks.L.attn.hook_v       v
//   blocks.L.hook_attn_out      attn_out         blocks.L.attn.hook_pattern attn_pattern
//   blocks.L.hook_mlp_out       mlp_out          blocks.L.mlp.hook_post     mlp_hidden
//   ln_final.hook_normalized    final_norm (the model's last layer)
// TransformerLens' hook_q and hook_k are q and k before rotary on rotary families (and after it
// nowhere), which Strata does not capture: they are refused, naming hook_rot_q / hook_rot_k and,
// for GPT-2 (no rotary, where they are the same), the plain site.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

struct NamedSite {
  int64_t layer = -1;  // the layer the name gives; -1: none (a Strata site name)
  std::string site;    // Strata's site (ExtractSites())
};

// A Strata site name as it is, or a TransformerLens hook name resolved to (layer, site).
// `model_layers` (> 0 when known) resolves ln_final to the last layer and bounds L.
// InvalidArgument naming the name and what to write instead.
Result<NamedSite> ParseSiteName(const std::string& name, int64_t model_layers = 0);

}  // namespace strata
