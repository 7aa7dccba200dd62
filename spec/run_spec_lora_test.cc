// [lora]: what a user types, read into LoraSpec and refused naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "spec/run_spec.h"

namespace strata {
namespace {

class LoraSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-lora-spec-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/corpus.txt") << std::string(4096, 'a');
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A llama of hidden 64, 4 heads of 16, 2 kv heads (k/v are 32 wide), ffn 96.
  std::string Spec(const std::string& lora, const std::string& parallel = "") {
    return "name = \"t\"\n[model]\nfamily = \"llama\"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nffn = 96\n"
           "sequence = 32\n[data]\npath = \"corpus.txt\"\n[train]\nsteps = 5\nglobal_batch = 4\n" +
           (parallel.empty() ? "" : "[parallel]\n" + parallel) + lora;
  }
  Result<RunSpec> Parse(const std::string& text) { return ParseRunSpec(text, dir_, true); }
  void ExpectRejected(const std::string& text, const std::string& needle) {
    auto spec = Parse(text);
    ASSERT_FALSE(spec.ok()) << "accepted: " << text;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(needle), std::string::npos) << spec.status().message();
  }
  std::string dir_;
};

TEST_F(LoraSpecTest, AbsentTableLeavesLoraOff) {
  auto spec = Parse(Spec(""));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_FALSE(spec->lora.enabled);
  EXPECT_EQ(RunSpecToToml(*spec).find("[lora]"), std::string::npos);
}

