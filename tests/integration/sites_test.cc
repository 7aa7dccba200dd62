// Every capture site of every family, and patch runs, end to end: `strata up` starts a
// coordinator and 2 CPU workers, extract runs capture every site (whole-model and layer-by-layer
// execution), and what the workers' stores hold equals a direct forward pass in this process
// (worker/extract/direct_forward.h: same seed, same batches) bit for bit. Patch runs (zero ablation)
// store a per-row loss equal to an independent computation of the same ablation. Rows are read
// from the stores themselves (read-only opens beside the running workers), so the check covers
// each record's stored shape and dtype too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "spec/run_spec.h"
#include "storage/shard_store.h"
#include "tests/integration/harness.h"
#include "worker/extract/direct_forward.h"

namespace strata {
namespace {

using json = nlohmann::json;
using testing::CommandResult;

class SitesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-sites-it-XXXXXX");
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
  }
  static void TearDownTestSuite() {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) (void)std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  static CommandResult Strata(const std::string& args) { return testing::RunStrata(args, dir_); }

  // Submits `body` (written as NAME.toml), waits for it to finish; returns the run id and the
  // parsed spec.
  static std::pair<std::string, RunSpec> Run(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    auto r = Strata("submit " + path + " --follow");
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    auto spec = ParseRunSpec(body, dir_, true);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    return {r.out.substr(0, r.out.find('\n')), spec.ok() ? *spec : RunSpec{}};
  }

  // The run's stored rows of (layer, site), every chunk of both workers' stores in row order,
  // each record checked for shape [row_count, row shape...] and dtype.
  static std::string Stored(const RunSpec& spec, const std::string& run, int64_t layer, const std::string& site) {
    std::map<uint64_t, std::string> by_row;
    std::vector<int64_t> row_shape = ExtractSiteRowShape(spec, site);
    const storage::DType dtype = ExtractSiteHoldsIds(site)                  ? storage::DType::kI32
                                 : spec.extract.dtype == StoredDType::kFp32 ? storage::DType::kF32
                                 : spec.extract.dtype == StoredDType::kBf16 ? storage::DType::kBF16
                                                                            : storage::DType::kF16;
    for (const std::string w : {"worker-0", "worker-1"}) {
      storage::StoreOptions options;
      options.read_only = true;
      options.create_if_missing = false;
      auto store = storage::ShardStore::Open(dir_ + "/state/workers/" + w, options);
      EXPECT_TRUE(store.ok()) << store.status().ToString();
      if (!store.ok()) return "";
      auto chunks = (*store)->ListActivationChunks(run);
      EXPECT_TRUE(chunks.ok());
      if (!chunks.ok()) return "";
      for (const auto& c : *chunks) {
        auto record = (*store)->ReadActivation(run, layer, site, c.row_begin);
        EXPECT_TRUE(record.ok()) << "layer " << layer << " " << site << ": " << record.status().ToString();
        if (!record.ok()) return "";
        std::vector<int64_t> shape = {static_cast<int64_t>(c.row_count)};
        shape.insert(shape.end(), row_shape.begin(), row_shape.end());
        EXPECT_EQ(record->shape, shape) << "layer " << layer << " " << site;
        EXPECT_EQ(record->dtype, dtype) << "layer " << layer << " " << site;
        by_row[c.row_begin].assign(record->bytes.begin(), record->bytes.end());
      }
    }
    std::string all;
    for (auto& [row, bytes] : by_row) all += bytes;
    return all;
  }

  static std::string Reference(const RunSpec& spec, int64_t layer, const std::string& site) {
    auto rows = worker::DirectForwardActivations(spec, layer, site);
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    return rows.ok() ? *rows : std::string();
  }

  static std::string dir_;
};
std::string SitesTest::dir_;

