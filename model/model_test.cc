// The families' parameter tables, Hugging Face configs and checkpoints as published: tests write
// tiny models (config.json + one or several safetensors files with an index) themselves.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/hf_checkpoint.h"
#include "model/parameters.h"
#include "spec/hf_config.h"
#include "storage/safetensors.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A tiny config.json of each family, with the variants the issue names.
json TinyConfig(const std::string& family) {
  if (family == "gpt2") {
    return {{"model_type", "gpt2"},
            {"n_layer", 2},
            {"n_embd", 32},
            {"n_head", 4},
            {"n_inner", nullptr},
            {"vocab_size", 300},
            {"n_positions", 64},
            {"layer_norm_epsilon", 1e-5},
            {"activation_function", "gelu_new"},
            {"resid_pdrop", 0.1}};
  }
  if (family == "gpt_neox") {
    return {{"model_type", "gpt_neox"},       {"num_hidden_layers", 2},   {"hidden_size", 32},
            {"num_attention_heads", 4},       {"intermediate_size", 128}, {"vocab_size", 300},
            {"max_position_embeddings", 128}, {"rotary_pct", 0.25},       {"rotary_emb_base", 10000},
            {"use_parallel_residual", true},  {"hidden_act", "gelu"},     {"layer_norm_eps", 1e-5},
            {"tie_word_embeddings", false}};
  }
  json c = {{"model_type", family},     {"num_hidden_layers", 2},         {"hidden_size", 32},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2},       {"intermediate_size", 96},
            {"vocab_size", 70000},      {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 500000.0},   {"hidden_act", "silu"},           {"tie_word_embeddings", false}};
  if (family == "llama") {
    c["head_dim"] = 16;  // != hidden / heads
    c["attention_bias"] = true;
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  }
  if (family == "qwen2") c["tie_word_embeddings"] = true;
  if (family == "qwen3") c["head_dim"] = 16;  // its own default is 128, not hidden / heads
  if (family == "olmo2") c["rms_norm_eps"] = 1e-5;
  if (family == "mistral") c["sliding_window"] = 16;
  if (family == "gemma") {
    c.erase("hidden_act");
    c["head_dim"] = 16;
    c["hidden_activation"] = "gelu_pytorch_tanh";
    c["tie_word_embeddings"] = true;
  }
  return c;
}

