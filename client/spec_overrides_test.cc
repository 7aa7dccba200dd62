// `--set key=value` (spec_overrides.h): each override lands typed like its key, and the spec
// the parser then reads holds it.
#include "client/spec_overrides.h"

#include <gtest/gtest.h>

#include "spec/run_spec.h"

namespace strata::client {
namespace {

const char* kSpec =
    "name = \"base\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\nsequence = 32\n[data]\npath = \"corpus.txt\"\n"
    "[train]\nsteps = 5\nglobal_batch = 8\nlr = 0.003\n";

RunSpec Parsed(const std::string& text) {
  auto spec = ParseSubmittedRunSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << text;
  return spec.ok() ? *spec : RunSpec{};
}

TEST(SpecOverrides, EachValueTakesItsKeysTypeAndTheLastOneWins) {
  auto text = ApplySpecOverrides(
      kSpec, {"train.steps=10", "train.lr=1e-4", "name=varied", "train.steps=12", "model.init_from=/models/llama",
              "parallel.dp=auto", "parallel.pp=1", "train.warmup_steps=2", "train.lr_schedule=cosine", "train.lr=1"});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const RunSpec spec = Parsed(*text);
  EXPECT_EQ(spec.name, "varied");
  EXPECT_EQ(spec.train.steps, 12);
  EXPECT_DOUBLE_EQ(spec.train.lr, 1.0);  // an integer given a float key is the number
  EXPECT_EQ(spec.model.init_from, "/models/llama");
  EXPECT_TRUE(spec.parallel.automatic.count("dp"));
  EXPECT_EQ(spec.parallel.pp, 1);
  EXPECT_EQ(spec.train.warmup_steps, 2);
  EXPECT_EQ(spec.train.lr_schedule, LrSchedule::kCosine);
  EXPECT_EQ(spec.model.layers, 2);  // untouched keys keep their values
}

TEST(SpecOverrides, ArraysAndTablesAsTomlWritesThem) {
  auto text = ApplySpecOverrides(kSpec, {"lora.target_modules=[\"c_attn\", \"c_fc\"]", "lora.rank=4", "lora.alpha=8"});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const RunSpec spec = Parsed(*text);
  ASSERT_TRUE(spec.lora.enabled);
  EXPECT_EQ(spec.lora.target_modules, (std::vector<std::string>{"c_attn", "c_fc"}));
  EXPECT_EQ(spec.lora.rank, 4);
}

TEST(SpecOverrides, AWrongTypeOrFormIsRefusedNamingTheOverride) {
  auto ten = ApplySpecOverrides(kSpec, {"train.steps=ten"});
  ASSERT_FALSE(ten.ok());
  EXPECT_NE(ten.status().message().find("--set train.steps=ten: train.steps is an integer in the spec"),
            std::string::npos)
      << ten.status().message();
  auto form = ApplySpecOverrides(kSpec, {"train.steps"});
  ASSERT_FALSE(form.ok());
  EXPECT_NE(form.status().message().find("expected KEY=VALUE"), std::string::npos) << form.status().message();
  auto into_value = ApplySpecOverrides(kSpec, {"name.first=x"});
  ASSERT_FALSE(into_value.ok());
  EXPECT_NE(into_value.status().message().find("'name' in the spec is a string"), std::string::npos)
      << into_value.status().message();
  // An unknown key reaches the parser, which names it.
  auto unknown = ApplySpecOverrides(kSpec, {"train.stepz=3"});
  ASSERT_TRUE(unknown.ok());
  auto parsed = ParseSubmittedRunSpec(*unknown);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("unknown key 'train.stepz'"), std::string::npos)
      << parsed.status().message();
}

}  // namespace
}  // namespace strata::client
