// Parity with Hugging Face transformers (ctest label gpu: the GPU node's python3 has
// transformers; elsewhere the test skips). A model built and exported by Strata must load in
// transformers and produce the same logits for the same tokens, in fp32.
#include <gtest/gtest.h>

#include <cstdlib>

#include "storage/safetensors.h"
#include "worker/hf_format.h"

namespace strata::worker {
namespace {

class HfParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParityTest, LogitsMatchTransformers) {
  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with transformers and safetensors not available";
  }
  char tmpl[] = "/tmp/strata-parity-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const ModelSpec spec = GetParam() == "llama" ? ModelSpec{"llama", 3, 128, 8, 512, 64, 2, 352, 10000.0, 1e-6}
                                               : ModelSpec{"gpt2", 3, 128, 4, 512, 64, 4, 512, 10000.0, 1e-5};
  torch::manual_seed(5);
  auto model = CreateCausalLm(spec);
  {
    torch::NoGradGuard no_grad;  // non-trivial norms, so a swapped weight/bias would show
    for (auto& p : model->named_parameters()) {
      if (p.value().dim() == 1) p.value().uniform_(0.5, 1.5);
    }
  }
  ASSERT_TRUE(ExportHuggingFace(*model, spec, dir).ok());
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, spec.vocab, {2, spec.sequence}, torch::kLong);
  auto logits = model->Logits(tokens).contiguous();
  ASSERT_TRUE(storage::WriteSafetensors(
                  dir + "/expected.safetensors",
                  {{"tokens", {storage::DType::kI64, tokens.sizes().vec(),
                               {static_cast<const uint8_t*>(tokens.data_ptr()), static_cast<size_t>(tokens.numel()) * 8}}},
                   {"logits", {storage::DType::kF32, logits.sizes().vec(),
                               {static_cast<const uint8_t*>(logits.data_ptr()), static_cast<size_t>(logits.numel()) * 4}}}})
                  .ok());
  const std::string script = std::string(STRATA_SOURCE_DIR) + "/tests/gpu/hf_parity.py";
  EXPECT_EQ(std::system(("python3 " + script + " " + dir).c_str()), 0) << "see the printed max difference";
}

INSTANTIATE_TEST_SUITE_P(Families, HfParityTest, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace strata::worker
