// The run spec's Cap'n Proto form: every field survives the trip, the wire enums agree with the C++
// ones value by value, and a damaged struct is refused naming its field.
#include "spec/run_spec_capnp.h"

#include <capnp/message.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>

namespace strata {
namespace {

// "gpt_neox" / "gptNeox" -> "gptneox": the spellings of one value in the TOML and the schema.
std::string Folded(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(c));
  }
  return out;
}

template <SpecChoice E, typename Wire>
void ExpectSameValues(const char* what) {
  const auto enumerants = capnp::Schema::from<Wire>().getEnumerants();
  const auto& names = Choices<E>::kNames;
  ASSERT_EQ(enumerants.size(), std::size(names)) << what;
  for (size_t i = 0; i < std::size(names); ++i) {
    std::string expected = Folded(names[i].second);
    if (expected.empty()) expected = "familydefault";                    // Activation::kFamilyDefault
    if (expected == "optimizerparams") expected = "optimizerandparams";  // "optimizer+params"
    EXPECT_EQ(Folded(enumerants[i].getProto().getName().cStr()), expected) << what << " value " << i;
  }
}

TEST(RunSpecCapnpTest, EveryWireEnumListsTheChoicesInOrder) {
  ExpectSameValues<RunKind, wire::RunKind>("RunKind");
  ExpectSameValues<Family, wire::Family>("Family");
  ExpectSameValues<Activation, wire::Activation>("Activation");
  ExpectSameValues<RopeScalingType, wire::RopeScalingType>("RopeScalingType");
  ExpectSameValues<TokenFormat, wire::TokenFormat>("TokenFormat");
  ExpectSameValues<LrSchedule, wire::LrSchedule>("LrSchedule");
  ExpectSameValues<Precision, wire::Precision>("Precision");
  ExpectSameValues<Optimizer, wire::Optimizer>("Optimizer");
  ExpectSameValues<Offload, wire::Offload>("Offload");
  ExpectSameValues<ExtractMode, wire::ExtractMode>("ExtractMode");
  ExpectSameValues<StoredDType, wire::StoredDType>("StoredDType");
  ExpectSameValues<Ablation, wire::Ablation>("Ablation");
  ExpectSameValues<LoraBase, wire::LoraBase>("LoraBase");
}

class RunSpecWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-spec-wire-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/corpus.txt") << std::string(4096, 'a');
  }
  RunSpec Parsed(const std::string& toml) {
    auto spec = ParseRunSpec(toml, dir_, true);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    return spec.ok() ? *spec : RunSpec{};
  }
  static Result<RunSpec> Trip(const RunSpec& spec) {
    capnp::MallocMessageBuilder message;
    WriteRunSpec(spec, message.initRoot<wire::RunSpec>());
    return ReadRunSpec(message.getRoot<wire::RunSpec>().asReader(), "the test's spec");
  }
  std::string dir_;
};

const char* kModel = "[model]\nlayers = 4\nhidden = 64\nheads = 4\nsequence = 32\n";

TEST_F(RunSpecWireTest, ATrainSpecWithEveryChoiceSetArrivesEqual) {
  RunSpec spec = Parsed(std::string("name = \"t\"\n") +
                        "[model]\nfamily = \"llama\"\nlayers = 4\nhidden = 64\nheads = 4\nkv_heads = 2\n"
                        "sequence = 32\nrope_theta = 50000.0\nmlp_bias = true\n"
                        "rope_scaling = { type = \"llama3\", factor = 8.0 }\n"
                        "[data]\npath = \"corpus.txt\"\nformat = \"u16\"\n"
                        "[train]\nsteps = 7\nglobal_batch = 8\nlr = 0.003\nlr_schedule = \"cosine\"\n"
                        "warmup_steps = 2\nmin_lr = 1e-5\nweight_decay = 0.1\neps = 1e-6\ngrad_clip = 1.0\n"
                        "seed = 9\ncheckpoint_every = 3\nkeep_checkpoints = 0\nprecision = \"bf16\"\n"
                        "cuda_graphs = false\noptimizer = \"adamw8bit\"\n"
                        "[parallel]\ndp = 2\npp = 2\nmicro_batch = 2\nzero = 1\nrecompute = true\n"
                        "stages = [3, 1]\ntp_comm_overlap = false\n"
                        "[worker]\nthreads = 3\n"
                        "[lora]\nrank = 4\nalpha = 16\ndropout = 0.05\ntarget_modules = [\"q_proj\", \"down_proj\"]\n"
                        "use_rslora = true\nbase = \"nf4\"\n");
  spec.model.adapter_from = dir_ + "/adapter";  // set past the parse, which would read its config
  auto back = Trip(spec);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, spec);
  EXPECT_EQ(RunSpecToToml(*back), RunSpecToToml(spec));
  EXPECT_EQ(back->parallel.stages, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(back->lora.base, LoraBase::kNf4);
  EXPECT_EQ(back->model.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(back->model.adapter_from, dir_ + "/adapter");
}

TEST_F(RunSpecWireTest, TheFieldsLeftToThePlannerArriveAsAutomatic) {
  RunSpec spec = Parsed(std::string("name = \"t\"\n") + kModel +
                        "[data]\npath = \"corpus.txt\"\n[train]\nsteps = 5\nglobal_batch = 4\n"
                        "[parallel]\ndp = \"auto\"\nzero = \"auto\"\n");
  ASSERT_FALSE(spec.parallel.automatic.empty());
  auto back = Trip(spec);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->parallel.automatic, spec.parallel.automatic);
  EXPECT_EQ(*back, spec);
}

