#include "spec/run_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "spec/toml_text.h"

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
TEST_F(RunSpecTest, NegativeBatchIsRejected) {
  ExpectRejected(With("global_batch = 4", "global_batch = -4"), "train.global_batch");
}
TEST_F(RunSpecTest, HeadsMustDivideHidden) { ExpectRejected(With("heads = 4", "heads = 5"), "hidden % heads"); }
TEST_F(RunSpecTest, WrongTypeIsNamed) {
  ExpectRejected(With("layers = 2", "layers = \"two\""), "model.layers must be an integer");
}
TEST_F(RunSpecTest, MissingDataFileIsNamed) {
  std::remove((dir_ + "/corpus.txt").c_str());
  ExpectRejected(Valid(), "data.path");
}

// [data] (docs/run-spec.md): every format's file is checked at submit for its size, its header
// and sequence + 1 tokens; the documents keys go together and only with train runs.
TEST_F(RunSpecTest, DataFormatsAreCheckedAgainstTheirFiles) {
  auto data = [&](const std::string& body) { return With("[data]\npath = \"corpus.txt\"\n", "[data]\n" + body); };
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  };
  write("ids.u32", std::string(4 * 33, '\0'));  // 33 ids: sequence 32 + 1
  write("ids.u16", std::string(2 * 33, '\0'));
  write("short.u32", std::string(4 * 32, '\0'));
  write("odd.u32", std::string(4 * 40 + 2, '\0'));
  std::string dict = "{'descr': '<u4', 'fortran_order': False, 'shape': (33,), }";
  dict.append(128 - 10 - dict.size() - 1, ' ');  // np.save pads the header to a multiple of 64 bytes
  write("ids.npy", std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(dict.size() + 1) + '\0' + dict + "\n" +
                       std::string(4 * 33, '\0'));
  std::string fortran = dict;
  fortran.replace(fortran.find("False"), 5, "True ");
  write("fortran.npy", std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(dict.size() + 1) + '\0' + fortran +
                           "\n" + std::string(4 * 33, '\0'));
  for (const char* ok : {"path = \"ids.u32\"\nformat = \"u32\"\n", "path = \"ids.u16\"\nformat = \"u16\"\n",
                         "path = \"ids.npy\"\nformat = \"npy\"\n"}) {
    auto spec = ParseRunSpec(data(ok), dir_, true);
    EXPECT_TRUE(spec.ok()) << ok << spec.status().ToString();
  }
  ExpectRejected(data("path = \"ids.u32\"\nformat = \"u64\"\n"),
                 "data.format = \"u64\" is not supported; use \"bytes\", \"u16\", \"u32\" or \"npy\"");
  ExpectRejected(data("path = \"short.u32\"\nformat = \"u32\"\n"),
                 "holds 32 tokens, fewer than model.sequence + 1 = 33");
  ExpectRejected(data("path = \"odd.u32\"\nformat = \"u32\"\n"), "odd.u32\" holds 162 bytes, not a multiple of 4");
  ExpectRejected(data("path = \"ids.u16\"\nformat = \"npy\"\n"), "ids.u16\" is not a valid .npy file");
  ExpectRejected(data("path = \"fortran.npy\"\nformat = \"npy\"\n"),
                 "fortran.npy\": .npy header field 'fortran_order' is True");
  // Without check_files (strata plan) the format name is still checked, the file is not.
  EXPECT_TRUE(ParseRunSpec(data("path = \"gone.u32\"\nformat = \"u32\"\n"), dir_, false).ok());
  EXPECT_FALSE(ParseRunSpec(data("path = \"gone.u32\"\nformat = \"u8\"\n"), dir_, false).ok());
}