// A 2-layer model of `family` drawn from train.seed; shapes chosen so heads, kv_heads, head_dim
// and ffn all differ where the family allows (a row shape mixed up with another shows).
std::string ModelTable(const std::string& family) {
  std::string m =
      "[model]\nfamily = \"" + family + "\"\nlayers = 2\nhidden = 32\nheads = 4\nvocab = 256\nsequence = 32\n";
  if (family == "llama") m += "kv_heads = 2\nffn = 48\nhead_dim = 16\n";
  if (family == "mistral") m += "kv_heads = 2\nffn = 48\nsliding_window = 8\n";
  if (family == "qwen2") m += "kv_heads = 1\nffn = 40\n";
  if (family == "qwen3") m += "kv_heads = 2\nffn = 48\nhead_dim = 16\n";
  if (family == "olmo2") m += "kv_heads = 2\nffn = 48\n";
  if (family == "gemma") m += "kv_heads = 2\nffn = 48\nhead_dim = 8\n";
  if (family == "gpt_neox") m += "ffn = 56\nrotary_pct = 0.25\nparallel_residual = true\n";
  return m;
}

std::string ExtractSpec(const std::string& name, const std::string& family, const std::string& extract) {
  return "name = \"" + name + "\"\nkind = \"extract\"\n" + ModelTable(family) +
         "[data]\npath = \"corpus.txt\"\n[train]\nseed = 11\n[parallel]\ndp = 2\n[extract]\n" + extract;
}

const char* kAllSites =
    "sites = [\"resid_pre\", \"resid_mid\", \"resid_post\", \"attn_out\", \"mlp_out\", \"q\", \"k\", \"v\", "
    "\"attn_pattern\", \"mlp_hidden\", \"final_norm\", \"logits\"]\n";

TEST_F(SitesTest, EverySiteOfEveryFamilyEqualsTheDirectForwardBitForBit) {
  for (const std::string family : {"gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "gpt_neox"}) {
    for (const std::string mode : {"whole", "layerwise"}) {
      SCOPED_TRACE(family + " " + mode);
      // Layer 0 only: final_norm and logits add the last layer (1), with every per-block site.
      auto [run, spec] =
          Run(family + "-" + mode, ExtractSpec(family + "-" + mode, family,
                                               std::string("layers = [0]\n") + kAllSites +
                                                   "batch = 4\ntokens = 256\nmode = \"" + mode + "\"\n"));
      ASSERT_EQ(spec.extract.layers, (std::vector<int64_t>{0, 1}));
      for (int64_t layer : {0, 1}) {
        for (const std::string& site : spec.extract.sites) {
          if (layer == 0 && IsModelLevelSite(site)) continue;
          const std::string stored = Stored(spec, run, layer, site);
          const std::string expected = Reference(spec, layer, site);
          ASSERT_FALSE(expected.empty());
          ASSERT_EQ(stored.size(), expected.size()) << "layer " << layer << " " << site;
          EXPECT_TRUE(stored == expected)
              << "layer " << layer << " " << site << " differs from the direct forward pass";
        }
      }
      // Each attention row is a distribution over the keys it may see: sums to 1, zero beyond
      // the query (and, for mistral, before its window).
      const std::string pattern = Stored(spec, run, 0, "attn_pattern");
      std::vector<float> p(pattern.size() / 4);
      std::memcpy(p.data(), pattern.data(), pattern.size());
      const int64_t t = 32, heads = 4;
      for (int64_t row = 0; row < 64; ++row) {
        for (int64_t h = 0; h < heads; ++h) {
          double sum = 0;
          for (int64_t j = 0; j < t; ++j) {
            const float v = p[static_cast<size_t>((row * heads + h) * t + j)];
            sum += v;
            if (j > row % t || (family == "mistral" && j <= row % t - 8)) {
              EXPECT_EQ(v, 0.0f) << row << " " << h << " " << j;
            }
          }
          EXPECT_NEAR(sum, 1.0, 1e-5);
        }
      }
    }
  }
}

TEST_F(SitesTest, TopKLogitsStoreValuesAndInt32IdsLikeTheDirectForward) {
  auto [run, spec] = Run(
      "topk",
      ExtractSpec("topk", "llama", "layers = [1]\nsites = [\"logits\"]\nlogits_top_k = 5\nbatch = 4\ntokens = 256\n"));
  ASSERT_EQ(spec.extract.sites, (std::vector<std::string>{"logits", "logits_ids"}));
  for (const std::string site : {"logits", "logits_ids"}) {
    const std::string stored = Stored(spec, run, 1, site);
    ASSERT_EQ(stored.size(), 256u * 5u * 4u) << site;
    EXPECT_TRUE(stored == Reference(spec, 1, site)) << site;
  }
  // Values descend along each row; ids are token ids.
  const std::string values = Stored(spec, run, 1, "logits"), ids = Stored(spec, run, 1, "logits_ids");
  std::vector<float> v(values.size() / 4);
  std::vector<int32_t> id(ids.size() / 4);
  std::memcpy(v.data(), values.data(), values.size());
  std::memcpy(id.data(), ids.data(), ids.size());
  for (size_t row = 0; row < 256; ++row) {
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_GE(id[row * 5 + k], 0);
      EXPECT_LT(id[row * 5 + k], 256);
      if (k > 0) {
        EXPECT_GE(v[row * 5 + k - 1], v[row * 5 + k]);
      }
    }
  }
}

