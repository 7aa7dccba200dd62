#include "common/run_spec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

namespace strata {
namespace {

class RunSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-spec-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/corpus.txt") << std::string(4096, 'a');
  }
  std::string Valid(const std::string& extra_model = "", const std::string& extra_train = "") {
    return "name = \"t\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\nsequence = 32\n" + extra_model +
           "[data]\npath = \"corpus.txt\"\n[train]\nsteps = 5\nglobal_batch = 4\n" + extra_train;
  }
  std::string With(const std::string& from, const std::string& to) {
    std::string text = Valid();
    text.replace(text.find(from), from.size(), to);
    return text;
  }
  // Expects rejection with a message that contains `needle`.
  void ExpectRejected(const std::string& text, const std::string& needle) {
    auto spec = ParseRunSpec(text, dir_, true);
    ASSERT_FALSE(spec.ok()) << "accepted: " << text;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(needle), std::string::npos) << spec.status().message();
  }
  std::string dir_;
};

TEST_F(RunSpecTest, ValidSpecResolvesDataPathAndKeepsValues) {
  auto spec = ParseRunSpec(Valid(), dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.path, dir_ + "/corpus.txt");
  EXPECT_EQ(spec->model.hidden, 64);
  EXPECT_EQ(spec->train.global_batch, 4);
  EXPECT_EQ(spec->parallel.dp, 1);
}