TEST_F(LoraSpecTest, EmptyTableTakesPeftDefaults) {
  auto spec = Parse(Spec("[lora]\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->lora.enabled);
  EXPECT_EQ(spec->lora.rank, 8);
  EXPECT_DOUBLE_EQ(spec->lora.alpha, 8.0);
  EXPECT_DOUBLE_EQ(spec->lora.dropout, 0.0);
  EXPECT_EQ(spec->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_DOUBLE_EQ(spec->lora.scale(), 1.0);
}

TEST_F(LoraSpecTest, ModulesAreKeptInTheFamilysOrderAndTheTomlParsesBackEqual) {
  auto spec = Parse(Spec("[lora]\nrank = 4\nalpha = 16\ntarget_modules = [\"down_proj\", \"q_proj\", \"q_proj\"]\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->lora.target_modules, (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_DOUBLE_EQ(spec->lora.scale(), 4.0);
  EXPECT_EQ(spec->lora.base, LoraBase::kDense);
  auto again = ParseSubmittedRunSpec(RunSpecToToml(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(RunSpecToToml(*again), RunSpecToToml(*spec));
  EXPECT_EQ(again->lora.rank, 4);
  EXPECT_EQ(again->lora.target_modules, spec->lora.target_modules);
}

TEST_F(LoraSpecTest, AllLinearIsEveryLinearOfTheFamily) {
  auto spec = Parse(Spec("[lora]\ntarget_modules = \"all-linear\"\nuse_rslora = true\nrank = 4\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->lora.target_modules, LoraTargetModules(Family::kLlama));
  EXPECT_EQ(spec->lora.target_modules.size(), 7u);
  EXPECT_DOUBLE_EQ(spec->lora.scale(), 8.0 / 2.0);  // alpha / sqrt(rank)
  auto qlora = Parse(Spec("[lora]\nbase = \"nf4\"\n"));
  ASSERT_TRUE(qlora.ok()) << qlora.status().ToString();
  EXPECT_EQ(qlora->lora.base, LoraBase::kNf4);
  auto again = ParseSubmittedRunSpec(RunSpecToToml(*qlora));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->lora.base, LoraBase::kNf4);
}

TEST_F(LoraSpecTest, BadValuesNameTheField) {
  ExpectRejected(Spec("[lora]\nrank = 0\n"), "lora.rank = 0 must be >= 1");
  // k_proj and v_proj are kv_heads x head_dim = 32 wide.
  ExpectRejected(Spec("[lora]\nrank = 33\ntarget_modules = [\"k_proj\"]\n"),
                 "lora.rank = 33 is above the narrowest targeted matrix's width, 32");
  ExpectRejected(Spec("[lora]\ntarget_modules = [\"c_attn\"]\n"),
                 "lora.target_modules holds \"c_attn\", which llama has no linear named; its modules are q_proj, "
                 "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  ExpectRejected(Spec("[lora]\ntarget_modules = []\n"), "lora.target_modules is empty");
  ExpectRejected(Spec("[lora]\ntarget_modules = \"everything\"\n"), "lora.target_modules = \"everything\"");
  ExpectRejected(Spec("[lora]\nalpha = 0\n"), "lora.alpha = 0 must be > 0");
  ExpectRejected(Spec("[lora]\nalpha = nan\n"), "lora.alpha");
  ExpectRejected(Spec("[lora]\ndropout = 1.0\n"), "lora.dropout = 1");
  ExpectRejected(Spec("[lora]\nmodules_to_save = [\"lm_head\"]\n"), "lora.modules_to_save is not built yet");
  ExpectRejected(Spec("[lora]\nranks = 4\n"), "unknown key 'lora.ranks'");
  ExpectRejected(Spec("[lora]\nbase = \"int4\"\n"), "lora.base = \"int4\" is not supported; use \"dense\"");
  ExpectRejected(Spec("[lora]\nbase = \"fp4\"\n"), "fp4 is not built yet");
}

TEST_F(LoraSpecTest, MeshesNotBuiltYetAreRefusedNamingTheField) {
  ExpectRejected(Spec("[lora]\n", "tp = 2\n"), "parallel.tp = 2: LoRA under tensor parallelism is not built yet");
  ExpectRejected(Spec("[lora]\n", "dp = 2\nzero = 3\n"), "parallel.zero = 3: LoRA with sharded parameters");
  auto spec = Parse(Spec("[lora]\n", "dp = 2\nzero = 2\nrecompute = true\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
}

TEST_F(LoraSpecTest, OnlyTrainRunsTakeAdapters) {
  const std::string extract =
      "name = \"t\"\nkind = \"extract\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\nsequence = 32\n[data]\npath = "
      "\"corpus.txt\"\n[lora]\n";
  ExpectRejected(extract, "[lora] applies to train runs");
}

// model.adapter_from: a train run continues the adapter, [lora] implied and filled from its
// adapter_config.json; what the spec states must agree; other runs take it as it was saved.
class AdapterFromTest : public LoraSpecTest {
 protected:
  void WriteConfig(const std::string& json) {
    std::filesystem::create_directories(dir_ + "/adapter");
    std::ofstream(dir_ + "/adapter/adapter_config.json") << json;
  }
  static std::string Config(const std::string& extra = "") {
    return "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 32, \"lora_dropout\": 0.05, "
           "\"target_modules\": [\"v_proj\", \"q_proj\"], \"bias\": \"none\", \"modules_to_save\": null" +
           extra + "}";
  }
  std::string WithAdapter(const std::string& rest) {
    std::string text = Spec(rest);
    text.replace(text.find("[model]\n"), 8, "[model]\nadapter_from = \"adapter\"\n");
    return text;
  }
};

TEST_F(AdapterFromTest, ATrainRunTakesTheAdaptersSettingsAndTravelsWithThem) {
  WriteConfig(Config());
  auto spec = Parse(WithAdapter(""));  // no [lora] table
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model.adapter_from, dir_ + "/adapter");
  EXPECT_TRUE(spec->lora.enabled);
  EXPECT_EQ(spec->lora.rank, 16);
  EXPECT_DOUBLE_EQ(spec->lora.alpha, 32.0);
  EXPECT_DOUBLE_EQ(spec->lora.dropout, 0.05);
  EXPECT_EQ(spec->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));  // the family's order
  // The resolved spec (what submit sends) reads back equal without the adapter's files.
  std::filesystem::remove_all(dir_ + "/adapter");
  auto again = ParseSubmittedRunSpec(RunSpecToToml(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *spec);
}

TEST_F(AdapterFromTest, StatedFieldsMustBeTheAdaptersAndOthersAreFree) {
  WriteConfig(Config());
  ExpectRejected(WithAdapter("[lora]\nrank = 8\n"), "lora.rank = 8 but model.adapter_from");
  ExpectRejected(WithAdapter("[lora]\nrank = 8\n"), "r = 16 in adapter_config.json");
  ExpectRejected(WithAdapter("[lora]\nalpha = 16\n"), "lora_alpha = 32");
  ExpectRejected(WithAdapter("[lora]\ntarget_modules = \"all-linear\"\n"), "target_modules = [\"q_proj\", \"v_proj\"]");
  auto spec = Parse(WithAdapter("[lora]\nrank = 16\ndropout = 0.1\nbase = \"nf4\"\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_DOUBLE_EQ(spec->lora.dropout, 0.1);
  EXPECT_EQ(spec->lora.base, LoraBase::kNf4);
}

TEST_F(AdapterFromTest, AnAdapterStrataCannotRunIsRefusedNamingTheFileAndField) {
  ExpectRejected(WithAdapter(""), "model.adapter_from = \"" + dir_ + "/adapter\"");  // no directory
  WriteConfig("{\"peft_type\": \"IA3\", \"r\": 8}");
  ExpectRejected(WithAdapter(""), "peft_type = \"IA3\"");
  WriteConfig(Config(", \"use_dora\": true"));
  ExpectRejected(WithAdapter(""), "DoRA");
  WriteConfig("{\"peft_type\": \"LORA\", \"r\": 8, \"target_modules\": [\"c_attn\"]}");
  ExpectRejected(WithAdapter(""), "targets \"c_attn\", which llama has no linear named (its modules: q_proj");
  WriteConfig("{\"peft_type\": \"LORA\", \"r\": 40, \"target_modules\": [\"k_proj\"]}");  // k is 32 wide
  ExpectRejected(WithAdapter(""), "another base");
  WriteConfig("{\"peft_type\": \"LORA\", \"r\": 8, \"target_modules\": \".*proj\"}");
  ExpectRejected(WithAdapter(""), "a list of module names");
  WriteConfig("not json");
  ExpectRejected(WithAdapter(""), "is not a JSON object");
}

TEST_F(AdapterFromTest, AnExtractRunTakesTheAdapterWithoutTrainingIt) {
  WriteConfig(Config());
  const std::string extract =
      "name = \"t\"\nkind = \"extract\"\n[model]\nfamily = \"llama\"\nlayers = 2\nhidden = 64\nheads = 4\n"
      "kv_heads = 2\nffn = 96\nsequence = 32\nadapter_from = \"adapter\"\n[data]\npath = \"corpus.txt\"\n";
  auto spec = Parse(extract);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_FALSE(spec->lora.enabled);
  EXPECT_EQ(spec->model.adapter_from, dir_ + "/adapter");
}

TEST(LoraTargets, Gpt2sCProjIsBothProjections) {
  ModelSpec m;
  m.family = Family::kGpt2;
  m.hidden = 64;
  m.heads = 4;
  m.ffn = 256;
  m.kv_heads = 4;
  EXPECT_EQ(LoraNarrowestWidth(m, {"c_attn"}), 64);
  EXPECT_EQ(LoraNarrowestWidth(m, {"c_fc"}), 64);
}

}  // namespace
}  // namespace strata