TEST_F(RunSpecTest, DocumentsGoWithSampleWithinDocumentsOnTrainRuns) {
  auto data = [&](const std::string& body) {
    return With("[data]\npath = \"corpus.txt\"\n", "[data]\npath = \"corpus.txt\"\n" + body);
  };
  std::ofstream(dir_ + "/docs.idx", std::ios::binary) << std::string(16, '\0');
  std::ofstream(dir_ + "/odd.idx", std::ios::binary) << std::string(12, '\0');
  auto spec = ParseRunSpec(data("documents = \"docs.idx\"\nsample_within_documents = true\n"), dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.documents, dir_ + "/docs.idx");
  EXPECT_TRUE(spec->data.sample_within_documents);
  auto again = ParseRunSpec(RunSpecToToml(*spec), "", true);  // the canonical form keeps both, absolute
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->data.documents, dir_ + "/docs.idx");
  EXPECT_TRUE(again->data.sample_within_documents);
  EXPECT_EQ(RunSpecToToml(*again), RunSpecToToml(*spec));
  auto plain = ParseRunSpec(Valid(), dir_, true);
  EXPECT_EQ(RunSpecToToml(*plain).find("documents"), std::string::npos);  // default: unchanged
  ExpectRejected(data("sample_within_documents = true\n"), "data.sample_within_documents = true needs data.documents");
  ExpectRejected(data("documents = \"docs.idx\"\n"),
                 "data.documents is read only with data.sample_within_documents = true");
  ExpectRejected(data("documents = \"gone.idx\"\nsample_within_documents = true\n"),
                 "data.documents = \"" + dir_ + "/gone.idx\" does not exist");
  ExpectRejected(data("documents = \"odd.idx\"\nsample_within_documents = true\n"),
                 "odd.idx\" holds 12 bytes, not a multiple of 8");
  ExpectRejected(data("sample_within_documents = 1\n"), "data.sample_within_documents must be true or false");
  ExpectRejected("kind = \"extract\"\n" + data("documents = \"docs.idx\"\nsample_within_documents = true\n"),
                 "data.sample_within_documents applies to train runs");
  // An extract run reads data.documents alone: it numbers the rows' documents (their tokens record).
  auto extract = ParseRunSpec("kind = \"extract\"\n" + data("documents = \"docs.idx\"\n"), dir_, true);
  ASSERT_TRUE(extract.ok()) << extract.status().ToString();
  EXPECT_EQ(extract->data.documents, dir_ + "/docs.idx");
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
TEST_F(RunSpecTest, UnknownFamilyIsNamed) {
  ExpectRejected(With("layers = 2", "family = \"mamba\"\nlayers = 2"), "model.family");
}
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
  ExpectRejected(Valid("", "cuda_graphs = \"on\"\n"), "train.cuda_graphs must be true or false");
  auto graphs_off = ParseRunSpec(Valid("", "cuda_graphs = false\n"), dir_, true);
  ASSERT_TRUE(graphs_off.ok()) << graphs_off.status().ToString();
  EXPECT_FALSE(graphs_off->train.cuda_graphs);
  auto graphs_again = ParseRunSpec(RunSpecToToml(*graphs_off), dir_, true);
  ASSERT_TRUE(graphs_again.ok()) << graphs_again.status().ToString();
  EXPECT_FALSE(graphs_again->train.cuda_graphs);
  ExpectRejected(Valid("", "optimizer = \"sgd\"\n"),
                 "train.optimizer = \"sgd\" is not supported; use \"adamw\" or \"adamw8bit\"");
  auto eight_bit = ParseRunSpec(Valid("", "optimizer = \"adamw8bit\"\n"), dir_, true);
  ASSERT_TRUE(eight_bit.ok()) << eight_bit.status().ToString();
  auto eight_bit_again = ParseRunSpec(RunSpecToToml(*eight_bit), dir_, true);
  ASSERT_TRUE(eight_bit_again.ok()) << eight_bit_again.status().ToString();
  EXPECT_EQ(eight_bit_again->train.optimizer, Optimizer::kAdamW8bit);
  auto spec = ParseRunSpec(Valid() + "[parallel]\ndp = 2\npp = 2\ntp = 2\nzero = 3\nrecompute = true\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->parallel.workers(), 8);
  auto again = ParseRunSpec(RunSpecToToml(*spec), dir_, true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->parallel.recompute);
  EXPECT_EQ(again->parallel.tp, 2);
}
// parallel.sequence_parallel and parallel.tp_comm_overlap: on unless set false; kept through a
// stored spec; a non-boolean is named.
TEST_F(RunSpecTest, TensorParallelSwitchesAreOnByDefaultAndRoundTrip) {
  const std::vector<std::pair<std::string, bool ParallelSpec::*>> switches = {
      {"sequence_parallel", &ParallelSpec::sequence_parallel}, {"tp_comm_overlap", &ParallelSpec::tp_comm_overlap}};
  for (const auto& [name, field] : switches) {
    ExpectRejected(Valid() + "[parallel]\n" + name + " = \"yes\"\n", "parallel." + name + " must be true or false");
    auto on = ParseRunSpec(Valid() + "[parallel]\ntp = 2\n", dir_, true);
    ASSERT_TRUE(on.ok()) << on.status().ToString();
    EXPECT_TRUE(on->parallel.*field) << name;
    auto off = ParseRunSpec(Valid() + "[parallel]\ntp = 2\n" + name + " = false\n", dir_, true);
    ASSERT_TRUE(off.ok()) << off.status().ToString();
    EXPECT_FALSE(off->parallel.*field) << name;
    auto again = ParseRunSpec(RunSpecToToml(*off), dir_, true);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_FALSE(again->parallel.*field) << name;
  }
}
TEST_F(RunSpecTest, OffloadIsNoneOptimizerOrOptimizerAndParamsAndRoundTrips) {
  ExpectRejected(Valid() + "[parallel]\noffload = \"disk\"\n",
                 "parallel.offload = \"disk\" is not supported; use \"auto\" (the default: only when nothing fits "
                 "without it), \"none\", "
                 "\"optimizer\" (optimizer state in host memory) or \"optimizer+params\"");
  // Parameters stream as ZeRO-3 gathers them, without recompute: a fixed field that says otherwise is named.
  ExpectRejected(Valid() + "[parallel]\noffload = \"optimizer+params\"\nzero = 1\n",
                 "parallel.zero = 1; set parallel.zero = 3");
  ExpectRejected(Valid() + "[parallel]\noffload = \"optimizer+params\"\nzero = 3\nrecompute = true\n",
                 "set parallel.recompute = false");
  auto streamed =
      ParseRunSpec(Valid() + "[parallel]\noffload = \"optimizer+params\"\nzero = 3\nrecompute = false\n", dir_, true);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  auto streamed_again = ParseRunSpec(RunSpecToToml(*streamed), dir_, true);
  ASSERT_TRUE(streamed_again.ok()) << streamed_again.status().ToString();
  EXPECT_EQ(streamed_again->parallel.offload, Offload::kOptimizerAndParams);
  ExpectRejected(Valid() + "[parallel]\noffload = true\n", "parallel.offload");
  auto defaults = ParseRunSpec(Valid(), dir_, true);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  // Absent (or "auto"): the planner's, holding "none" until planned, and "auto" again once stored.
  EXPECT_EQ(defaults->parallel.offload, Offload::kNone);
  EXPECT_EQ(defaults->parallel.automatic.count("offload"), 1u);
  auto stored = ParseRunSpec(RunSpecToToml(*defaults), dir_, true);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->parallel.automatic.count("offload"), 1u);
  auto none = ParseRunSpec(Valid() + "[parallel]\noffload = \"none\"\n", dir_, true);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->parallel.automatic.count("offload"), 0u) << "an explicit none is the user's choice";
  auto spec = ParseRunSpec(Valid() + "[parallel]\noffload = \"optimizer\"\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto again = ParseRunSpec(RunSpecToToml(*spec), dir_, true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->parallel.offload, Offload::kOptimizer);
}
// Defaults a long run survives: a checkpoint every tenth of the run, the newest 3 kept; an
// explicit 0 keeps its meaning (only at the end; keep all).
TEST_F(RunSpecTest, CheckpointDefaultsAreATenthOfTheRunAndTheNewestThree) {
  auto defaults = ParseRunSpec(With("steps = 5\n", "steps = 1000\n"), dir_, true);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->train.checkpoint_every, TrainSpec::kAutoCheckpoints);
  EXPECT_EQ(defaults->train.CheckpointInterval(), 100);
  EXPECT_EQ(defaults->train.keep_checkpoints, 3);
  auto stored = ParseRunSpec(RunSpecToToml(*defaults), dir_, true);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->train.checkpoint_every, TrainSpec::kAutoCheckpoints);
  auto short_run = ParseRunSpec(With("steps = 5\n", "steps = 7\ncheckpoint_every = \"auto\"\n"), dir_, true);
  ASSERT_TRUE(short_run.ok()) << short_run.status().ToString();
  EXPECT_EQ(short_run->train.CheckpointInterval(), 1);
  auto explicit_zero = ParseRunSpec(Valid("", "checkpoint_every = 0\nkeep_checkpoints = 0\n"), dir_, true);
  ASSERT_TRUE(explicit_zero.ok()) << explicit_zero.status().ToString();
  EXPECT_EQ(explicit_zero->train.CheckpointInterval(), 0);
  EXPECT_EQ(explicit_zero->train.keep_checkpoints, 0);
  ExpectRejected(Valid("", "checkpoint_every = \"hourly\"\n"),
                 "train.checkpoint_every must be an integer (0 = only at the end) or \"auto\"");
  // A spec an older coordinator stored, without the key, kept every checkpoint: it still does.
  auto stored_old = ParseStoredRunSpec(Valid());
  ASSERT_TRUE(stored_old.ok()) << stored_old.status().ToString();
  EXPECT_EQ(stored_old->train.keep_checkpoints, 0);
}
TEST_F(RunSpecTest, StagesAreOneLayerCountPerStageAddingUpToTheModel) {
  // Valid(): 2 layers.
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [2]\n",
                 "parallel.stages = [2] has 1 stages but parallel.pp is 2");
  ExpectRejected(Valid() + "[parallel]\nstages = [1, 1]\n",
                 "parallel.stages = [1, 1] has 2 stages but parallel.pp is \"auto\"");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [2, 0]\n", "gives a stage no layers");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [2, 1]\n", "covers 3 layers but model.layers = 2");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = \"even\"\n",
                 "parallel.stages must be a list of integers or \"auto\"");
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

