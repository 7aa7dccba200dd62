// Parity with Hugging Face transformers (ctest label gpu: the GPU node's python3 has
// transformers; elsewhere the test skips). A model built and exported by Strata must load in
// transformers and produce the same logits for the same tokens, in fp32.
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>

#include "client/export.h"
#include "schema/messages.capnp.h"
#include "spec/hf_config.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"
#include "worker/nn/causal_lm.h"
#include "worker/nn/hf_format.h"
#include "worker/train/trainer.h"

namespace strata::worker {
namespace {

class HfParityTest : public ::testing::TestWithParam<std::string> {};

// DIR/expected.safetensors: int64 tokens [b, t] and our fp32 logits for them (hf_parity.py reads it).
Status WriteExpected(const std::string& dir, const torch::Tensor& tokens, const torch::Tensor& logits) {
  return storage::WriteSafetensors(
      dir + "/expected.safetensors",
      {{"tokens",
        {storage::DType::kI64,
         tokens.sizes().vec(),
         {static_cast<const uint8_t*>(tokens.data_ptr()), static_cast<size_t>(tokens.numel()) * 8}}},
       {"logits",
        {storage::DType::kF32,
         logits.sizes().vec(),
         {static_cast<const uint8_t*>(logits.data_ptr()), static_cast<size_t>(logits.numel()) * 4}}}});
}

TEST_P(HfParityTest, LogitsMatchTransformers) {
  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with transformers and safetensors not available";
  }
  char tmpl[] = "/tmp/strata-parity-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ModelSpec spec;
  spec.family = ParseChoice<Family>(GetParam()).value();
  spec.layers = 3;
  spec.hidden = 128;
  spec.heads = GetParam() == "llama" ? 8 : 4;
  spec.kv_heads = GetParam() == "llama" ? 2 : 0;
  spec.vocab = 512;
  spec.sequence = 64;
  spec.ffn = GetParam() == "llama" ? 352 : 512;
  spec.tie_embeddings = GetParam() == "gpt2";
  ASSERT_TRUE(ValidateModelSpec(spec, "").ok());
  torch::manual_seed(5);
  auto model = CreateCausalLm(spec, 5);
  {
    torch::NoGradGuard no_grad;  // non-trivial norms, so a swapped weight/bias would show
    for (auto& p : model->named_parameters()) {
      if (p.value().dim() == 1) p.value().uniform_(0.5, 1.5);
    }
  }
  ASSERT_TRUE(ExportHuggingFace(model->named_parameters(), spec, dir).ok());
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, spec.vocab, {2, spec.sequence}, torch::kLong);
  auto logits = model->Logits(tokens).contiguous();
  ASSERT_TRUE(WriteExpected(dir, tokens, logits).ok());
  const std::string script = std::string(STRATA_SOURCE_DIR) + "/tests/gpu/hf_parity.py";
  EXPECT_EQ(std::system(("python3 " + script + " " + dir).c_str()), 0) << "see the printed max difference";
}

// Weights made by transformers from a config (save_pretrained, several files) -> loaded by Strata
// (the model from config.json alone) -> trained 20 steps in bf16 on the GPU -> checkpoint pieces
// -> `strata export`'s assembly -> transformers loads the directory, and its fp32 logits equal
// what Strata computes from the same exported weights in fp32, within 1e-5 relative.
class ExportParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportParityTest, TrainedFromSavePretrainedExportsWhatItComputes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with transformers and safetensors not available";
  }
  char tmpl[] = "/tmp/strata-export-parity-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string gpu_tests = std::string(STRATA_SOURCE_DIR) + "/tests/gpu";
  ASSERT_EQ(std::system(
                ("python3 " + gpu_tests + "/family_reference.py make " + dir + "/hf " + GetParam() + " 2 64").c_str()),
            0);
  {
    std::ofstream corpus(dir + "/corpus.txt");
    for (int i = 0; i < 200; ++i) corpus << "the quick brown fox jumps over the lazy dog. ";
  }
  TaskContext context;
  context.run_id = "parity";
  // The model from its config.json alone, as a spec holding only init_from gets it.
  context.spec.model.init_from = dir + "/hf";
  ASSERT_TRUE(ResolveHuggingFaceConfig(dir + "/hf", {"init_from", "sequence"}, &context.spec.model).ok());
  context.spec.data.path = dir + "/corpus.txt";
  context.spec.train.global_batch = 8;
  context.spec.train.lr = 3e-3;
  context.spec.train.precision = Precision::kBf16;
  auto store = storage::ShardStore::Open(dir + "/store");
  ASSERT_TRUE(store.ok());
  auto comm = CreateSoloCommunicator();
  context.communicator = comm.get();
  context.store = store->get();
  auto data = TokenData::Load(context.spec.data, context.spec.model.vocab);
  ASSERT_TRUE(data.ok());
  auto made = Trainer::Create(context, std::move(data).value(), torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Trainer& trainer = **made;
  for (int s = 0; s < 20; ++s) ASSERT_TRUE(trainer.Step().ok());
  auto saved = trainer.SaveCheckpointShard();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();

  capnp::MallocMessageBuilder message;
  auto manifest = message.initRoot<CheckpointManifest>();
  manifest.setRunId("parity");
  manifest.setStep(20);
  auto shard = manifest.initShards(1)[0];
  shard.setStorePath(dir + "/store");
  auto entries = shard.initTensors(saved->tensors.size());
  for (size_t i = 0; i < saved->tensors.size(); ++i) {
    entries[i].setName(saved->tensors[i].name);
    entries[i].setChecksum(saved->tensors[i].checksum);
  }
  client::ExportOptions options;
  options.max_shard_bytes = 100 << 10;  // several files and an index, as a large model gets
  auto exported = client::ExportCheckpoint(context.spec, manifest.asReader(), dir + "/exported", options);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_GT(exported->files, 1u);

  ModelSpec reloaded = context.spec.model;
  reloaded.init_from = dir + "/exported";
  auto model = BuildCausalLm(reloaded, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  (*model)->to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  auto tokens = torch::randint(0, context.spec.model.vocab, {2, 64}, torch::kLong);
  auto logits = (*model)->Logits(tokens.to(torch::kCUDA)).to(torch::kCPU).contiguous();
  ASSERT_TRUE(WriteExpected(dir + "/exported", tokens, logits).ok());
  EXPECT_EQ(std::system(("python3 " + gpu_tests + "/hf_parity.py " + dir + "/exported 1e-5").c_str()), 0)
      << "see the printed difference";
}

INSTANTIATE_TEST_SUITE_P(Families, ExportParityTest,
                         ::testing::Values("llama3", "llama_tied", "mistral", "qwen2", "qwen3", "olmo2", "gemma",
                                           "pythia", "gpt2"));

INSTANTIATE_TEST_SUITE_P(Families, HfParityTest, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace strata::worker
