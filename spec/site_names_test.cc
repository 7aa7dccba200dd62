// TransformerLens' hook names resolve to Strata's (layer, site) by the table in site_names.h, and
// the names Strata cannot serve are refused saying what to write instead.
#include "spec/site_names.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(SiteNamesTest, TransformerLensHooksNameTheLayerAndSite) {
  struct Case {
    const char* name;
    int64_t layer;
    const char* site;
  };
  for (const Case& c :
       {Case{"blocks.6.hook_resid_post", 6, "resid_post"}, Case{"blocks.0.hook_resid_pre", 0, "resid_pre"},
        Case{"blocks.11.hook_resid_mid", 11, "resid_mid"}, Case{"blocks.3.hook_attn_out", 3, "attn_out"},
        Case{"blocks.3.hook_mlp_out", 3, "mlp_out"}, Case{"blocks.2.attn.hook_rot_q", 2, "q"},
        Case{"blocks.2.attn.hook_rot_k", 2, "k"}, Case{"blocks.2.attn.hook_v", 2, "v"},
        Case{"blocks.5.attn.hook_pattern", 5, "attn_pattern"}, Case{"blocks.5.mlp.hook_post", 5, "mlp_hidden"},
        Case{"ln_final.hook_normalized", 11, "final_norm"}, Case{"resid_post", -1, "resid_post"},
        Case{"logits_ids", -1, "logits_ids"}}) {
    auto got = ParseSiteName(c.name, 12);
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status().ToString();
    EXPECT_EQ(got->layer, c.layer) << c.name;
    EXPECT_EQ(got->site, c.site) << c.name;
  }
}

TEST(SiteNamesTest, WhatStrataDoesNotCaptureIsRefusedWithWhatToWrite) {
  auto pre_rotary = ParseSiteName("blocks.4.attn.hook_q", 12);
  ASSERT_FALSE(pre_rotary.ok());
  EXPECT_NE(pre_rotary.status().message().find("blocks.4.attn.hook_rot_q"), std::string::npos)
      << pre_rotary.status().message();
  EXPECT_NE(pre_rotary.status().message().find("GPT-2"), std::string::npos);
  for (const char* bad : {"blocks.x.hook_resid_post", "blocks.-1.hook_resid_post", "blocks.6", "hook_resid_post",
                          "blocks.6.hook_resid_posts", "blocks.6.attn.hook_z", "residpost"}) {
    auto got = ParseSiteName(bad, 12);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_NE(got.status().message().find(std::string("\"") + bad + "\""), std::string::npos) << got.status().message();
  }
  auto past = ParseSiteName("blocks.12.hook_resid_post", 12);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("past the model's 12 layers"), std::string::npos) << past.status().message();
}

}  // namespace
}  // namespace strata