TEST_F(RunSpecWireTest, ExtractAndPatchSpecsArriveEqual) {
  RunSpec extract = Parsed(std::string("name = \"e\"\nkind = \"extract\"\n") + kModel +
                           "[data]\npath = \"corpus.txt\"\n[extract]\nlayers = [1, 3]\n"
                           "sites = [\"resid_post\", \"attn_out\", \"logits\"]\ndtype = \"bf16\"\nbatch = 3\n"
                           "tokens = 640\nmode = \"layerwise\"\nlogits_top_k = 5\n");
  auto back = Trip(extract);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, extract);
  RunSpec patch = Parsed(std::string("name = \"p\"\nkind = \"patch\"\n") + kModel +
                         "[data]\npath = \"corpus.txt\"\n[patch]\nlayers = [2]\nsites = [\"resid_post\"]\n"
                         "logits = true\n");
  back = Trip(patch);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, patch);
}

// A struct from a damaged or foreign message: refused naming the field, before any of its numbers
// sizes or divides anything.
class DamagedWireSpecTest : public RunSpecWireTest {
 protected:
  template <typename Damage>
  void ExpectRefused(Damage damage, const std::string& needle) {
    RunSpec spec = Parsed(std::string("name = \"t\"\nkind = \"extract\"\n") + kModel +
                          "[data]\npath = \"corpus.txt\"\n[extract]\nlayers = [1]\n");
    capnp::MallocMessageBuilder message;
    auto root = message.initRoot<wire::RunSpec>();
    WriteRunSpec(spec, root);
    damage(root);
    auto back = ReadRunSpec(root.asReader(), "the assignment's run spec");
    ASSERT_FALSE(back.ok()) << "accepted a struct damaged so that " << needle << " is wrong";
    EXPECT_NE(back.status().message().find("the assignment's run spec"), std::string::npos);
    EXPECT_NE(back.status().message().find(needle), std::string::npos) << back.status().message();
  }
};

TEST_F(DamagedWireSpecTest, ZeroHeadsIsRefused) {
  ExpectRefused([](wire::RunSpec::Builder s) { s.getModel().setHeads(0); }, "model.heads");
}
TEST_F(DamagedWireSpecTest, AnEnumValueBeyondItsChoicesIsRefused) {
  ExpectRefused([](wire::RunSpec::Builder s) { s.getModel().setFamily(static_cast<wire::Family>(77)); },
                "model.family");
}
TEST_F(DamagedWireSpecTest, AnExtractLayerBeyondTheModelIsRefused) {
  ExpectRefused([](wire::RunSpec::Builder s) { s.getExtract().getLayers().set(0, 4); }, "extract.layers");
}
TEST_F(DamagedWireSpecTest, AnUnknownSiteIsRefused) {
  ExpectRefused([](wire::RunSpec::Builder s) { s.getExtract().getSites().set(0, "resid_sideways"); }, "extract.sites");
}
TEST_F(DamagedWireSpecTest, HeadsThatDoNotDivideHiddenAreRefused) {
  ExpectRefused([](wire::RunSpec::Builder s) { s.getModel().setHeads(3); }, "hidden % heads");
}
TEST_F(DamagedWireSpecTest, AnOversizedBatchIsRefused) {
  ExpectRefused([](wire::RunSpec::Builder s) { s.getExtract().setBatch(int64_t{1} << 40); }, "extract.batch");
}

TEST_F(RunSpecWireTest, ARunRecordWithoutTheStructFallsBackToItsToml) {
  RunSpec spec = Parsed(std::string("name = \"t\"\n") + kModel +
                        "[data]\npath = \"corpus.txt\"\n[train]\nsteps = 5\nglobal_batch = 4\n");
  capnp::MallocMessageBuilder message;
  auto record = message.initRoot<RunRecord>();
  record.setSpecToml(RunSpecToToml(spec));
  auto from_toml = ReadRunRecordSpec(record.asReader());
  ASSERT_TRUE(from_toml.ok()) << from_toml.status().ToString();
  EXPECT_EQ(*from_toml, spec);
  spec.train.steps = 6;  // the struct wins where both are there
  WriteRunSpec(spec, record.initSpec());
  auto from_struct = ReadRunRecordSpec(record.asReader());
  ASSERT_TRUE(from_struct.ok()) << from_struct.status().ToString();
  EXPECT_EQ(from_struct->train.steps, 6);
}

}  // namespace
}  // namespace strata