// A choice's spelling is parsed once, into its enum (spec/spec_choices.h); one that names no
// value is refused with the key, the spelling and the choices, where the field's check is.
TEST_F(RunSpecTest, MisspeltChoicesAreRefusedNamingTheKeyAndTheChoices) {
  ExpectRejected(Valid("", "lr_schedule = \"linear\"\n"),
                 "run spec: train.lr_schedule = \"linear\" is not supported; use \"constant\" or \"cosine\"");
  ExpectRejected("kind = \"Train\"\n" + Valid(),
                 "run spec: kind = \"Train\" is not supported; use \"train\", \"extract\" or \"patch\"");
  ExpectRejected(With("layers = 2", "layers = 2\nactivation = \"relu\""),
                 "run spec: model.activation = \"relu\" is not supported for gpt2; use \"gelu_tanh\"");
  ExpectRejected(With("layers = 2", "family = \"gemma\"\nlayers = 2\nactivation = \"silu\""),
                 "model.activation = \"silu\" is not supported for gemma; use \"gelu\", \"gelu_tanh\"");
  ExpectRejected(
      With("layers = 2", "family = \"llama\"\nlayers = 2\nrope_scaling = { type = \"yarn\" }"),
      "run spec: model.rope_scaling.type = \"yarn\" is not supported; use \"none\", \"linear\" or \"llama3\"");
  ExpectRejected(With("layers = 2", "family = \"Llama\"\nlayers = 2"),
                 "model.family = \"Llama\" is not supported; use one of \"gpt2\", \"llama\", \"mistral\", \"qwen2\", "
                 "\"gemma\", \"gpt_neox\"");
  // An empty activation is the family's own, as an absent one.
  auto neox = ParseRunSpec(With("layers = 2", "family = \"gpt_neox\"\nlayers = 2\nactivation = \"\""), dir_, true);
  ASSERT_TRUE(neox.ok()) << neox.status().ToString();
  EXPECT_EQ(neox->model.activation, Activation::kGelu);
  auto again = ParseStoredRunSpec(RunSpecToToml(*neox));  // written as the filled-in value
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->model.activation, Activation::kGelu);
}