std::string PatchSpec(const std::string& name, const std::string& family, const std::string& patch,
                      const std::string& mode) {
  return "name = \"" + name + "\"\nkind = \"patch\"\n" + ModelTable(family) +
         "[data]\npath = \"corpus.txt\"\n[train]\nseed = 11\n[parallel]\ndp = 2\n[extract]\nbatch = 4\ntokens = "
         "256\nmode = \"" +
         mode + "\"\n[patch]\n" + patch;
}

// The stored loss rows against the independent zero-ablation loss: NaN exactly at each
// sequence's last position, equal elsewhere (both fp32 on CPU; 1e-6 relative allows for
// cross_entropy's and the capture's log-softmax summing in another order).
void ExpectLoss(const std::string& stored, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(stored.size(), expected.size() * 4) << what;
  std::vector<float> loss(expected.size());
  std::memcpy(loss.data(), stored.data(), stored.size());
  for (size_t i = 0; i < loss.size(); ++i) {
    if (i % 32 == 31) {
      EXPECT_TRUE(std::isnan(loss[i]) && std::isnan(expected[i])) << what << " row " << i;
      continue;
    }
    EXPECT_NEAR(loss[i], expected[i], 1e-6 * std::abs(expected[i])) << what << " row " << i;
  }
}

TEST_F(SitesTest, ZeroAblationPatchRunsStoreTheLossOfAnIndependentForward) {
  struct Case {
    std::string family, patch, mode;
  };
  const std::vector<Case> cases = {
      {"gpt2", "layers = [0]\nsites = [\"attn_out\"]\n", "whole"},
      {"gpt2", "layers = [1]\nsites = [\"mlp_out\"]\nlogits = true\n", "layerwise"},
      {"llama", "layers = [0]\nsites = [\"attn_out\"]\n", "layerwise"},
      {"llama", "layers = [1]\nsites = [\"resid_mid\"]\n", "whole"},
      {"gpt_neox", "layers = [0]\nsites = [\"resid_mid\", \"mlp_hidden\"]\n", "whole"},
      {"gemma", "layers = [0, 1]\nsites = [\"resid_pre\"]\n", "whole"},
      {"mistral", "layers = [1]\nsites = [\"resid_post\"]\n", "layerwise"},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.family + ": " + c.patch);
    const std::string name = "patch-" + std::to_string(n++);
    auto [run, spec] = Run(name, PatchSpec(name, c.family, c.patch, c.mode));
    ASSERT_TRUE(spec.is_patch());
    auto expected = worker::DirectForwardPatchedLoss(spec);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    ExpectLoss(Stored(spec, run, 1, "loss"), *expected, name);
    // The ablation changed the loss: the same forward without it differs.
    RunSpec clean = spec;
    clean.patch.layers.clear();
    auto unablated = worker::DirectForwardPatchedLoss(clean);
    ASSERT_TRUE(unablated.ok());
    EXPECT_NE((*unablated)[0], (*expected)[0]);
    if (spec.patch.logits) {
      const std::string logits = Stored(spec, run, 1, "logits");
      EXPECT_EQ(logits.size(), 256u * 256u * 4u);
      EXPECT_TRUE(logits == Reference(spec, 1, "logits"));
    }
  }
}

