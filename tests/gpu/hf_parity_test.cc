// Parity with Hugging Face transformers (ctest label gpu: the GPU node's python3 has
// transformers; elsewhere the test skips). A model built and exported by Strata must load in
// transformers and produce the same logits for the same tokens, in fp32.
#include <gtest/gtest.h>

#include <cstdlib>

#include <capnp/message.h>
#include <torch/torch.h>

#include <fstream>

#include "cli/export.h"
#include "schema/messages.capnp.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"
#include "worker/hf_format.h"
#include "worker/trainer.h"

namespace strata::worker {
namespace {

class HfParityTest : public ::testing::TestWithParam<std::string> {};

// DIR/expected.safetensors: int64 tokens [b, t] and our fp32 logits for them (hf_parity.py reads it).
Status WriteExpected(const std::string& dir, const torch::Tensor& tokens, const torch::Tensor& logits) {
  return storage::WriteSafetensors(
      dir + "/expected.safetensors",
      {{"tokens", {storage::DType::kI64, tokens.sizes().vec(),
                   {static_cast<const uint8_t*>(tokens.data_ptr()), static_cast<size_t>(tokens.numel()) * 8}}},
       {"logits", {storage::DType::kF32, logits.sizes().vec(),
                   {static_cast<const uint8_t*>(logits.data_ptr()), static_cast<size_t>(logits.numel()) * 4}}}});
}

TEST_P(HfParityTest, LogitsMatchTransformers) {
  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with transformers and safetensors not available";
  }
  char tmpl[] = "/tmp/strata-parity-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const ModelSpec spec = GetParam() == "llama" ? ModelSpec{"llama", 3, 128, 8, 512, 64, 2, 352, 10000.0, 1e-6, ""}
                                               : ModelSpec{"gpt2", 3, 128, 4, 512, 64, 4, 512, 10000.0, 1e-5, ""};
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
  ASSERT_TRUE(WriteExpected(dir, tokens, logits).ok());
  const std::string script = std::string(STRATA_SOURCE_DIR) + "/tests/gpu/hf_parity.py";
  EXPECT_EQ(std::system(("python3 " + script + " " + dir).c_str()), 0) << "see the printed max difference";
}

// Weights made by transformers from a config (save_pretrained) -> loaded by Strata (init_from) ->
// trained 5 steps in bf16 on the GPU -> checkpoint pieces -> `strata export`'s assembly ->
// transformers loads the directory, and its logits equal what Strata's trained model computes,
// within bf16 tolerance.
TEST_P(HfParityTest, TrainedFromSavePretrainedExportsWhatItComputes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with transformers and safetensors not available";
  }
  char tmpl[] = "/tmp/strata-export-parity-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const bool llama = GetParam() == "llama";
  const std::string make =
      llama ? "c = t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, "
              "intermediate_size=128, vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)"
            : "c = t.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)";
  ASSERT_EQ(std::system(("python3 -c \"import torch, transformers as t; torch.manual_seed(3); " + make +
                         "; t.AutoModelForCausalLM.from_config(c).save_pretrained('" + dir + "/hf')\"")
                            .c_str()),
            0);
  {
    std::ofstream corpus(dir + "/corpus.txt");
    for (int i = 0; i < 200; ++i) corpus << "the quick brown fox jumps over the lazy dog. ";
  }
  TaskContext context;
  context.run_id = "parity";
  context.spec.model = llama ? ModelSpec{"llama", 2, 64, 4, 256, 64, 2, 128, 10000.0, 1e-6, ""}
                             : ModelSpec{"gpt2", 2, 64, 4, 256, 64, 4, 256, 10000.0, 1e-5, ""};
  context.spec.model.init_from = dir + "/hf";
  context.spec.data.path = dir + "/corpus.txt";
  context.spec.train.global_batch = 8;
  context.spec.train.lr = 3e-3;
  context.spec.train.precision = "bf16";
  auto store = storage::ShardStore::Open(dir + "/store");
  ASSERT_TRUE(store.ok());
  auto comm = CreateSoloCommunicator();
  context.communicator = comm.get();
  context.store = store->get();
  auto data = TokenData::Load(context.spec.data, 256);
  ASSERT_TRUE(data.ok());
  Trainer trainer(context, std::move(data).value(), torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(trainer.init_status().ok()) << trainer.init_status().ToString();
  for (int s = 0; s < 5; ++s) ASSERT_TRUE(trainer.Step().ok());
  auto saved = trainer.SaveCheckpointShard();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();

  capnp::MallocMessageBuilder message;
  auto manifest = message.initRoot<CheckpointManifest>();
  manifest.setRunId("parity");
  manifest.setStep(5);
  auto shard = manifest.initShards(1)[0];
  shard.setStorePath(dir + "/store");
  auto entries = shard.initTensors(saved->tensors.size());
  for (size_t i = 0; i < saved->tensors.size(); ++i) {
    entries[i].setName(saved->tensors[i].name);
    entries[i].setChecksum(saved->tensors[i].checksum);
  }
  auto exported = cli::ExportCheckpoint(RunSpecToToml(context.spec), manifest.asReader(), dir + "/exported");
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();

  torch::manual_seed(9);
  auto tokens = torch::randint(0, 256, {2, 64}, torch::kLong);
  auto logits = trainer.Logits(tokens);
  ASSERT_TRUE(WriteExpected(dir + "/exported", tokens, logits).ok());
  const std::string script = std::string(STRATA_SOURCE_DIR) + "/tests/gpu/hf_parity.py";
  EXPECT_EQ(std::system(("python3 " + script + " " + dir + "/exported 2e-2").c_str()), 0) << "see the printed difference";
}

INSTANTIATE_TEST_SUITE_P(Families, HfParityTest, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace strata::worker