TEST(SpecChoicesTest, EverySpellingParsesToItsValue) {
  const auto round_trips = [](auto value) {
    using E = decltype(value);
    for (const auto& [v, name] : Choices<E>::kNames) {
      if (ParseChoice<E>(name) != v || Name(v) != name) return false;
    }
    return !ParseChoice<E>("no such choice").has_value();
  };
  EXPECT_TRUE(round_trips(RunKind{}));
  EXPECT_TRUE(round_trips(Family{}));
  EXPECT_TRUE(round_trips(Activation{}));
  EXPECT_TRUE(round_trips(RopeScalingType{}));
  EXPECT_TRUE(round_trips(TokenFormat{}));
  EXPECT_TRUE(round_trips(LrSchedule{}));
  EXPECT_TRUE(round_trips(Precision{}));
  EXPECT_TRUE(round_trips(Optimizer{}));
  EXPECT_TRUE(round_trips(Offload{}));
  EXPECT_TRUE(round_trips(ExtractMode{}));
  EXPECT_TRUE(round_trips(StoredDType{}));
  EXPECT_TRUE(round_trips(Ablation{}));
  EXPECT_EQ(Name(Offload::kOptimizerAndParams), "optimizer+params");
  EXPECT_EQ(Name(Family::kGptNeox), "gpt_neox");
  EXPECT_EQ(ChoiceList<StoredDType>(), "\"fp32\", \"bf16\" or \"fp16\"");
}

TEST(LearningRateTest, WarmupThenCosineToMinLr) {
  TrainSpec t;
  t.steps = 110;
  t.lr = 1.0;
  t.min_lr = 0.1;
  t.warmup_steps = 10;
  t.lr_schedule = LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 1.0);
  EXPECT_NEAR(LearningRate(t, 60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(LearningRate(t, 110), 0.1, 1e-12);
  t.lr_schedule = LrSchedule::kConstant;
  EXPECT_DOUBLE_EQ(LearningRate(t, 100), 1.0);
}
TEST_F(RunSpecTest, BatchMustDivideByDp) { ExpectRejected(Valid() + "[parallel]\ndp = 3\n", "parallel.dp"); }

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
  ExpectRejected(head + "[extract]\nsites = [\"logit\"]\n", "unknown site \"logit\"");
  ExpectRejected(head + "[extract]\ndtype = \"int8\"\n", "extract.dtype");
  ExpectRejected(head + "[extract]\nbatch = 0\n", "extract.batch");
  ExpectRejected(head + "[extract]\ntokens = 5\n", "extract.tokens");
  ExpectRejected(head + "[extract]\nsizes = 1\n", "extract.sizes");
  ExpectRejected(Valid() + "[extract]\nbatch = 2\n", "needs kind = \"extract\"");
  ExpectRejected("kind = \"finetune\"\n" + Valid(), "kind = \"finetune\"");
}

TEST_F(RunSpecTest, EverySiteHasARowShapeAndModelLevelSitesAddTheLastLayer) {
  auto spec =
      ParseRunSpec("kind = \"extract\"\n" + Valid("kv_heads = 2\nfamily = \"llama\"\nffn = 96\n") +
                       "[extract]\nlayers = [0]\nsites = [\"logits\", \"q\", \"k\", \"attn_pattern\", \"mlp_hidden\", "
                       "\"final_norm\", \"resid_mid\"]\nlogits_top_k = 7\n",
                   dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  // final_norm and logits are stored as the last layer's; logits_ids comes with top-k.
  EXPECT_EQ(spec->extract.layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(spec->extract.sites, (std::vector<std::string>{"resid_mid", "q", "k", "attn_pattern", "mlp_hidden",
                                                           "final_norm", "logits", "logits_ids"}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "q"), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "k"), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "attn_pattern"), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "mlp_hidden"), (std::vector<int64_t>{96}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "final_norm"), (std::vector<int64_t>{64}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "logits"), (std::vector<int64_t>{7}));
  EXPECT_EQ(ExtractSiteDType(*spec, "logits_ids"), "i32");
  EXPECT_EQ(ExtractSiteDType(*spec, "logits"), "fp32");
  auto back = ParseRunSpec(RunSpecToToml(*spec), "", false);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->extract.sites, spec->extract.sites);
  EXPECT_EQ(back->extract.layers, spec->extract.layers);
  EXPECT_EQ(back->extract.logits_top_k, 7);
}

TEST_F(RunSpecTest, SitesThatCannotBeCapturedAreRefusedNamingTheNumbers) {
  std::ofstream(dir_ + "/corpus.txt") << std::string(8192, 'a');  // one sequence of 4096 and its target
  const std::string head = "kind = \"extract\"\n";
  ExpectRejected(
      head + With("sequence = 32", "sequence = 4096\nmax_positions = 4096") + "[extract]\nsites = [\"attn_pattern\"]\n",
      "model.sequence = 4096 is over the 2048 it is captured up to");
  // 64 sequences x 2048 rows x [4 heads, 2048] fp32 x 2 layers = 8 GiB per chunk.
  ExpectRejected(
      head + With("sequence = 32", "sequence = 2048\nmax_positions = 2048") +
          "[extract]\nsites = [\"attn_pattern\"]\nbatch = 64\n",
      "one chunk of 64 sequences would hold 8192 MiB of attn_pattern (over 2 layer(s), 2048 tokens each), over "
      "the 4096 MiB");
  ExpectRejected(head + Valid("vocab = 200000\n") + "[extract]\nsites = [\"logits\"]\nbatch = 256\n",
                 "set extract.logits_top_k");
  ExpectRejected(head + Valid() + "[extract]\nlogits_top_k = 5\n", "logits_top_k = 5 applies to the logits site");
  ExpectRejected(head + Valid() + "[extract]\nsites = [\"logits\"]\nlogits_top_k = 300\n", "extract.logits_top_k");
  ExpectRejected(head + Valid() + "[extract]\nsites = [\"logits_ids\"]\n", "set logits_top_k instead");
  ExpectRejected(head + Valid() + "[extract]\nsites = [\"loss\"]\n", "which patch runs store");
}