// A .npy (format 1.0) of shape (32,), fp32: a 118-byte dict padded to 128 with the magic.
void WriteVectorNpy(const std::string& path, const std::vector<float>& values) {
  ASSERT_EQ(values.size(), 32u);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (32,), }";
  header.resize(128 - 10 - 1, ' ');
  header += '\n';
  std::ofstream npy(path, std::ios::binary);
  npy << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size() & 0xff)
      << static_cast<char>(header.size() >> 8) << header;
  npy.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
}

// Mean ablation: attn_out of layer 0 replaced at every row by its mean over a capture of the
// same model (computed here from the direct forward, saved as the .npy the spec names).
TEST_F(SitesTest, MeanAblationReplacesTheSiteWithTheGivenValuesAtEveryRow) {
  for (const std::string family : {"gpt2", "qwen2"}) {
    SCOPED_TRACE(family);
    auto capture = ParseRunSpec(
        ExtractSpec("c", family, "layers = [0]\nsites = [\"attn_out\"]\nbatch = 4\ntokens = 256\n"), dir_, true);
    ASSERT_TRUE(capture.ok()) << capture.status().ToString();
    const std::string rows = Reference(*capture, 0, "attn_out");
    ASSERT_EQ(rows.size(), 256u * 32u * 4u);
    std::vector<float> values(rows.size() / 4), mean(32, 0.0f);
    std::memcpy(values.data(), rows.data(), rows.size());
    for (size_t i = 0; i < values.size(); ++i) mean[i % 32] += values[i] / 256.0f;
    WriteVectorNpy(dir_ + "/mean-" + family + ".npy", mean);
    const std::string name = "mean-" + family;
    auto [run, spec] = Run(
        name,
        PatchSpec(name, family,
                  "layers = [0]\nsites = [\"attn_out\"]\nablation = \"mean\"\nsource = \"mean-" + family + ".npy\"\n",
                  "whole"));
    ASSERT_EQ(spec.patch.source, dir_ + "/mean-" + family + ".npy");
    auto expected = worker::DirectForwardPatchedLoss(spec, mean);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    ExpectLoss(Stored(spec, run, 1, "loss"), *expected, name);
    auto zero = worker::DirectForwardPatchedLoss(spec);  // the same run with zeros instead
    ASSERT_TRUE(zero.ok());
    EXPECT_NE((*zero)[0], (*expected)[0]);
  }
}

// Steering (ablation = "steer"): resid_post of layer 0 gets alpha x v added at every row. A zero
// vector changes nothing (the clean forward's loss, bit for bit in what is stored); a non-zero one
// gives the loss of an independent forward with the same addition, which differs from the clean.
TEST_F(SitesTest, SteeringAddsAlphaTimesTheVectorAndAZeroVectorChangesNothing) {
  std::vector<float> direction(32);
  for (size_t i = 0; i < direction.size(); ++i) direction[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  WriteVectorNpy(dir_ + "/steer-zero.npy", std::vector<float>(32, 0.0f));
  WriteVectorNpy(dir_ + "/steer-v.npy", direction);
  for (const auto& [vector, alpha] : {std::pair<std::string, std::string>{"steer-zero", "3.0"}, {"steer-v", "2.5"}}) {
    SCOPED_TRACE(vector);
    const std::string name = "run-" + vector;
    auto [run, spec] = Run(name, PatchSpec(name, "llama",
                                           "layers = [0]\nsites = [\"resid_post\"]\nablation = \"steer\"\nsource = \"" +
                                               vector + ".npy\"\nalpha = " + alpha + "\n",
                                           "whole"));
    ASSERT_EQ(spec.patch.ablation, Ablation::kSteer);
    RunSpec clean = spec;
    clean.patch.layers.clear();
    auto unsteered = worker::DirectForwardPatchedLoss(clean);
    ASSERT_TRUE(unsteered.ok()) << unsteered.status().ToString();
    if (vector == "steer-zero") {
      ExpectLoss(Stored(spec, run, 1, "loss"), *unsteered, name);
      continue;
    }
    auto expected = worker::DirectForwardPatchedLoss(spec, direction);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    ExpectLoss(Stored(spec, run, 1, "loss"), *expected, name);
    EXPECT_NE((*unsteered)[0], (*expected)[0]);
  }
}

}  // namespace
}  // namespace strata
