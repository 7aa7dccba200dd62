// Models as Hugging Face publishes them, through the real binary on a local cluster of 2 CPU
// workers. For every family: a tiny model written as config.json + two safetensors files with an
// index (bf16) trains and is captured from a spec whose [model] holds only init_from; a model
// exported by `strata export` and loaded back with init_from exports to the same bytes; and what
// would load wrong is refused at submit with exit 2, naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "model/parameters.h"
#include "spec/hf_config.h"
#include "storage/safetensors.h"
#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using testing::CommandResult;

json TinyConfig(const std::string& family) {
  if (family == "gpt2") {
    return {{"model_type", "gpt2"}, {"n_layer", 2},      {"n_embd", 32},
            {"n_head", 4},          {"vocab_size", 300}, {"n_positions", 64}};
  }
  if (family == "gpt_neox") {
    return {{"model_type", "gpt_neox"},      {"num_hidden_layers", 2},  {"hidden_size", 32},
            {"num_attention_heads", 4},      {"intermediate_size", 64}, {"vocab_size", 300},
            {"max_position_embeddings", 64}, {"rotary_pct", 0.25}};
  }
  json c = {{"model_type", family},     {"num_hidden_layers", 2},
            {"hidden_size", 32},        {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"intermediate_size", 64},
            {"vocab_size", 300},        {"max_position_embeddings", 64},
            {"rope_theta", 10000.0},    {"tie_word_embeddings", family == "qwen2" || family == "gemma"},
            {"bos_token_id", 1},        {"eos_token_id", 2}};
  if (family == "llama") {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 16}};
    c["head_dim"] = 16;
  }
  if (family == "mistral") c["sliding_window"] = 8;
  if (family == "gemma") c["head_dim"] = 8;
  if (family == "qwen3") c["head_dim"] = 16;
  return c;
}

// config.json and bf16 weights (N(0, 0.02), norms 1) in two files with an index; `written`, when
// given, is the config.json written instead (one Strata refuses, over valid weights).
void WriteModel(const std::string& dir, const json& config, const json& written = nullptr) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << (written.is_null() ? config : written).dump(2);
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": {\"type\": \"BPE\"}}";  // carried along by export
  auto spec = ModelSpecFromHuggingFaceConfig(config.dump(), "config.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ModelSpec m = *spec;
  ASSERT_TRUE(ValidateModelSpec(m, "").ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<storage::NamedTensorView> files[2];
  json weight_map = json::object();
  const auto params = model::Parameters(m);
  bytes.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const model::Parameter& p = params[i];
    const bool norm = p.shape.size() == 1 && p.name.find("bias") == std::string::npos;
    std::vector<uint8_t> b(static_cast<size_t>(p.numel()) * 2);
    for (int64_t k = 0; k < p.numel(); ++k) {
      float v = norm ? (m.family == Family::kGemma ? 0.0f : 1.0f) : normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&b[static_cast<size_t>(k) * 2], &half, 2);
    }
    bytes.push_back(std::move(b));
    model::HfTensorName hf = model::ToHuggingFace(m, p.name);
    std::vector<int64_t> shape = p.shape;
    if (hf.transposed) std::swap(shape[0], shape[1]);
    const int f = i < params.size() / 2 ? 0 : 1;
    files[f].push_back({hf.name, {storage::DType::kBF16, shape, bytes.back()}});
    weight_map[hf.name] = "model-0000" + std::to_string(f + 1) + "-of-00002.safetensors";
  }
  for (int f = 0; f < 2; ++f) {
    ASSERT_TRUE(
        storage::WriteSafetensors(dir + "/model-0000" + std::to_string(f + 1) + "-of-00002.safetensors", files[f])
            .ok());
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
}

class ModelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-models-it-XXXXXX");
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
  }
  static void TearDownTestSuite() {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }
  static CommandResult Strata(const std::string& args) { return testing::RunStrata(args, dir_); }

  // A spec whose [model] is init_from (and sequence) only.
  static std::string Spec(const std::string& name, const std::string& init_from, const std::string& body,
                          const std::string& model_extra = "") {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << "name = \"" << name << "\"\n"
                        << body.substr(0, body.find('[')) << "[model]\ninit_from = \"" << init_from
                        << "\"\nsequence = 32\n"
                        << model_extra << "[data]\npath = \"corpus.txt\"\n"
                        << body.substr(body.find('['));
    return path;
  }
  static std::string RunId(const CommandResult& r) { return r.out.substr(0, r.out.find('\n')); }

  static std::string dir_;
};
std::string ModelsTest::dir_;

const char* kTrain = "[train]\nsteps = 3\nglobal_batch = 4\nlr = 0.001\nseed = 3\n[parallel]\ndp = 2\n";
const char* kExtract =
    "kind = \"extract\"\n[extract]\nlayers = [1]\nsites = [\"resid_post\", \"mlp_out\"]\ntokens = 256\nbatch = 4\n";

TEST_F(ModelsTest, EveryFamilyTrainsAndIsCapturedFromInitFromAlone) {
  for (const std::string family : {"gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "gpt_neox"}) {
    SCOPED_TRACE(family);
    const std::string model = dir_ + "/" + family;
    WriteModel(model, TinyConfig(family));
    auto train = Strata("submit " + Spec(family + "-train", model, kTrain) + " --follow");
    ASSERT_EQ(train.rc, 0) << train.out << train.err;
    json status = testing::RunStrataJson("status " + RunId(train), dir_);
    EXPECT_EQ(status["state"], "finished");
    EXPECT_EQ(status["losses"].size(), 3u);
    // The log-loss of a near-uniform model over 300 ids: the weights were read, not random.
    EXPECT_NEAR(status["losses"][0].get<double>(), std::log(300.0), 0.5);
    auto extract = Strata("submit " + Spec(family + "-extract", model, kExtract) + " --follow");
    ASSERT_EQ(extract.rc, 0) << extract.out << extract.err;
    auto get =
        Strata("activations get " + RunId(extract) + " --layer 1 --site mlp_out --out " + dir_ + "/" + family + ".npy");
    EXPECT_EQ(get.rc, 0) << get.err;
    EXPECT_GT(fs::file_size(dir_ + "/" + family + ".npy"), 256u * 32u * 4u);
  }
}

// export -> init_from -> export gives the same bytes. The runs step with lr = 1e-30 (the run spec
// refuses 0): every update is far below fp32's resolution of these weights, so they stay as read.
TEST_F(ModelsTest, ExportLoadsBackAndExportsTheSameBytes) {
  for (const std::string family : {"llama", "gpt2", "gpt_neox"}) {
    SCOPED_TRACE(family);
    const std::string model = dir_ + "/rt-" + family;
    WriteModel(model, TinyConfig(family));
    const std::string still =
        "[train]\nsteps = 1\nglobal_batch = 4\nlr = 1e-30\ncheckpoint_every = 1\n[parallel]\ndp = 1\n";
    auto first = Strata("submit " + Spec("rt1-" + family, model, still) + " --follow");
    ASSERT_EQ(first.rc, 0) << first.err;
    const std::string a = dir_ + "/export-a-" + family, b = dir_ + "/export-b-" + family;
    auto export_a = Strata("export " + RunId(first) + " --out " + a + " --max-shard-size 8KiB");
    ASSERT_EQ(export_a.rc, 0) << export_a.err;
    EXPECT_NE(export_a.out.find("files"), std::string::npos) << export_a.out;  // sharded: several files
    EXPECT_TRUE(fs::exists(a + "/model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(a + "/tokenizer.json"));  // carried from init_from
    json source = json::parse(testing::ReadFile(model + "/config.json")),
         exported = json::parse(testing::ReadFile(a + "/config.json"));
    for (const auto& [key, value] : source.items()) EXPECT_EQ(exported[key], value) << key;  // every source field kept
    auto second = Strata("submit " + Spec("rt2-" + family, a, still) + " --follow");
    ASSERT_EQ(second.rc, 0) << second.err;
    auto export_b = Strata("export " + RunId(second) + " --out " + b + " --max-shard-size 8KiB");
    ASSERT_EQ(export_b.rc, 0) << export_b.err;
    EXPECT_EQ(json::parse(testing::ReadFile(b + "/config.json")), exported);
    size_t files = 0;
    for (const auto& entry : fs::directory_iterator(a)) {
      const std::string name = entry.path().filename().string();
      if (name.size() < 12 || name.compare(name.size() - 12, 12, ".safetensors") != 0) continue;
      ++files;
      const std::string x = testing::ReadFile(entry.path().string()), y = testing::ReadFile(b + "/" + name);
      // The same tensors in the same bytes; only the run id in the header's metadata differs.
      auto body = [](const std::string& s) {
        return s.substr(8 + static_cast<size_t>(*reinterpret_cast<const uint64_t*>(s.data())));
      };
      EXPECT_EQ(body(x), body(y)) << name;
    }
    EXPECT_GT(files, 2u);
    EXPECT_EQ(testing::ReadFile(a + "/model.safetensors.index.json"),
              testing::ReadFile(b + "/model.safetensors.index.json"));
    if (family != "llama") continue;
    // An export that fails part-way (its second file cannot be written: a directory holds the
    // name export gives it until the count is known) leaves none of its weight files behind.
    const std::string c = dir_ + "/export-c";
    fs::create_directories(c + "/.export-2.safetensors.partial/blocker");
    auto export_c = Strata("export " + RunId(first) + " --out " + c + " --max-shard-size 8KiB --force");
    EXPECT_NE(export_c.rc, 0) << export_c.out;
    EXPECT_NE(export_c.err.find(".export-2.safetensors.partial"), std::string::npos) << export_c.err;
    for (const auto& entry : fs::directory_iterator(c)) {
      const std::string name = entry.path().filename().string();
      EXPECT_TRUE(name == ".export-2.safetensors.partial") << "left behind by the failed export: " << name;
    }
  }
}

// A byte-level BPE tokenizer.json (GPT-2's pre-tokenizer) over printable ASCII, the space and the
// newline, with a few merges: ids below 300.
json AsciiTokenizer() {
  auto byte_level = [](const std::string& text) {
    std::string out;
    for (const char c : text) out += c == ' ' ? "\xC4\xA0" : c == '\n' ? "\xC4\x8A" : std::string(1, c);
    return out;
  };
  json vocab = json::object();
  for (int b = 33; b < 127; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  vocab[byte_level(" ")] = 32;
  vocab[byte_level("\n")] = 10;
  json merges = json::array();
  int next = 256;
  for (const auto& [a, b] :
       std::vector<std::pair<std::string, std::string>>{{"t", "h"}, {"th", "e"}, {" ", "the"}, {"o", "n"}}) {
    merges.push_back(byte_level(a) + " " + byte_level(b));
    vocab[byte_level(a + b)] = next++;
  }
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

// data.format = "text": tokenized once with the model's own tokenizer, the cached ids reused.
TEST_F(ModelsTest, TextDataIsTokenizedOnceWithTheModelsTokenizer) {
  const std::string model = dir_ + "/text-model";
  WriteModel(model, TinyConfig("llama"));
  std::ofstream(model + "/tokenizer.json") << AsciiTokenizer().dump();
  {
    std::ofstream text(dir_ + "/story.txt");
    for (int i = 0; i < 300; ++i) text << "the fox ran on the hill and the dog sat on the mat " << i << "\n";
  }
  const std::string body = std::string("[train]\nsteps = 2\nglobal_batch = 4\nlr = 0.001\n[parallel]\ndp = 1\n");
  const std::string spec = dir_ + "/text.toml";
  std::ofstream(spec) << "name = \"text\"\n[model]\ninit_from = \"" << model << "\"\nsequence = 32\n"
                      << "[data]\npath = \"story.txt\"\nformat = \"text\"\n"
                      << body;
  auto first = Strata("submit " + spec + " --follow");
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  EXPECT_NE(first.err.find("tokenizing " + dir_ + "/story.txt"), std::string::npos) << first.err;
  json status = testing::RunStrataJson("status " + RunId(first), dir_);
  EXPECT_EQ(status["state"], "finished");
  int cached = 0;
  for (const auto& entry : fs::directory_iterator(dir_))
    cached += entry.path().filename().string().rfind("story.txt.tok-", 0) == 0;
  EXPECT_EQ(cached, 1);
  auto second = Strata("submit " + spec + " --follow");
  ASSERT_EQ(second.rc, 0) << second.err;
  EXPECT_NE(second.err.find("tokenized before"), std::string::npos) << second.err;
  EXPECT_EQ(testing::RunStrataJson("status " + RunId(second), dir_)["losses"], status["losses"]);  // the same ids
  // A tokenizer whose ids do not fit the model's vocabulary.
  json big = AsciiTokenizer();
  big["added_tokens"].push_back({{"id", 5000}, {"content", "<|big|>"}, {"special", true}, {"normalized", false}});
  fs::create_directories(dir_ + "/big-tokenizer");
  std::ofstream(dir_ + "/big-tokenizer/tokenizer.json") << big.dump();
  std::ofstream(spec) << "name = \"text\"\n[model]\ninit_from = \"" << model << "\"\nsequence = 32\n"
                      << "[data]\npath = \"story.txt\"\nformat = \"text\"\ntokenizer = \"big-tokenizer\"\n"
                      << body;
  auto refused = Strata("submit " + spec);
  EXPECT_EQ(refused.rc, 2) << refused.err;
  EXPECT_NE(refused.err.find("5001 ids but model.vocab = 300"), std::string::npos) << refused.err;
}

TEST_F(ModelsTest, WhatWouldLoadWrongIsRefusedAtSubmitNamingIt) {
  const std::string model = dir_ + "/bad";
  json config = TinyConfig("llama");
  WriteModel(model, config);
  auto expect_refused = [&](const std::string& name, const std::string& model_dir, const std::string& extra,
                            const std::string& needle) {
    auto r = Strata("submit " + Spec(name, model_dir, kTrain, extra));
    EXPECT_EQ(r.rc, 2) << name << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << name << ": " << r.err;
  };
  expect_refused("disagree", model, "hidden = 64\n", "model.hidden = 64 but");
  {
    const std::string path = dir_ + "/long.toml";
    std::ofstream(path) << "name = \"long\"\n[model]\ninit_from = \"" << model
                        << "\"\nsequence = 128\n[data]\npath = \"corpus.txt\"\n"
                        << kTrain;
    auto r = Strata("submit " + path);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.err.find("max_positions = 64"), std::string::npos) << r.err;
  }
  const std::string dynamic = dir_ + "/dynamic";
  json d = config;
  d["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  WriteModel(dynamic, config, d);
  expect_refused("dynamic", dynamic, "", "rope_type \"dynamic\"");
  const std::string unknown = dir_ + "/unknown";
  fs::create_directories(unknown);
  json u = config;
  u["model_type"] = "mixtral";
  std::ofstream(unknown + "/config.json") << u.dump();
  expect_refused("unknown", unknown, "", "model_type = \"mixtral\"");
  // An index naming a tensor its file lacks.
  const std::string index_path = model + "/model.safetensors.index.json";
  const std::string index_text = testing::ReadFile(index_path);
  json index = json::parse(index_text);
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(index_path) << index.dump();
  expect_refused("index", model, "", "model.norm.weight");
  std::ofstream(index_path) << index_text;
  // A truncated shard, then a missing one.
  const std::string second = model + "/model-00002-of-00002.safetensors";
  fs::resize_file(second, fs::file_size(second) - 64);
  expect_refused("truncated", model, "", "truncated");
  fs::remove(second);
  expect_refused("missing", model, "", "model-00002-of-00002.safetensors, which is missing");
}

}  // namespace
}  // namespace strata