TEST_F(RunSpecTest, PatchRunsStoreTheLossAtTheLastLayerAndRoundTrip) {
  auto spec = ParseRunSpec(
      "kind = \"patch\"\n" + Valid() +
          "[extract]\nbatch = 2\n[patch]\nlayers = [1, 0]\nsites = [\"mlp_out\", \"attn_out\"]\nlogits = true\n",
      dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->is_extract());
  EXPECT_TRUE(spec->is_patch());
  EXPECT_EQ(spec->patch.layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(spec->patch.sites, (std::vector<std::string>{"attn_out", "mlp_out"}));
  EXPECT_EQ(spec->extract.layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(spec->extract.sites, (std::vector<std::string>{"logits", "loss"}));
  EXPECT_EQ(ExtractSiteRowShape(*spec, "loss"), (std::vector<int64_t>{1}));
  auto back = ParseRunSpec(RunSpecToToml(*spec), "", false);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->patch.layers, spec->patch.layers);
  EXPECT_EQ(back->patch.sites, spec->patch.sites);
  EXPECT_EQ(back->extract.sites, spec->extract.sites);
  EXPECT_EQ(back->extract.batch, 2);
}

TEST_F(RunSpecTest, PatchBadInputNamesTheField) {
  const std::string head = "kind = \"patch\"\n" + Valid();
  ExpectRejected(head + "[patch]\nsites = [\"attn_out\"]\n", "patch.layers is missing");
  ExpectRejected(head + "[patch]\nlayers = [2]\nsites = [\"attn_out\"]\n", "patch.layers holds 2");
  ExpectRejected(head + "[patch]\nlayers = [0]\n", "patch.sites is missing");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"q\"]\n",
                 "patch.sites holds \"q\", which cannot be replaced");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"capture\"\n", "not built yet");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"mean\"\n",
                 "needs patch.source, an fp32 .npy of shape (64)");
  ExpectRejected(head + "[patch]\nlayers = [0, 1]\nsites = [\"attn_out\"]\nablation = \"mean\"\nsource = \"m.npy\"\n",
                 "name exactly one in patch.layers and patch.sites (they hold 2 and 1)");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"mean\"\nsource = \"m.npy\"\n",
                 "m.npy\" does not exist");
  std::string npy_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (32,), }";
  npy_header.resize(117, ' ');
  std::ofstream(dir_ + "/m.npy") << std::string("\x93NUMPY\x01\x00\x76\x00", 10) << npy_header << '\n'
                                 << std::string(128, '\0');
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"mlp_out\"]\nablation = \"mean\"\nsource = \"m.npy\"\n",
                 "holds a <f4 array of shape (32); mlp_out needs fp32 ('<f4', C order) of shape (64)");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"half\"\n",
                 "patch.ablation = \"half\"");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nsource = \"r1\"\n", "patch.source");
  // Steering: a vector of the site's shape, one site at one layer, a finite bounded alpha, and
  // alpha only with it.
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"steer\"\n",
                 "patch.ablation = \"steer\" needs patch.source, an fp32 .npy of shape (64) holding the direction");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"mlp_out\"]\nablation = \"steer\"\nsource = \"m.npy\"\n",
                 "mlp_out needs fp32 ('<f4', C order) of shape (64)");
  ExpectRejected(head +
                     "[patch]\nlayers = [0]\nsites = [\"attn_out\", \"mlp_out\"]\nablation = \"steer\"\n"
                     "source = \"m.npy\"\n",
                 "adds patch.alpha x patch.source's vector to one site at one layer");
  ExpectRejected(head + "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nalpha = 2.0\n",
                 "patch.alpha scales the vector ablation = \"steer\" adds; remove it for ablation = \"zero\"");
  ExpectRejected(head +
                     "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"steer\"\nsource = \"m.npy\"\n"
                     "alpha = nan\n",
                 "patch.alpha = nan must be in [-1e+06, 1e+06]");
  ExpectRejected(head +
                     "[patch]\nlayers = [0]\nsites = [\"attn_out\"]\nablation = \"steer\"\nsource = \"m.npy\"\n"
                     "alpha = 1e7\n",
                 "patch.alpha = 1e+07 must be in [-1e+06, 1e+06]");
  ExpectRejected(head + "[extract]\nsites = [\"q\"]\n[patch]\nlayers = [0]\nsites = [\"attn_out\"]\n", "do not apply");
  ExpectRejected("kind = \"extract\"\n" + Valid() + "[patch]\nlayers = [0]\n", "needs kind = \"patch\"");
}

