#include "worker/hf_format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "storage/safetensors.h"

namespace strata::worker {
namespace {

class HfFormatTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-hf-XXXXXX";
    dir_ = mkdtemp(tmpl);
    spec_ = GetParam() == "llama" ? ModelSpec{"llama", 2, 64, 8, 256, 32, 2, 160, 10000.0, 1e-6, ""}
                                  : ModelSpec{"gpt2", 2, 64, 4, 256, 32, 4, 256, 10000.0, 1e-5, ""};
  }
  std::string dir_;
  ModelSpec spec_;
};

TEST_P(HfFormatTest, ExportThenLoadReproducesTheModelExactly) {
  torch::manual_seed(11);
  auto original = CreateCausalLm(spec_);
  ASSERT_TRUE(ExportHuggingFace(*original, spec_, dir_).ok());
  torch::manual_seed(99);  // different weights until loaded
  auto loaded = CreateCausalLm(spec_);
  ASSERT_TRUE(LoadHuggingFace(dir_, spec_, *loaded).ok());
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {2, 32}, torch::kLong);
  EXPECT_TRUE(torch::equal(original->Logits(tokens), loaded->Logits(tokens)));
}

TEST_P(HfFormatTest, FileUsesHuggingFaceNamesShapesAndConfig) {
  torch::manual_seed(1);
  auto model = CreateCausalLm(spec_);
  ASSERT_TRUE(ExportHuggingFace(*model, spec_, dir_).ok());
  auto file = storage::ReadSafetensors(dir_ + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ + "/config.json"));
  if (spec_.family == "gpt2") {
    EXPECT_EQ(file->tensors.at("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{64, 192}));
    EXPECT_EQ(file->tensors.at("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{256, 64}));
    EXPECT_EQ(file->tensors.count("transformer.wte.weight"), 1u);
    EXPECT_EQ(config["n_embd"], 64);
    EXPECT_EQ(config["model_type"], "gpt2");
  } else {
    EXPECT_EQ(file->tensors.at("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{16, 64}));
    EXPECT_EQ(file->tensors.count("lm_head.weight"), 1u);
    EXPECT_EQ(config["num_key_value_heads"], 2);
    EXPECT_EQ(config["model_type"], "llama");
  }
}

TEST_P(HfFormatTest, MismatchedSpecNamesTheTensor) {
  torch::manual_seed(1);
  auto model = CreateCausalLm(spec_);
  ASSERT_TRUE(ExportHuggingFace(*model, spec_, dir_).ok());
  ModelSpec wider = spec_;
  wider.ffn *= 2;
  auto other = CreateCausalLm(wider);
  Status st = LoadHuggingFace(dir_, wider, *other);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(spec_.family == "gpt2" ? "c_fc" : "gate_proj"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Families, HfFormatTest, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace strata::worker