class TinyModelDir {
 public:
  explicit TinyModelDir(const std::string& name)
      : dir_(fs::temp_directory_path() / ("strata_model_test_" + name + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TinyModelDir() { fs::remove_all(dir_); }
  std::string path() const { return dir_.string(); }

  // config.json and the weights of `config`, in `files` safetensors files (an index when > 1), bf16.
  ModelSpec Write(const json& config, int files) {
    std::ofstream(dir_ / "config.json") << config.dump(2);
    auto spec = ModelSpecFromHuggingFaceConfig(config.dump(), "config.json");
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    ModelSpec m = *spec;
    m.sequence = 32;
    EXPECT_TRUE(ValidateModelSpec(m, "").ok());
    const std::vector<Parameter> params = Parameters(m);
    json weight_map = json::object();
    storage_.clear();
    for (const Parameter& p : params) storage_.emplace_back(static_cast<size_t>(p.numel()) * 2, uint8_t{0x3c});
    for (int f = 0; f < files; ++f) {
      std::vector<storage::NamedTensorView> views;
      const std::string name =
          files == 1 ? "model.safetensors"
                     : "model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(files) + ".safetensors";
      for (size_t i = f; i < params.size(); i += static_cast<size_t>(files)) {
        HfTensorName hf = ToHuggingFace(m, params[i].name);
        std::vector<int64_t> shape = params[i].shape;
        if (hf.transposed) std::swap(shape[0], shape[1]);
        views.push_back({hf.name, {storage::DType::kBF16, shape, storage_[i]}});
        weight_map[hf.name] = name;
      }
      EXPECT_TRUE(storage::WriteSafetensors((dir_ / name).string(), views).ok());
    }
    if (files > 1)
      std::ofstream(dir_ / "model.safetensors.index.json")
          << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
    return m;
  }

 private:
  fs::path dir_;
  std::vector<std::vector<uint8_t>> storage_;
};

class FamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyTest, ConfigFillsTheSpecAndTheMultiFileCheckpointMatchesIt) {
  TinyModelDir dir(GetParam());
  const ModelSpec written = dir.Write(TinyConfig(GetParam()), 3);
  ModelSpec m;
  m.init_from = dir.path();
  ASSERT_TRUE(ResolveHuggingFaceConfig(dir.path(), {"init_from"}, &m).ok());
  EXPECT_EQ(Name(m.family), GetParam());
  EXPECT_EQ(m.layers, 2);
  EXPECT_EQ(m.hidden, 32);
  EXPECT_EQ(m.vocab, written.vocab);
  EXPECT_EQ(m.sequence, std::min<int64_t>(m.max_positions, 2048));  // absent: min(max positions, 2048)
  EXPECT_EQ(ParameterCount(m), [&] {
    int64_t n = 0;
    for (const Parameter& p : Parameters(m)) n += p.numel();
    return n;
  }());
  EXPECT_TRUE(CheckHfCheckpoint(dir.path(), m).ok()) << CheckHfCheckpoint(dir.path(), m).ToString();
  auto checkpoint = HfCheckpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_EQ(checkpoint->file_count(), 3u);
  // The config written back keeps every source field and parses to the same model.
  std::ifstream in(dir.path() + "/config.json");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto exported = HuggingFaceConfigJson(m, source, "bfloat16");
  ASSERT_TRUE(exported.ok());
  json a = json::parse(source), b = json::parse(*exported);
  for (const auto& [key, value] : a.items()) EXPECT_EQ(b[key], value) << key;
  auto again = ModelSpecFromHuggingFaceConfig(*exported, "exported");
  ASSERT_TRUE(again.ok());
  again->sequence = m.sequence;
  again->init_from = m.init_from;
  ASSERT_TRUE(ValidateModelSpec(*again, "").ok());
  EXPECT_EQ(Parameters(*again).size(), Parameters(m).size());
  EXPECT_TRUE(again->rope_scaling == m.rope_scaling);
  auto twice = HuggingFaceConfigJson(*again, *exported, "bfloat16");
  EXPECT_EQ(json::parse(*twice), b);  // export -> init_from -> export: the same config
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest,
                         ::testing::Values("gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "gpt_neox"));

TEST(FamilyTableTest, VariantsShapeTheParameters) {
  TinyModelDir dir("variants");
  ModelSpec llama = dir.Write(TinyConfig("llama"), 1);
  EXPECT_EQ(llama.head_dim, 16);
  EXPECT_EQ(llama.rope_scaling.type, RopeScalingType::kLlama3);
  bool q_bias = false, o_bias = false, lm_head = false;
  for (const Parameter& p : Parameters(llama)) {
    if (p.name == "layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{4 * 16, 32}));
    }
    q_bias |= p.name == "layers.0.self_attn.q_proj.bias";
    o_bias |= p.name == "layers.0.self_attn.o_proj.bias";
    lm_head |= p.name == "lm_head.weight";
  }
  EXPECT_TRUE(q_bias && o_bias && lm_head);
  ModelSpec qwen = dir.Write(TinyConfig("qwen2"), 1);
  q_bias = o_bias = lm_head = false;
  for (const Parameter& p : Parameters(qwen)) {
    q_bias |= p.name == "layers.0.self_attn.q_proj.bias";
    o_bias |= p.name == "layers.0.self_attn.o_proj.bias";
    lm_head |= p.name == "lm_head.weight";
  }
  EXPECT_TRUE(q_bias);
  EXPECT_FALSE(o_bias);
  EXPECT_FALSE(lm_head);  // tied
  EXPECT_EQ(ToHuggingFace(qwen, "layers.1.mlp.up_proj.weight").name, "model.layers.1.mlp.up_proj.weight");
  // Qwen3: a q and a k norm of head_dim a layer, head_dim 128 where the config leaves it out, and
  // no sliding-window layers (refused, naming the key).
  ModelSpec qwen3 = dir.Write(TinyConfig("qwen3"), 1);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const Parameter& p : Parameters(qwen3)) shapes[p.name] = p.shape;
  EXPECT_EQ(shapes["layers.1.self_attn.q_norm.weight"], (std::vector<int64_t>{16}));
  EXPECT_EQ(shapes["layers.1.self_attn.k_norm.weight"], (std::vector<int64_t>{16}));
  EXPECT_EQ(ToHuggingFace(qwen3, "layers.1.self_attn.q_norm.weight").name, "model.layers.1.self_attn.q_norm.weight");
  json no_head_dim = TinyConfig("qwen3");
  no_head_dim.erase("head_dim");
  auto defaulted = ModelSpecFromHuggingFaceConfig(no_head_dim.dump(), "c.json");
  ASSERT_TRUE(defaulted.ok()) << defaulted.status().ToString();
  EXPECT_EQ(defaulted->head_dim, 128);
  json sliding = TinyConfig("qwen3");
  sliding["use_sliding_window"] = true;
  Status refused = ModelSpecFromHuggingFaceConfig(sliding.dump(), "c.json").status();
  EXPECT_NE(refused.message().find("\"use_sliding_window\" = true is not supported"), std::string::npos)
      << refused.ToString();
  json layer_types = TinyConfig("qwen3");
  layer_types["layer_types"] = {"full_attention", "sliding_attention"};
  refused = ModelSpecFromHuggingFaceConfig(layer_types.dump(), "c.json").status();
  EXPECT_NE(refused.message().find("\"layer_types\" lists \"sliding_attention\""), std::string::npos)
      << refused.ToString();
  layer_types["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_TRUE(ModelSpecFromHuggingFaceConfig(layer_types.dump(), "c.json").ok());
  ModelSpec neox = dir.Write(TinyConfig("gpt_neox"), 1);
  EXPECT_EQ(neox.rotary_dims(), 2);  // 8 x 0.25
  EXPECT_EQ(ToHuggingFace(neox, "embed_out.weight").name, "embed_out.weight");
  EXPECT_EQ(ToHuggingFace(neox, "layers.0.attention.dense.bias").name, "gpt_neox.layers.0.attention.dense.bias");
}

// What a user gets wrong, or a download left broken: each refused at submit, naming the problem.
TEST(HfCheckpointTest, RefusesWhatWouldLoadWrong) {
  TinyModelDir dir("refuse");
  json config = TinyConfig("llama");
  dir.Write(config, 2);
  ModelSpec m;
  m.init_from = dir.path();

  ModelSpec disagree = m;
  disagree.hidden = 64;
  Status s = ResolveHuggingFaceConfig(dir.path(), {"hidden", "init_from"}, &disagree);
  EXPECT_NE(s.message().find("model.hidden = 64"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("hidden_size = 32"), std::string::npos) << s.ToString();

  json dynamic = config;
  dynamic["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  s = ModelSpecFromHuggingFaceConfig(dynamic.dump(), "c.json").status();
  EXPECT_NE(s.message().find("rope_scaling"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("dynamic"), std::string::npos) << s.ToString();

  json unknown = config;
  unknown["model_type"] = "mixtral";
  s = ModelSpecFromHuggingFaceConfig(unknown.dump(), "c.json").status();
  EXPECT_NE(s.message().find("model_type = \"mixtral\""), std::string::npos) << s.ToString();

  ASSERT_TRUE(ResolveHuggingFaceConfig(dir.path(), {"init_from"}, &m).ok());
  // An index naming a tensor its file does not hold.
  const std::string index_path = dir.path() + "/model.safetensors.index.json";
  std::ifstream in(index_path);
  json index = json::parse(in);
  in.close();
  json bad = index;
  bad["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(index_path) << bad.dump();
  s = CheckHfCheckpoint(dir.path(), m);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not hold it"), std::string::npos) << s.ToString();
  // An index naming a tensor the model needs but no file has.
  bad = index;
  bad["weight_map"].erase("model.norm.weight");
  std::ofstream(index_path) << bad.dump();
  s = CheckHfCheckpoint(dir.path(), m);
  EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s.ToString();
  std::ofstream(index_path) << index.dump();
  ASSERT_TRUE(CheckHfCheckpoint(dir.path(), m).ok());
  // A truncated shard.
  const std::string second = dir.path() + "/model-00002-of-00002.safetensors";
  fs::resize_file(second, fs::file_size(second) - 100);
  s = CheckHfCheckpoint(dir.path(), m);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
  // A missing shard.
  fs::remove(second);
  s = CheckHfCheckpoint(dir.path(), m);
  EXPECT_NE(s.message().find("model-00002-of-00002.safetensors, which is missing"), std::string::npos) << s.ToString();
}

TEST(LoraParametersTest, AdaptersFollowTheTargetedWeightsWithPeftShapes) {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = 2;
  m.hidden = 64;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.ffn = 96;
  LoraSpec lora;
  lora.enabled = true;
  lora.rank = 4;
  lora.target_modules = {"k_proj", "down_proj"};
  const std::vector<Parameter> block = BlockLoraParameters(m, lora);
  ASSERT_EQ(block.size(), 4u);
  EXPECT_EQ(block[0].name, "self_attn.k_proj.lora_A.weight");
  EXPECT_EQ(block[0].shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(block[1].name, "self_attn.k_proj.lora_B.weight");
  EXPECT_EQ(block[1].shape, (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(block[3].name, "mlp.down_proj.lora_B.weight");
  EXPECT_EQ(block[3].shape, (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(LoraParameters(m, lora)[4].name, "layers.1.self_attn.k_proj.lora_A.weight");
  EXPECT_EQ(LoraParameterCount(m, lora), 2 * (4 * 64 + 32 * 4 + 4 * 96 + 64 * 4));
  EXPECT_EQ(LoraBaseWeight("layers.1.mlp.down_proj.lora_B.weight"), "layers.1.mlp.down_proj.weight");
  EXPECT_EQ(LoraBaseWeight("layers.1.mlp.down_proj.weight"), "");
  // PEFT's key of an adapter is base_model.model. + the Hugging Face name.
  EXPECT_EQ(ToHuggingFace(m, "layers.1.mlp.down_proj.lora_A.weight").name,
            "model.layers.1.mlp.down_proj.lora_A.weight");
  lora.enabled = false;
  EXPECT_TRUE(LoraParameters(m, lora).empty());
}

TEST(LoraParametersTest, Gpt2sCProjAdaptsBothProjectionsUnderTheirHfNames) {
  ModelSpec m;
  m.family = Family::kGpt2;
  m.layers = 1;
  m.hidden = 64;
  m.heads = 4;
  m.ffn = 256;
  LoraSpec lora;
  lora.enabled = true;
  lora.rank = 2;
  lora.target_modules = {"c_proj"};
  const std::vector<Parameter> adapters = LoraParameters(m, lora);
  ASSERT_EQ(adapters.size(), 4u);
  EXPECT_EQ(adapters[0].name, "h.0.attn_proj.lora_A.weight");
  EXPECT_EQ(adapters[2].name, "h.0.mlp_proj.lora_A.weight");
  EXPECT_EQ(adapters[2].shape, (std::vector<int64_t>{2, 256}));  // mlp_proj is [64, 256]
  const HfTensorName hf = ToHuggingFace(m, adapters[2].name);
  EXPECT_EQ(hf.name, "transformer.h.0.mlp.c_proj.lora_A.weight");
  EXPECT_FALSE(hf.transposed);  // PEFT's adapters are nn.Linear weights, Conv1D base or not
}

}  // namespace
}  // namespace strata::model