// [parallel] fields the spec leaves out, or sets to "auto", are the planner's; the canonical TOML
// keeps them "auto" until the coordinator fills them.
TEST_F(RunSpecTest, AbsentAndAutoParallelFieldsAreLeftToThePlanner) {
  auto spec = ParseRunSpec(Valid() + "[parallel]\ndp = 2\nzero = \"auto\"\n", dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->parallel.dp, 2);
  EXPECT_EQ(spec->parallel.automatic,
            (std::set<std::string>{"pp", "tp", "micro_batch", "zero", "recompute", "keep_gathered", "offload"}));
  EXPECT_FALSE(spec->parallel.planned());
  auto again = ParseRunSpec(RunSpecToToml(*spec), "", true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->parallel.automatic, spec->parallel.automatic);
  auto fixed = ParseRunSpec(
      Valid() +
          "[parallel]\ndp = 1\npp = 1\ntp = 1\nmicro_batch = 0\nzero = 0\nrecompute = false\noffload = \"none\"\n",
      dir_, true);
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->parallel.planned());
  // Every other field fixed, an absent offload is "none": a fixed mesh runs as given.
  auto mesh_only = ParseRunSpec(
      Valid() + "[parallel]\ndp = 1\npp = 1\ntp = 1\nmicro_batch = 0\nzero = 0\nrecompute = false\n", dir_, true);
  ASSERT_TRUE(mesh_only.ok());
  EXPECT_TRUE(mesh_only->parallel.planned());
  EXPECT_EQ(mesh_only->parallel.offload, Offload::kNone);
}

// keep_gathered means something only under ZeRO-3 without recompute: left out on a mesh fixed to
// anything else it is 0 and leaves nothing to plan; set there, it is refused naming the field.
TEST_F(RunSpecTest, KeepGatheredIsPlannedOnlyWhereZero3GathersAgain) {
  const std::string fixed_mesh = Valid() + "[parallel]\ndp = 1\npp = 1\ntp = 1\nmicro_batch = 0\noffload = \"none\"\n";
  auto zero1 = ParseRunSpec(fixed_mesh + "zero = 1\nrecompute = false\n", dir_, true);
  ASSERT_TRUE(zero1.ok()) << zero1.status().ToString();
  EXPECT_TRUE(zero1->parallel.planned());
  EXPECT_EQ(zero1->parallel.keep_gathered, 0);
  auto recomputed = ParseRunSpec(fixed_mesh + "zero = 3\nrecompute = true\n", dir_, true);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status().ToString();
  EXPECT_TRUE(recomputed->parallel.planned());
  auto zero3 = ParseRunSpec(fixed_mesh + "zero = 3\nrecompute = false\n", dir_, true);
  ASSERT_TRUE(zero3.ok()) << zero3.status().ToString();
  EXPECT_EQ(zero3->parallel.automatic, (std::set<std::string>{"keep_gathered"}));
  auto kept = ParseRunSpec(fixed_mesh + "zero = 3\nrecompute = false\nkeep_gathered = 2\n", dir_, true);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_TRUE(kept->parallel.planned());
  auto again = ParseRunSpec(RunSpecToToml(*kept), dir_, true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->parallel.keep_gathered, 2);
  // A spec stored before the field existed (no key) ran with every layer gathered again.
  auto stored = ParseStoredRunSpec(fixed_mesh + "zero = 3\nrecompute = false\n");
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_TRUE(stored->parallel.planned());
  EXPECT_EQ(stored->parallel.keep_gathered, 0);
  ExpectRejected(fixed_mesh + "zero = 2\nkeep_gathered = 2\n",
                 "parallel.keep_gathered = 2 keeps ZeRO-3's gathered layers");
  ExpectRejected(fixed_mesh + "zero = 3\nrecompute = true\nkeep_gathered = 1\n",
                 "set parallel.keep_gathered = 0 or parallel.recompute = false");
  ExpectRejected(fixed_mesh + "zero = 3\nkeep_gathered = -1\n", "parallel.keep_gathered");
  ExpectRejected(fixed_mesh + "zero = 3\nkeep_gathered = 5000\n", "parallel.keep_gathered = 5000 is over the bound");
}

TEST_F(RunSpecTest, AutoIsTheOnlyWordAParallelFieldTakes) {
  ExpectRejected(Valid() + "[parallel]\ndp = \"max\"\n", "parallel.dp must be an integer or \"auto\"");
  ExpectRejected(Valid() + "[parallel]\nrecompute = \"yes\"\n", "parallel.recompute must be true, false or \"auto\"");
}

// Issue #24: AdamW's eps is a spec field (default 1e-8, the value every run used before), in
// (0, 1e-2], written into the canonical TOML and read back.
TEST_F(RunSpecTest, AdamEpsDefaultsParsesAndIsBounded) {
  auto defaults = ParseRunSpec(Valid(), dir_, true);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->train.eps, 1e-8);
  auto spec = ParseRunSpec(Valid("", "eps = 1e-6\n"), dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->train.eps, 1e-6);
  const std::string canonical = RunSpecToToml(*spec);
  EXPECT_NE(canonical.find("\neps = "), std::string::npos) << canonical;
  auto again = ParseStoredRunSpec(canonical);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->train.eps, 1e-6);
  EXPECT_TRUE(ParseRunSpec(Valid("", "eps = 0.01\n"), dir_, true).ok());  // the bound itself
  for (const char* v : {"0", "-1e-8", "0.02", "1", "nan", "inf"}) {
    ExpectRejected(Valid("", std::string("eps = ") + v + "\n"), "train.eps");
  }
  ExpectRejected(Valid("", "eps = \"small\"\n"), "train.eps must be a number");
}

