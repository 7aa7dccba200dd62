#include "worker/nn/hf_format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "storage/safetensors.h"
#include "worker/nn/causal_lm.h"

namespace strata::worker {
namespace {

class HfFormatTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-hf-XXXXXX";
    dir_ = mkdtemp(tmpl);
    spec_.family = ParseChoice<Family>(GetParam()).value();
    spec_.layers = 2;
    spec_.hidden = 64;
    spec_.heads = GetParam() == "gpt2" ? 4 : 8;
    spec_.vocab = 256;
    spec_.sequence = 32;
    if (GetParam() != "gpt2" && GetParam() != "gpt_neox") spec_.kv_heads = 2;
    spec_.ffn = GetParam() == "gpt2" ? 256 : 160;
    spec_.tie_embeddings = GetParam() == "gemma" || GetParam() == "qwen2";
    spec_.attention_bias = GetParam() == "gpt_neox";
    spec_.rotary_pct = GetParam() == "gpt_neox" ? 0.25 : 1.0;
    spec_.sliding_window = GetParam() == "mistral" ? 8 : 0;
    ASSERT_TRUE(ValidateModelSpec(spec_, "").ok());
  }
  std::string dir_;
  ModelSpec spec_;
};

TEST_P(HfFormatTest, ExportThenLoadReproducesTheModelExactly) {
  torch::manual_seed(11);
  auto original = CreateCausalLm(spec_, 11);
  ASSERT_TRUE(ExportHuggingFace(original->named_parameters(), spec_, dir_).ok());
  torch::manual_seed(99);
  auto loaded = CreateCausalLm(spec_, 99);  // different weights until loaded
  ASSERT_TRUE(LoadHuggingFace(dir_, spec_, loaded->named_parameters()).ok());
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {2, 32}, torch::kLong);
  EXPECT_TRUE(torch::equal(original->Logits(tokens), loaded->Logits(tokens)));
}

TEST_P(HfFormatTest, FileUsesHuggingFaceNamesShapesAndConfig) {
  torch::manual_seed(1);
  auto model = CreateCausalLm(spec_, 1);
  ASSERT_TRUE(ExportHuggingFace(model->named_parameters(), spec_, dir_).ok());
  auto file = storage::ReadSafetensors(dir_ + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ + "/config.json"));
  if (spec_.family == Family::kGpt2) {
    EXPECT_EQ(file->tensors.at("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{64, 192}));
    EXPECT_EQ(file->tensors.at("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{256, 64}));
    EXPECT_EQ(file->tensors.count("transformer.wte.weight"), 1u);
    EXPECT_EQ(config["n_embd"], 64);
    EXPECT_EQ(config["model_type"], "gpt2");
  } else if (spec_.family == Family::kLlama) {
    EXPECT_EQ(file->tensors.at("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{16, 64}));
    EXPECT_EQ(file->tensors.count("lm_head.weight"), 1u);
    EXPECT_EQ(config["num_key_value_heads"], 2);
    EXPECT_EQ(config["model_type"], "llama");
  }
}

TEST_P(HfFormatTest, MismatchedSpecNamesTheTensor) {
  torch::manual_seed(1);
  auto model = CreateCausalLm(spec_, 1);
  ASSERT_TRUE(ExportHuggingFace(model->named_parameters(), spec_, dir_).ok());
  ModelSpec wider = spec_;
  wider.ffn *= 2;
  auto other = CreateCausalLm(wider, 2);
  Status st = LoadHuggingFace(dir_, wider, other->named_parameters());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  const char* first_mlp = spec_.family == Family::kGpt2      ? "c_fc"
                          : spec_.family == Family::kGptNeox ? "dense_h_to_4h"
                                                             : "gate_proj";
  EXPECT_NE(st.message().find(first_mlp), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Families, HfFormatTest,
                         ::testing::Values("gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "gpt_neox"));

}  // namespace
}  // namespace strata::worker