TEST_F(RunSpecTest, CanonicalTomlParsesBackEqual) {
  auto spec = ParseRunSpec(Valid("", "lr = 0.003\ncheckpoint_every = 2\n"), dir_, true);
  ASSERT_TRUE(spec.ok());
  auto again = ParseRunSpec(RunSpecToToml(*spec), "", true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(RunSpecToToml(*again), RunSpecToToml(*spec));
  EXPECT_DOUBLE_EQ(again->train.lr, 0.003);
  EXPECT_EQ(again->train.checkpoint_every, 2);
}

TEST_F(RunSpecTest, MalformedTomlNamesTheLine) { ExpectRejected("name = \n[model", "line 1"); }
TEST_F(RunSpecTest, UnknownKeyIsNamed) { ExpectRejected(Valid("hiden = 3\n"), "model.hiden"); }
TEST_F(RunSpecTest, UnknownTableIsNamed) { ExpectRejected(Valid() + "[optimizer]\nx = 1\n", "'optimizer'"); }
TEST_F(RunSpecTest, ZeroLayersIsRejected) { ExpectRejected(With("layers = 2", "layers = 0"), "model.layers"); }
TEST_F(RunSpecTest, NegativeBatchIsRejected) { ExpectRejected(With("global_batch = 4", "global_batch = -4"), "train.global_batch"); }
TEST_F(RunSpecTest, HeadsMustDivideHidden) { ExpectRejected(With("heads = 4", "heads = 5"), "hidden % heads"); }
TEST_F(RunSpecTest, WrongTypeIsNamed) { ExpectRejected(With("layers = 2", "layers = \"two\""), "model.layers must be an integer"); }
TEST_F(RunSpecTest, MissingDataFileIsNamed) {
  std::remove((dir_ + "/corpus.txt").c_str());
  ExpectRejected(Valid(), "data.path");
}
TEST_F(RunSpecTest, LlamaDefaultsAndGroupedQueryAttention) {
  auto spec = ParseRunSpec(With("layers = 2", "family = \"llama\"\nlayers = 2\nkv_heads = 2"), dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model.kv_heads, 2);
  EXPECT_EQ(spec->model.ffn, 256);
  EXPECT_DOUBLE_EQ(spec->model.norm_eps, 1e-6);
  auto gpt2 = ParseRunSpec(Valid(), dir_, true);
  EXPECT_EQ(gpt2->model.kv_heads, 4);
  EXPECT_DOUBLE_EQ(gpt2->model.norm_eps, 1e-5);
}
TEST_F(RunSpecTest, KvHeadsMustDivideHeads) {
  ExpectRejected(With("layers = 2", "family = \"llama\"\nlayers = 2\nkv_heads = 3"), "model.kv_heads");
}
TEST_F(RunSpecTest, UnknownFamilyIsNamed) { ExpectRejected(With("layers = 2", "family = \"mamba\"\nlayers = 2"), "model.family"); }
TEST_F(RunSpecTest, MicroBatchMustDivideTheRankBatch) {
  ExpectRejected(Valid() + "[parallel]\ndp = 2\nmicro_batch = 3\n", "parallel.micro_batch");
}
TEST_F(RunSpecTest, InitFromMustHoldSafetensors) {
  ExpectRejected(With("layers = 2", "layers = 2\ninit_from = \"no-such-dir\""), "model.init_from");
}
TEST_F(RunSpecTest, ZeroStageFourDoesNotExist) { ExpectRejected(Valid() + "[parallel]\nzero = 4\n", "parallel.zero"); }
TEST_F(RunSpecTest, MeshIsCheckedAgainstTheModel) {
  // Valid(): 2 layers, 4 heads, ffn 4 x hidden.
  ExpectRejected(Valid() + "[parallel]\npp = 3\n", "parallel.pp = 3 exceeds model.layers = 2");
  ExpectRejected(Valid() + "[parallel]\ntp = 3\n", "parallel.tp = 3 does not divide model.heads");
  ExpectRejected(Valid() + "[parallel]\nrecompute = 1\n", "parallel.recompute must be true or false");
  auto spec = ParseRunSpec(Valid() + "[parallel]\ndp = 2\npp = 2\ntp = 2\nzero = 3\nrecompute = true\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->parallel.workers(), 8);
  auto again = ParseRunSpec(RunSpecToToml(*spec), dir_, true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->parallel.recompute);
  EXPECT_EQ(again->parallel.tp, 2);
}
TEST_F(RunSpecTest, StagesAreOneLayerCountPerStageAddingUpToTheModel) {
  // Valid(): 2 layers.
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [2]\n", "parallel.stages = [2] has 1 stages but parallel.pp is 2");
  ExpectRejected(Valid() + "[parallel]\nstages = [1, 1]\n", "parallel.stages = [1, 1] has 2 stages but parallel.pp is \"auto\"");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [2, 0]\n", "gives a stage no layers");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [2, 1]\n", "covers 3 layers but model.layers = 2");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = \"even\"\n", "parallel.stages must be a list of integers or \"auto\"");
  auto spec = ParseRunSpec(Valid() + "[parallel]\npp = 2\nstages = [1, 1]\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto again = ParseRunSpec(RunSpecToToml(*spec), dir_, true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->parallel.stages, (std::vector<int64_t>{1, 1}));
  auto absent = ParseRunSpec(Valid() + "[parallel]\npp = 2\n", dir_, true);
  ASSERT_TRUE(absent.ok());
  EXPECT_TRUE(absent->parallel.stages.empty());
  EXPECT_EQ(RunSpecToToml(*absent).find("stages"), std::string::npos);
}
TEST_F(RunSpecTest, UnknownPrecisionIsNamed) { ExpectRejected(Valid("", "precision = \"fp8\"\n"), "train.precision"); }

TEST(LearningRateTest, WarmupThenCosineToMinLr) {
  TrainSpec t;
  t.steps = 110;
  t.lr = 1.0;
  t.min_lr = 0.1;
  t.warmup_steps = 10;
  t.lr_schedule = "cosine";
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 1.0);
  EXPECT_NEAR(LearningRate(t, 60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(LearningRate(t, 110), 0.1, 1e-12);
  t.lr_schedule = "constant";
  EXPECT_DOUBLE_EQ(LearningRate(t, 100), 1.0);
}
TEST_F(RunSpecTest, BatchMustDivideByDp) {
  ExpectRejected(Valid() + "[parallel]\ndp = 3\n", "parallel.dp");
}

// ---- extract runs

TEST_F(RunSpecTest, ExtractDefaultsToEveryLayerAndTheResidualStream) {
  auto spec = ParseRunSpec("kind = \"extract\"\n" + Valid() + "[extract]\nbatch = 3\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->is_extract());
  EXPECT_EQ(spec->extract.layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(spec->extract.sites, (std::vector<std::string>{"resid_post"}));
  // 4096 tokens / 32 per sequence = 128 sequences; chunks of 3 -> 43 (the last holds 2).
  EXPECT_EQ(ExtractSequences(*spec, 4096), 128);
  EXPECT_EQ(ExtractChunks(*spec, 4096), 43);
  auto back = ParseRunSpec(RunSpecToToml(*spec), "", true);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->extract.layers, spec->extract.layers);
  EXPECT_EQ(back->extract.batch, 3);
}

TEST_F(RunSpecTest, ExtractSitesAreStoredInCanonicalOrderAndTokensCap) {
  auto spec = ParseRunSpec("kind = \"extract\"\n" + Valid() +
                               "[extract]\nlayers = [1, 0, 1]\nsites = [\"mlp_out\", \"resid_post\"]\ntokens = 100\n",
                           dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->extract.layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(spec->extract.sites, (std::vector<std::string>{"resid_post", "mlp_out"}));
  EXPECT_EQ(ExtractSequences(*spec, 4096), 3);  // 100 tokens -> 3 whole sequences of 32
}

TEST_F(RunSpecTest, ExtractBadInputNamesTheKey) {
  const std::string head = "kind = \"extract\"\n" + Valid();
  ExpectRejected(head + "[extract]\nlayers = [2]\n", "extract.layers holds 2");
  ExpectRejected(head + "[extract]\nsites = [\"logits\"]\n", "unknown site \"logits\"");
  ExpectRejected(head + "[extract]\ndtype = \"int8\"\n", "extract.dtype");
  ExpectRejected(head + "[extract]\nbatch = 0\n", "extract.batch");
  ExpectRejected(head + "[extract]\ntokens = 5\n", "extract.tokens");
  ExpectRejected(head + "[extract]\nsizes = 1\n", "extract.sizes");
  ExpectRejected(Valid() + "[extract]\nbatch = 2\n", "needs kind = \"extract\"");
  ExpectRejected("kind = \"finetune\"\n" + Valid(), "kind = \"finetune\"");
}

// [parallel] fields the spec leaves out, or sets to "auto", are the planner's; the canonical TOML
// keeps them "auto" until the coordinator fills them.
TEST_F(RunSpecTest, AbsentAndAutoParallelFieldsAreLeftToThePlanner) {
  auto spec = ParseRunSpec(Valid() + "[parallel]\ndp = 2\nzero = \"auto\"\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->parallel.dp, 2);
  EXPECT_EQ(spec->parallel.automatic, (std::set<std::string>{"pp", "tp", "micro_batch", "zero", "recompute"}));
  EXPECT_FALSE(spec->parallel.planned());
  auto again = ParseRunSpec(RunSpecToToml(*spec), "", true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->parallel.automatic, spec->parallel.automatic);
  auto fixed = ParseRunSpec(Valid() + "[parallel]\ndp = 1\npp = 1\ntp = 1\nmicro_batch = 0\nzero = 0\nrecompute = false\n", dir_, true);
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->parallel.planned());
}

TEST_F(RunSpecTest, AutoIsTheOnlyWordAParallelFieldTakes) {
  ExpectRejected(Valid() + "[parallel]\ndp = \"max\"\n", "parallel.dp must be an integer or \"auto\"");
  ExpectRejected(Valid() + "[parallel]\nrecompute = \"yes\"\n", "parallel.recompute must be true, false or \"auto\"");
}

}  // namespace
}  // namespace strata