// Issue #20: every number has an upper bound, refused at parse naming the field, value and bound
// (before: layers = 2^31 grew submit to 23.7 GB, global_batch = 2^40 spun the planner for minutes,
// hidden = 2^62 printed a negative estimate, steps = 10^18 was accepted).
TEST_F(RunSpecTest, NumbersOverTheirBoundsAreRefusedNamingTheBound) {
  struct Case {
    std::string from, to, needle;
  } cases[] = {
      {"layers = 2", "layers = 2147483648", "model.layers = 2147483648 is over the bound of 1024"},
      {"hidden = 64", "hidden = 4611686018427387904", "model.hidden = 4611686018427387904 is over the bound of 65536"},
      {"heads = 4", "heads = 4096", "model.heads = 4096 is over the bound of 1024"},
      {"sequence = 32", "sequence = 2097152", "model.sequence = 2097152 is over the bound of 1048576"},
      {"steps = 5", "steps = 1000000000000000000", "train.steps = 1000000000000000000 is over the bound of 1000000000"},
      {"global_batch = 4", "global_batch = 1099511627776",
       "train.global_batch = 1099511627776 is over the bound of 16777216"},
  };
  for (const auto& c : cases) ExpectRejected(With(c.from, c.to), c.needle);
  ExpectRejected(Valid("vocab = 16777217\n"), "model.vocab = 16777217 is over the bound of 16777216");
  ExpectRejected(Valid("ffn = 2097152\n"), "model.ffn = 2097152 is over the bound");
  ExpectRejected(Valid("", "checkpoint_every = 1000000001\n"), "train.checkpoint_every");
  ExpectRejected(Valid("", "warmup_steps = 1000000001\n"), "train.warmup_steps");
  ExpectRejected(Valid() + "[worker]\nthreads = 100000\n", "worker.threads = 100000 is over the bound of 1024");
  ExpectRejected(Valid() + "[parallel]\ndp = 70000\n", "parallel.dp = 70000 is over the bound");
  ExpectRejected(Valid() + "[parallel]\nmicro_batch = 99999999\n", "parallel.micro_batch");
  ExpectRejected(Valid() + "[parallel]\npp = 2\nstages = [4, 9223372036854775807]\n", "parallel.stages");
  ExpectRejected(With("layers = 2", "layers = 4") + "[parallel]\npp = 2\nstages = [4, 5]\n", "parallel.stages");
  const std::string extract = "kind = \"extract\"\n" + Valid() + "[extract]\n";
  ExpectRejected(extract + "batch = 1000000\n", "extract.batch = 1000000 is over the bound of 65536");
  ExpectRejected(extract + "tokens = 9223372036854775807\n", "extract.tokens");
  // Floats: NaN and infinities are outside every range.
  for (const char* v : {"nan", "inf", "-inf", "1e308"})
    ExpectRejected(Valid("", std::string("lr = ") + v + "\n"), "train.lr");
  ExpectRejected(Valid("rope_theta = nan\n"), "model.rope_theta");
  // The bounds themselves are accepted (the message promises "over the bound").
  auto at_bound = ParseRunSpec(With("steps = 5", "steps = 1000000000") + "[worker]\nthreads = 1024\n", dir_, true);
  ASSERT_TRUE(at_bound.ok()) << at_bound.status().ToString();
  EXPECT_EQ(at_bound->train.steps, 1000000000);
}

// Issue #20: a NUL in a name wedged the cluster (workers trained under the id cut at the NUL), a
// 115-character name failed its checkpoint ("File name too long"), escapes printed raw.
TEST_F(RunSpecTest, RunNamesAreShortAndOfASafeCharacterSet) {
  auto named = [&](const std::string& toml_name) { return With("name = \"t\"", "name = \"" + toml_name + "\""); };
  ExpectRejected(named("a\\u0000b"), "holds the character \\x00");
  ExpectRejected(named(std::string(115, 'n')), "is 115 bytes long");
  ExpectRejected(named("red\\u001b[31m"), "\\x1B");
  ExpectRejected(named("two\\nlines"), "\\x0A");
  ExpectRejected(named(".hidden"), "starts with '.'");
  ExpectRejected(named("-rf"), "starts with '-'");
  ExpectRejected(named("a/b"), "holds the character '/'");
  ExpectRejected(named("caf\\u00e9"), "\\xC3");
  for (const std::string& ok :
       {std::string("gpt2-tiny"), std::string("run_1.v2"), std::string("A"), std::string(64, 'x')}) {
    auto spec = ParseRunSpec(named(ok), dir_, true);
    EXPECT_TRUE(spec.ok()) << ok << ": " << spec.status().ToString();
  }
  // What the coordinator stored before the rule still loads, to be listed and printed escaped.
  auto stored = ParseStoredRunSpec(With("name = \"t\"", "name = \"a\\u001b[2Jb\\u0000c\""));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->name, std::string("a\x1b[2Jb\0c", 8));
  EXPECT_EQ(EscapeForTerminal(stored->name), "a\\x1B[2Jb\\x00c");
}

TEST(EscapeForTerminalTest, ControlBytesAndBackslashesBecomeHexAndTextStays) {
  EXPECT_EQ(EscapeForTerminal("plain run-1 ok"), "plain run-1 ok");
  EXPECT_EQ(EscapeForTerminal("a\nb\rc\td\x7f"), "a\\x0Ab\\x0Dc\\x09d\\x7F");
  EXPECT_EQ(EscapeForTerminal("back\\slash"), "back\\x5Cslash");
  EXPECT_EQ(EscapeForTerminal("caf\xC3\xA9"), "caf\xC3\xA9");  // UTF-8 text is kept
  EXPECT_EQ(EscapeForTerminal("csi\xC2\x9B"
                              "31m"),
            "csi\\xC2\\x9B31m");  // C1 CSI is not
}

// Issue #20: `strata submit /dev/zero` ate memory forever and a FIFO blocked it.
TEST_F(RunSpecTest, SpecFilesAreRegularFilesOfBoundedSize) {
  auto text = ReadSpecFile(dir_ + "/corpus.txt", "run spec");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(text->size(), 4096u);
  auto zero = ReadSpecFile("/dev/zero", "run spec");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("/dev/zero is a character device"), std::string::npos)
      << zero.status().message();
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto piped = ReadSpecFile(fifo, "run spec");  // no writer: a blocking open would hang here
  ASSERT_FALSE(piped.ok());
  EXPECT_NE(piped.status().message().find(fifo + " is a FIFO"), std::string::npos) << piped.status().message();
  auto dir = ReadSpecFile(dir_, "run spec");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos);
  std::ofstream(dir_ + "/big.toml") << std::string((1 << 20) + 1, '#');
  auto big = ReadSpecFile(dir_ + "/big.toml", "run spec");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("larger than 1024 KiB"), std::string::npos) << big.status().message();
  auto missing = ReadSpecFile(dir_ + "/nope.toml", "run spec");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("nope.toml"), std::string::npos);
}

TEST(ClampWorkerThreadsTest, AtMostTheCoresAndZeroKept) {
  EXPECT_EQ(ClampWorkerThreads(100000, 16), 16);
  EXPECT_EQ(ClampWorkerThreads(4, 16), 4);
  EXPECT_EQ(ClampWorkerThreads(0, 16), 0);  // LibTorch's default
  EXPECT_EQ(ClampWorkerThreads(8, 0), 1);   // hardware_concurrency() may not know: 0
}

// `strata submit` checks a run's files and config.json on the user's machine and sends the
// canonical TOML; the coordinator then checks every field but opens no file (its host may hold
// none of them), and each worker checks the files it opens.
TEST_F(RunSpecTest, SubmittedSpecIsCheckedWithoutOpeningItsFiles) {
  std::ofstream(dir_ + "/config.json") << R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0})";
  auto parsed = ParseRunSpec("name = \"t\"\n[model]\nsequence = 32\ninit_from = \"" + dir_ +
                                 "\"\n[data]\npath = \"corpus.txt\"\n[train]\nsteps = 5\nglobal_batch = 4\n",
                             dir_, true);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const std::string canonical = RunSpecToToml(*parsed);
  ASSERT_EQ(std::remove((dir_ + "/corpus.txt").c_str()), 0);
  ASSERT_EQ(std::remove((dir_ + "/config.json").c_str()), 0);

  // Read where it was submitted, config.json is needed again; the coordinator's reading is not.
  EXPECT_FALSE(ParseRunSpec(canonical, "", false).ok());
  auto submitted = ParseSubmittedRunSpec(canonical);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  EXPECT_EQ(RunSpecToToml(*submitted), canonical);
  EXPECT_EQ(submitted->model.family, Family::kLlama);
  EXPECT_EQ(submitted->model.kv_heads, 2);

  // A worker's check names the file it cannot open.
  Status files = CheckRunSpecFiles(*submitted);
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.message(), "run spec: data.path = \"" + dir_ + "/corpus.txt\" does not exist or is not a file");

  // Every field and the name rule still hold at the coordinator.
  RunSpec bad_steps = *submitted;
  bad_steps.train.steps = 0;
  auto refused = ParseSubmittedRunSpec(RunSpecToToml(bad_steps));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("train.steps = 0"), std::string::npos) << refused.status().message();
  RunSpec bad_name = *submitted;
  bad_name.name = "-t";
  refused = ParseSubmittedRunSpec(RunSpecToToml(bad_name));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("name"), std::string::npos) << refused.status().message();
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// toml++ 3.3.0 runs into undefined behaviour on most non-ASCII characters where it looks for
// whitespace (spec/toml_text.h): they are refused before it parses, named by line and column, and
// the places TOML allows them (strings, comments) keep working.
TEST(TomlText, NonAsciiOutsideStringsAndCommentsIsRefusedBeforeTheParse) {
  const std::string base = "name = \"t\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\n[data]\npath = \"c.txt\"\n";
  auto bad = ParseSubmittedRunSpec(base + "[train]\nsteps = 5\xc3\xa9\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("run spec: line 9, column 10: U+00E9 outside a string or comment"),
            std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(CheckTomlText("a = \"\"\"x \\\n  \xef\xb1\x80\"\"\"", "t").ok());  // trimmed by a line-ending backslash
  EXPECT_TRUE(CheckTomlText("a = \"\"\"x \\\n  y \xef\xb1\x80\"\"\"", "t").ok());
  // A quote inside a bare value starts no string: toml++ reads on to the value's end (the fuzzer's
  // case).
  EXPECT_FALSE(CheckTomlText("name =0t2\"t2-tin\xef\xb3\xbf[model", "t").ok());
  auto good = ParseSubmittedRunSpec("# caf\xc3\xa9 \xe2\x80\x94 a comment\n" + base + "[train]\nsteps = 5\n");
  EXPECT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(CheckTomlText("name = \"caf\xc3\xa9\" # \xe4\xb8\xad\nb = 'l\xc3\xa9'\nc = '''\xc3\xa9'''\n", "t").ok());
}

}  // namespace
}  // namespace strata
