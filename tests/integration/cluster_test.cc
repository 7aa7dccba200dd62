// End-to-end tests of a local cluster: `strata up` starts real coordinator and worker processes
// (ipc sockets, RocksDB stores under a temporary state dir), and every check goes through the
// CLI's --json output or the stores themselves - what a user would look at.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "client/coordinator_client.h"
#include "common/hex.h"
#include "schema/envelope.h"
#include "spec/run_spec.h"
#include "storage/keys.h"
#include "storage/safetensors.h"
#include "storage/shard_store.h"
#include "tests/integration/harness.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using testing::CommandResult;
using testing::NowMs;
using testing::ReadFile;

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-it-XXXXXX");
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
  }

  static void TearDownTestSuite() {
    Strata("down");
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  static CommandResult Run(const std::string& command) { return testing::RunCommand(command, dir_); }
  static CommandResult Strata(const std::string& args) { return Run(std::string(STRATA_BIN_DIR) + "/strata " + args); }

  static json StrataJson(const std::string& args) { return testing::RunStrataJson(args, dir_); }

  static std::string WriteSpec(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    return path;
  }

  static std::string Spec(const std::string& name, int dp, int steps, int checkpoint_every) {
    std::ostringstream s;
    s << "name = \"" << name << "\"\n"
      << "[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nsequence = 32\n"
      << "[data]\npath = \"corpus.txt\"\n"
      << "[train]\nsteps = " << steps
      << "\nglobal_batch = 8\nlr = 0.003\nseed = 7\ncheckpoint_every = " << checkpoint_every << "\n"
      << "keep_checkpoints = 0\n"  // every one kept: these tests read and resume old ones
      << "[parallel]\ndp = " << dp << "\npp = 1\ntp = 1\nrecompute = false\n";  // zero, micro_batch: planned
    return s.str();
  }

  // Submits and follows to the end; returns the run id.
  static std::string SubmitAndFollow(const std::string& name, const std::string& body) {
    auto r = Strata("submit " + WriteSpec(name, body) + " --follow");
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    std::istringstream lines(r.out);
    std::string run_id;
    std::getline(lines, run_id);
    return run_id;
  }

  static int WorkerPid(const std::string& name) {
    auto cluster = json::parse(ReadFile(dir_ + "/state/cluster.json"));
    for (auto& p : cluster["processes"]) {
      if (p["name"] == name) return p["pid"].get<int>();
    }
    return 0;
  }

  static std::string dir_;
};
std::string ClusterTest::dir_;

TEST_F(ClusterTest, PlanShowsTheMeshAndEachWorkersEstimateBeforeAnythingRuns) {
  const std::string spec = WriteSpec("plan-me", Spec("plan-me", 1, 1, 0));
  // Against the live cluster (two CPU workers): the spec fixes a one-worker mesh, which takes one.
  json live = StrataJson("plan " + spec);
  ASSERT_TRUE(live.is_object());
  EXPECT_EQ(live["workers"].size(), 1u);
  EXPECT_EQ(live["dp"], 1) << "the spec fixes parallel.dp = 1";
  EXPECT_NE(live["why"].get<std::string>().find("Uses 1 of 2 workers: the [parallel] mesh is fixed"), std::string::npos)
      << live["why"];
  // Against a described cluster of 4 nodes x 8 GPUs: every worker planned, none over budget.
  const std::string cluster = dir_ + "/cluster.toml";
  std::ofstream(cluster) << "[[nodes]]\ncount = 4\ngpus = 8\nmemory = \"80GiB\"\nfree = \"70GiB\"\n";
  const std::string free_dp = WriteSpec("plan-auto",
                                        "name = \"plan-auto\"\n[model]\nlayers = 4\nhidden = 256\nheads = 8\n"
                                        "sequence = 128\n[data]\npath = \"corpus.txt\"\n[train]\nglobal_batch = 64\n");
  json described = StrataJson("plan " + free_dp + " --cluster-spec " + cluster);
  ASSERT_TRUE(described.is_object());
  EXPECT_EQ(described["workers"].size(), 32u);
  EXPECT_EQ(described["dp"].get<int>() * described["pp"].get<int>() * described["tp"].get<int>(), 32);
  for (auto& w : described["workers"])
    EXPECT_LE(w["estimate"]["total"].get<int64_t>(), w["budget"].get<int64_t>()) << w.dump();
  // Under tensor parallelism the plan says whether the vocabulary splits over the ranks, and
  // what vocabulary would split it.
  std::ofstream(cluster) << "[[nodes]]\ngpus = 2\nmemory = \"80GiB\"\n";
  auto tp_spec = [&](const std::string& name, const std::string& vocab) {
    return WriteSpec(name, "name = \"" + name + "\"\n[model]\nlayers = 4\nhidden = 256\nheads = 8\nsequence = 128\n" +
                               vocab +
                               "[data]\npath = \"corpus.txt\"\n[train]\nglobal_batch = 8\n[parallel]\ntp = 2\n");
  };
  json split = StrataJson("plan " + tp_spec("plan-tp", "") + " --cluster-spec " + cluster);
  ASSERT_TRUE(split.is_object());
  EXPECT_EQ(split["tp"], 2);
  EXPECT_EQ(split["vocab_parallel"], true) << "256 rows split over 2";
  EXPECT_EQ(split["sequence_parallel"], true) << "128 tokens split over 2";
  const std::string odd_spec = tp_spec("plan-tp-odd", "vocab = 50257\n");
  auto odd = Strata("plan " + odd_spec + " --cluster-spec " + cluster);
  EXPECT_EQ(odd.rc, 0) << odd.err;
  EXPECT_NE(odd.out.find("50257 rows do not divide by tp=2"), std::string::npos) << odd.out;
  EXPECT_NE(odd.out.find("model.vocab = 50304"), std::string::npos) << odd.out;
  EXPECT_NE(odd.out.find("sequence parallel: norms and residual adds on 64 of each sequence's 128 tokens a rank"),
            std::string::npos)
      << odd.out;
  // Switched off by the spec, the plan says so and how it runs instead.
  const std::string off_spec = WriteSpec("plan-tp-off",
                                         "name = \"plan-tp-off\"\n[model]\nlayers = 4\nhidden = 256\nheads = 8\n"
                                         "sequence = 128\n[data]\npath = \"corpus.txt\"\n[train]\nglobal_batch = 8\n"
                                         "[parallel]\ntp = 2\nsequence_parallel = false\n");
  auto off = Strata("plan " + off_spec + " --cluster-spec " + cluster);
  EXPECT_EQ(off.rc, 0) << off.err;
  EXPECT_NE(off.out.find("sequence parallel: off (parallel.sequence_parallel = false)"), std::string::npos) << off.out;
  // Bad cluster specs name the field.
  std::ofstream(cluster) << "[[nodes]]\ncount = 4\ngpus = 0\nmemory = \"80GiB\"\n";
  auto bad = Strata("plan " + free_dp + " --cluster-spec " + cluster);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("gpus must be an integer >= 1"), std::string::npos) << bad.err;
  std::ofstream(cluster) << "[[nodes]]\ngpus = 8\nmemory = \"-5GiB\"\n";
  bad = Strata("plan " + free_dp + " --cluster-spec " + cluster);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("memory"), std::string::npos) << bad.err;
  // submit refuses a training run that cannot fit the live workers, saying what it needs.
  const std::string huge = WriteSpec("huge",
                                     "name = \"huge\"\n[model]\nlayers = 64\nhidden = 8192\nheads = 64\n"
                                     "sequence = 128\n[data]\npath = \"corpus.txt\"\n[train]\nglobal_batch = 2\n");
  auto refused = Strata("submit " + huge);
  EXPECT_EQ(refused.rc, 1) << refused.out;
  EXPECT_NE(refused.err.find("not submitted"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("GiB free per worker"), std::string::npos) << refused.err;  // CPU workers: no "GPU"
  EXPECT_EQ(refused.err.find("GPU"), std::string::npos) << refused.err;
  EXPECT_TRUE(refused.out.empty()) << "nothing was submitted: " << refused.out;
}

TEST_F(ClusterTest, TrainsToTheEndWithCheckpointsThatReadBackBitIdentical) {
  const std::string run = SubmitAndFollow("e2e", Spec("e2e", 2, 30, 10));
  ASSERT_FALSE(run.empty());
  json status = StrataJson("status " + run);
  EXPECT_EQ(status["state"], "finished");
  EXPECT_EQ(status["step"], 30);
  auto losses = status["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front() * 0.8) << "first " << losses.front() << " last " << losses.back();

  json checkpoints = StrataJson("checkpoints " + run);
  ASSERT_EQ(checkpoints.size(), 3u);
  EXPECT_EQ(checkpoints[0]["step"], 10);
  EXPECT_EQ(checkpoints[2]["step"], 30);
  EXPECT_EQ(status["checkpoint_steps"], json::array({10, 20, 30}));

  // The stores are open in the workers (RocksDB holds a lock): read them through a checkpoint
  // copy. Every tensor must read back with the checksum the worker computed from its memory.
  const json& last = checkpoints[2];
  size_t tensors = 0;
  std::set<std::string> piece_kinds;
  for (const auto& shard : last["shards"]) {
    const std::string copy = dir_ + "/store-copy-" + std::to_string(tensors);
    fs::copy(shard["store_path"].get<std::string>(), copy, fs::copy_options::recursive);
    fs::remove(copy + "/LOCK");
    auto store = storage::ShardStore::Open(copy, {.create_if_missing = false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (const auto& t : shard["tensors"]) {
      auto read = (*store)->ReadCheckpointTensor(run, 30, t["name"]);
      ASSERT_TRUE(read.ok()) << t["name"] << ": " << read.status().ToString();
      char hex[19];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(storage::Checksum(read->bytes)));
      EXPECT_EQ(t["checksum"].get<std::string>(), hex) << t["name"];
      EXPECT_EQ(read->bytes.size(), t["size_bytes"].get<size_t>());
      const std::string name = t["name"];
      piece_kinds.insert(name.substr(0, name.find('@')));  // KIND/NAME@tp=...@[begin,end)@shape
      ++tensors;
    }
  }
  // 2 layers x 12 tensors + wte, wpe, ln_f x2 = 28 parameters, 3 kinds each (parameter and two
  // AdamW moments), written as pieces over the 2 shards (a tensor the data-parallel cut crosses
  // has a piece in each).
  EXPECT_EQ(piece_kinds.size(), 28u * 3);
  EXPECT_GE(tensors, 28u * 3);
}

TEST_F(ClusterTest, ExportWritesAHuggingFaceDirectoryFromTheShardStores) {
  const std::string run = SubmitAndFollow("export", Spec("export", 2, 6, 3));
  const std::string out = dir_ + "/exported";
  // The workers keep their stores open: export reads them read-only.
  auto r = Strata("export " + run + " --out " + out);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("step 6"), std::string::npos) << r.out;
  auto file = storage::ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->tensors.size(), 28u);  // GPT-2 with a tied head: no lm_head tensor
  // Conv1D layout: [in, out].
  EXPECT_EQ(file->tensors.at("transformer.h.1.attn.c_attn.weight").shape, (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(file->tensors.at("transformer.wte.weight").shape, (std::vector<int64_t>{256, 64}));
  auto config = json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_layer"], 2);
  // The tensor bytes are the checkpoint's: wte's pieces, read from copies of the stores and put
  // in order, are exactly the exported tensor.
  json checkpoints = StrataJson("checkpoints " + run);
  std::map<int64_t, std::vector<uint8_t>> wte_pieces;  // by first element
  int copies = 0;
  for (auto& shard : checkpoints.back()["shards"]) {
    const std::string copy = dir_ + "/export-store-copy-" + std::to_string(copies++);
    fs::copy(shard["store_path"].get<std::string>(), copy, fs::copy_options::recursive);
    fs::remove(copy + "/LOCK");
    auto store = storage::ShardStore::Open(copy, {.create_if_missing = false});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (auto& t : shard["tensors"]) {
      const std::string name = t["name"];
      if (name.rfind("param/wte.weight@", 0) != 0) continue;
      auto read = (*store)->ReadCheckpointTensor(run, 6, name);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      wte_pieces[std::stoll(name.substr(name.find("@[") + 2))] = read->bytes;
    }
  }
  std::vector<uint8_t> wte;
  for (auto& [begin, bytes] : wte_pieces) {
    EXPECT_EQ(static_cast<size_t>(begin) * sizeof(float), wte.size()) << "pieces leave a gap";
    wte.insert(wte.end(), bytes.begin(), bytes.end());
  }
  EXPECT_EQ(storage::Checksum(wte), file->tensors.at("transformer.wte.weight").checksum);
  // Where transformers is installed (the GPU node), it must load the directory and run it.
  if (std::system("python3 -c 'import transformers' >/dev/null 2>&1") == 0) {
    auto py = Run("python3 -c \"import torch, transformers as t; m = t.AutoModelForCausalLM.from_pretrained('" + out +
                  "'); print(m(torch.tensor([[1, 2, 3]])).logits.shape)\"");
    EXPECT_EQ(py.rc, 0) << py.err;
    EXPECT_NE(py.out.find("256"), std::string::npos) << py.out;
  }
  // A step with no checkpoint is refused naming the complete ones.
  auto bad = Strata("export " + run + " --step 4 --out " + dir_ + "/nope");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("3, 6"), std::string::npos) << bad.err;
}

// LoRA: a run from a base directory trains adapters only; `export --adapter` writes PEFT's
// layout and `export --merge` the base with W + scale * B A folded in.
TEST_F(ClusterTest, LoraAdaptersExportInPeftsLayoutAndMergeIntoTheBase) {
  const std::string base_run = SubmitAndFollow("lorabase", Spec("lorabase", 1, 2, 2));
  const std::string base = dir_ + "/lora-base";
  ASSERT_EQ(Strata("export " + base_run + " --out " + base).rc, 0);
  const std::string lora_spec =
      Spec("lora", 2, 4, 4) + "zero = 1\n[lora]\nrank = 4\nalpha = 8\n" + "target_modules = \"all-linear\"\n";
  std::string with_base = lora_spec;
  with_base.replace(with_base.find("[model]\n"), 8, "[model]\ninit_from = \"" + base + "\"\n");
  // `strata plan` says what trains: per layer c_attn 4*64 + 192*4, attn c_proj 4*64 + 64*4, c_fc
  // 4*64 + 256*4, mlp c_proj 4*256 + 64*4 = 4,096; two layers.
  auto planned = Strata("plan " + WriteSpec("lora-plan", with_base));
  ASSERT_EQ(planned.rc, 0) << planned.err;
  EXPECT_NE(planned.out.find("(frozen; LoRA r=4 trains 8192)"), std::string::npos) << planned.out;
  const std::string run = SubmitAndFollow("lora", with_base);

  // The whole model is refused: the checkpoint holds the adapters, not the frozen base.
  auto whole = Strata("export " + run + " --out " + dir_ + "/lora-whole");
  EXPECT_EQ(whole.rc, 2);
  EXPECT_NE(whole.err.find("--adapter"), std::string::npos) << whole.err;

  const std::string adapter = dir_ + "/lora-adapter";
  auto r = Strata("export " + run + " --adapter --out " + adapter);
  ASSERT_EQ(r.rc, 0) << r.err;
  auto file = storage::ReadSafetensors(adapter + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->tensors.size(), 2u * 4 * 2);  // layers x (c_attn, attn c_proj, c_fc, mlp c_proj) x (A, B)
  const storage::Tensor& a = file->tensors.at("base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight");
  const storage::Tensor& b = file->tensors.at("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{256, 4}));
  auto floats = [](const storage::Tensor& t) {
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  };
  const std::vector<float> av = floats(a), bv = floats(b);
  EXPECT_GT(*std::max_element(bv.begin(), bv.end()), 0.0f) << "B trained away from zero";
  auto config = json::parse(ReadFile(adapter + "/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8);
  EXPECT_EQ(config["target_modules"], json({"c_attn", "c_proj", "c_fc"}));
  EXPECT_EQ(config["fan_in_fan_out"], true);
  EXPECT_EQ(config["base_model_name_or_path"], base);

  const std::string merged = dir_ + "/lora-merged";
  r = Strata("export " + run + " --merge --out " + merged);
  ASSERT_EQ(r.rc, 0) << r.err;
  auto merged_file = storage::ReadSafetensors(merged + "/model.safetensors");
  auto base_file = storage::ReadSafetensors(base + "/model.safetensors");
  ASSERT_TRUE(merged_file.ok() && base_file.ok());
  // Unadapted tensors are the base's bytes; c_fc (Conv1D, [in, out]) is base + 2 * (B A)^T.
  EXPECT_TRUE(merged_file->tensors.at("transformer.wte.weight").bytes ==
              base_file->tensors.at("transformer.wte.weight").bytes);
  const std::vector<float> w0 = floats(base_file->tensors.at("transformer.h.1.mlp.c_fc.weight"));
  const std::vector<float> w1 = floats(merged_file->tensors.at("transformer.h.1.mlp.c_fc.weight"));
  double worst = 0;
  for (int in = 0; in < 64; ++in) {
    for (int out = 0; out < 256; ++out) {
      double delta = 0;
      for (int k = 0; k < 4; ++k) delta += static_cast<double>(bv[out * 4 + k]) * av[k * 64 + in];
      worst = std::max(worst, std::abs(w0[in * 256 + out] + 2.0 * delta - w1[in * 256 + out]));
    }
  }
  EXPECT_LT(worst, 1e-5);
  // model.adapter_from: the exported adapter over the base is the merged model. A train run
  // continues it ([lora] from its adapter_config.json): its step 1 is the merged model's, as a
  // full-training run from the merged export computes it; an extract run captures the merged
  // model's activations.
  {
    std::string continued = Spec("lora-continued", 1, 1, 0);
    continued.replace(continued.find("[model]\n"), 8,
                      "[model]\ninit_from = \"" + base + "\"\nadapter_from = \"" + adapter + "\"\n");
    std::string from_merged = Spec("from-merged", 1, 1, 0);
    from_merged.replace(from_merged.find("[model]\n"), 8, "[model]\ninit_from = \"" + merged + "\"\n");
    const json c = StrataJson("status " + SubmitAndFollow("lora-continued", continued));
    const json f = StrataJson("status " + SubmitAndFollow("from-merged", from_merged));
    ASSERT_EQ(c["state"], "finished") << c.dump();
    ASSERT_EQ(f["state"], "finished") << f.dump();
    const double lc = c["losses"][0].get<double>(), lf = f["losses"][0].get<double>();
    EXPECT_NEAR(lc, lf, 1e-5 * lf);
    const double lb = StrataJson("status " + run)["losses"][0].get<double>();  // the base's: B starts at 0
    EXPECT_GT(std::abs(lc - lb), 1e3 * std::abs(lc - lf)) << "the adapter moved the loss";

    auto extract = [&](const std::string& name, const std::string& model) {
      const std::string body = "name = \"" + name + "\"\nkind = \"extract\"\n[model]\n" + model +
                               "[data]\npath = \"corpus.txt\"\n[extract]\nlayers = [1]\nsites = [\"resid_post\"]\n"
                               "tokens = 256\n";
      const std::string run = SubmitAndFollow(name, body);
      const std::string out = dir_ + "/" + name + ".npy";
      auto got = Strata("activations get " + run + " --layer 1 --site resid_post --out " + out);
      EXPECT_EQ(got.rc, 0) << got.err;
      const std::string bytes = ReadFile(out);
      if (bytes.size() < 10) return std::vector<float>{};
      const size_t header = 10 + (static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8);
      std::vector<float> values((bytes.size() - header) / 4);
      std::memcpy(values.data(), bytes.data() + header, values.size() * 4);
      return values;
    };
    const auto with_adapter =
        extract("extract-adapted", "init_from = \"" + base + "\"\nadapter_from = \"" + adapter + "\"\n");
    const auto merged_values = extract("extract-merged", "init_from = \"" + merged + "\"\n");
    ASSERT_EQ(with_adapter.size(), merged_values.size());
    ASSERT_FALSE(with_adapter.empty());
    double farthest = 0;
    for (size_t i = 0; i < with_adapter.size(); ++i)
      farthest = std::max(farthest, static_cast<double>(std::abs(with_adapter[i] - merged_values[i])));
    EXPECT_LT(farthest, 1e-4);
    // An adapter on a base it was not trained for is refused at submit, naming both.
    std::string wider = Spec("lora-wrong-base", 1, 1, 0);
    wider.replace(wider.find("hidden = 64"), 11, "hidden = 128");
    wider.replace(wider.find("[model]\n"), 8, "[model]\nadapter_from = \"" + adapter + "\"\n");
    auto refused = Strata("submit " + WriteSpec("lora-wrong-base", wider));
    EXPECT_EQ(refused.rc, 2);
    EXPECT_NE(refused.err.find("trained on another base, \"" + base + "\""), std::string::npos) << refused.err;
  }
  // A LoRA checkpoint (adapters only) resumes onto the base it was trained over, and nothing else.
  {
    std::string longer = with_base;
    longer.replace(longer.find("steps = 4"), 9, "steps = 6");
    std::string wrong = longer;
    wrong.replace(wrong.find(base), base.size(), merged);
    auto refused_base = Strata("submit " + WriteSpec("lora-other-base", wrong) + " --resume " + run);
    EXPECT_EQ(refused_base.rc, 2);
    EXPECT_NE(refused_base.err.find("adapters were trained over the base model.init_from = \"" + base + "\""),
              std::string::npos)
        << refused_base.err;
    EXPECT_NE(refused_base.err.find("this spec's base is model.init_from = \"" + merged + "\""), std::string::npos)
        << refused_base.err;
    std::string full = Spec("full-from-lora", 2, 6, 0);
    full.replace(full.find("[model]\n"), 8, "[model]\ninit_from = \"" + base + "\"\n");
    auto refused_full = Strata("submit " + WriteSpec("full-from-lora", full) + " --resume " + run);
    EXPECT_EQ(refused_full.rc, 2);
    EXPECT_NE(refused_full.err.find("trained LoRA adapters"), std::string::npos) << refused_full.err;
    auto resumed = Strata("submit " + WriteSpec("lora-resumed", longer) + " --resume " + run + " --follow");
    ASSERT_EQ(resumed.rc, 0) << resumed.err;
    const json s = StrataJson("status " + resumed.out.substr(0, resumed.out.find('\n')));
    EXPECT_EQ(s["state"], "finished") << s.dump();
    EXPECT_EQ(s["losses"].size(), 6u);
  }
  // A seed-drawn base cannot be merged: named, with what to do.
  const std::string seeded = SubmitAndFollow("lora-seeded", lora_spec);
  auto refused = Strata("export " + seeded + " --merge --out " + dir_ + "/lora-seeded");
  EXPECT_EQ(refused.rc, 2);
  EXPECT_NE(refused.err.find("--merge needs the base's weights"), std::string::npos) << refused.err;
  // Where PEFT is installed (the GPU node): it loads the adapter onto the base, and its logits
  // are the merged model's.
  if (std::system("python3 -c 'import peft, transformers' >/dev/null 2>&1") == 0) {
    std::ofstream(dir_ + "/peft_check.py")
        << "import sys, torch, transformers as t, peft\n"
           "base, adapter, merged = sys.argv[1:4]\n"
           "x = torch.tensor([[1, 2, 3, 70, 200, 31]])\n"
           "m = peft.PeftModel.from_pretrained(t.AutoModelForCausalLM.from_pretrained(base), adapter).eval()\n"
           "ref = t.AutoModelForCausalLM.from_pretrained(merged).eval()\n"
           "with torch.no_grad():\n"
           "    d = (m(x).logits - ref(x).logits).abs().max().item()\n"
           "    with m.disable_adapter():\n"
           "        b = (m(x).logits - ref(x).logits).abs().max().item()\n"
           "print('peft vs merged', d, 'base vs merged', b)\n"
           "assert d < 1e-4 < b, (d, b)\n";
    auto py = Run("python3 " + dir_ + "/peft_check.py " + base + " " + adapter + " " + merged);
    EXPECT_EQ(py.rc, 0) << py.out << py.err;
  }
}

// `export --quantized` writes a `*-bnb-4bit` directory: each linear of the blocks as bitsandbytes'
// six entries (packed codes, 8-bit block scales, the NF4 table, the nested scales and their map,
// the quant state's JSON), the rest bf16, and transformers' quantization_config. init_from loads
// it back, for full training and as a QLoRA base.
TEST_F(ClusterTest, QuantizedExportWritesBitsandbytesLayoutThatInitFromLoads) {
  const std::string run = SubmitAndFollow("quantsrc", Spec("quantsrc", 1, 2, 2));
  const std::string dense = dir_ + "/quant-dense", packed = dir_ + "/quant-nf4";
  ASSERT_EQ(Strata("export " + run + " --out " + dense).rc, 0);
  auto r = Strata("export " + run + " --quantized --out " + packed);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("nf4 + bf16"), std::string::npos) << r.out;
  auto file = storage::ReadSafetensors(packed + "/model.safetensors");
  auto reference = storage::ReadSafetensors(dense + "/model.safetensors");
  ASSERT_TRUE(file.ok() && reference.ok()) << file.status().ToString();
  // bitsandbytes' Linear4bit._save_to_state_dict keys of one weight.
  const std::vector<std::string> bnb_suffixes = {
      "", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4"};
  std::set<std::string> expected;
  for (const auto& [name, t] : reference->tensors) {
    const bool linear = name.find(".h.") != std::string::npos && t.shape.size() == 2;
    for (const std::string& suffix : linear ? bnb_suffixes : std::vector<std::string>{""})
      expected.insert(name + suffix);
  }
  std::set<std::string> written;
  for (const auto& [name, t] : file->tensors) written.insert(name);
  EXPECT_EQ(written, expected);
  EXPECT_EQ(expected.size(), 28u + 2 * 4 * 5);  // 2 layers x 4 linears, 5 entries beside each weight
  EXPECT_EQ(file->tensors.at("transformer.wte.weight").dtype, storage::DType::kBF16);
  const std::string w = "transformer.h.1.attn.c_attn.weight";
  const storage::Tensor& codes = file->tensors.at(w);
  EXPECT_EQ(codes.dtype, storage::DType::kU8);
  EXPECT_EQ(codes.shape, (std::vector<int64_t>{192 * 64 / 2, 1}));
  EXPECT_EQ(file->tensors.at(w + ".absmax").dtype, storage::DType::kU8);
  EXPECT_EQ(file->tensors.at(w + ".absmax").shape, (std::vector<int64_t>{192}));  // a block of 64 a row
  EXPECT_EQ(file->tensors.at(w + ".nested_absmax").shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(file->tensors.at(w + ".nested_quant_map").shape, (std::vector<int64_t>{256}));
  const storage::Tensor& state = file->tensors.at(w + ".quant_state.bitsandbytes__nf4");
  const json quant_state = json::parse(std::string(state.bytes.begin(), state.bytes.end()));
  EXPECT_EQ(quant_state["quant_type"], "nf4");
  EXPECT_EQ(quant_state["blocksize"], 64);
  EXPECT_EQ(quant_state["dtype"], "bfloat16");
  EXPECT_EQ(quant_state["shape"], json({192, 64}));  // [out, in]: transformers quantizes Conv1D transposed
  auto config = json::parse(ReadFile(packed + "/config.json"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "bitsandbytes");
  EXPECT_EQ(config["quantization_config"]["bnb_4bit_quant_type"], "nf4");
  EXPECT_EQ(config["quantization_config"]["bnb_4bit_use_double_quant"], true);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");

  // A run from the quantized directory trains from the dequantized weights; a QLoRA run over it
  // starts at the same loss (its base quantized again to the same codes and block scales) and
  // trains only adapters.
  auto with_base = [&](const std::string& name, const std::string& extra) {
    std::string body = Spec(name, 1, 2, 0) + extra;
    body.replace(body.find("[model]\n"), 8, "[model]\ninit_from = \"" + packed + "\"\n");
    return body;
  };
  const std::string full = SubmitAndFollow("fromnf4", with_base("fromnf4", ""));
  const std::string qlora =
      SubmitAndFollow("qlorafromnf4", with_base("qlorafromnf4",
                                                "[lora]\nrank = 4\nalpha = 8\ntarget_modules = \"all-linear\"\n"
                                                "base = \"nf4\"\n"));
  const json a = StrataJson("status " + full), b = StrataJson("status " + qlora);
  ASSERT_EQ(a["state"], "finished") << a.dump();
  ASSERT_EQ(b["state"], "finished") << b.dump();
  const auto la = a["losses"].get<std::vector<double>>(), lb = b["losses"].get<std::vector<double>>();
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  EXPECT_NEAR(la[0], lb[0], 1e-3 * la[0]);
  // Where transformers and bitsandbytes are installed, transformers loads the directory.
  if (std::system("python3 -c 'import transformers, bitsandbytes' >/dev/null 2>&1") == 0) {
    auto py = Run("python3 -c \"import torch, transformers as t; m = t.AutoModelForCausalLM.from_pretrained('" +
                  packed + "', device_map='auto'); print(type(m.transformer.h[0].attn.c_attn).__name__)\"");
    EXPECT_EQ(py.rc, 0) << py.err;
    EXPECT_NE(py.out.find("Linear4bit"), std::string::npos) << py.out;
  }
}

TEST_F(ClusterTest, DataParallelOnTwoWorkersMatchesOneWorker) {
  const std::string one = SubmitAndFollow("dp1", Spec("dp1", 1, 12, 0));
  const std::string two = SubmitAndFollow("dp2", Spec("dp2", 2, 12, 0));
  const std::string zero2 = SubmitAndFollow("dp2z2", Spec("dp2z2", 2, 12, 6) + "zero = 2\n");  // sharded optimizer
  auto a = StrataJson("status " + one)["losses"].get<std::vector<double>>();
  auto b = StrataJson("status " + two)["losses"].get<std::vector<double>>();
  auto c = StrataJson("status " + zero2)["losses"].get<std::vector<double>>();
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  ASSERT_EQ(c.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
    EXPECT_NEAR(a[i], c[i], 1e-5 * std::abs(a[i])) << "ZeRO-2, step " << i + 1;
  }
  // ZeRO checkpoints: each rank holds the AdamW moments of its half of every unit, and the halves
  // add up to every parameter once.
  std::vector<int64_t> moment_elements, param_elements;
  const json zero2_checkpoints = StrataJson("checkpoints " + zero2);  // named: range-for must not outlive it
  for (auto& shard : zero2_checkpoints.back()["shards"]) {
    moment_elements.push_back(0);
    param_elements.push_back(0);
    for (auto& t : shard["tensors"]) {
      const std::string name = t["name"];
      const size_t range = name.find("@[");
      const int64_t elements = std::stoll(name.substr(name.find(',', range) + 1)) - std::stoll(name.substr(range + 2));
      if (name.rfind("adam_m/", 0) == 0) moment_elements.back() += elements;
      if (name.rfind("param/", 0) == 0) param_elements.back() += elements;
    }
  }
  ASSERT_EQ(moment_elements.size(), 2u);
  EXPECT_EQ(moment_elements[0] + moment_elements[1], param_elements[0] + param_elements[1]);
  EXPECT_NEAR(static_cast<double>(moment_elements[0]), static_cast<double>(moment_elements[1]),
              0.05 * moment_elements[1]);
}

// A spec that leaves [parallel] out is planned by the coordinator over the idle workers: the run
// journal says what was chosen and why, the stored spec holds the chosen mesh, and every rank's
// estimate sits beside its measured peak.
TEST_F(ClusterTest, AutoParallelIsPlannedAndEachRankRecordsEstimateAndMeasuredPeak) {
  const std::string body =
      "name = \"auto\"\n[model]\nlayers = 2\nhidden = 64\nheads = 4\nvocab = 256\nsequence = 32\n"
      "[data]\npath = \"corpus.txt\"\n[train]\nsteps = 4\nglobal_batch = 8\nlr = 0.003\nseed = 7\n";
  const std::string run = SubmitAndFollow("auto", body);
  const json status = StrataJson("status " + run);
  ASSERT_EQ(status["state"], "finished") << status.dump();
  std::string planned;
  for (auto& e : StrataJson("events " + run)) {
    if (e["kind"] == "planned") planned = e["message"];
  }
  EXPECT_NE(planned.find("dp="), std::string::npos) << "no 'planned' event naming the mesh";
  EXPECT_NE(planned.find("Runner-up"), std::string::npos) << planned;
  const int world = status["world_size"];
  ASSERT_GE(world, 1);
  ASSERT_EQ(status["memory"].size(), static_cast<size_t>(world)) << status.dump();
  for (auto& m : status["memory"]) {
    EXPECT_GT(m["estimate_bytes"].get<uint64_t>(), 0u) << m.dump();
    EXPECT_GT(m["measured_peak_bytes"].get<uint64_t>(), 0u) << m.dump();
  }
}

// A model no plan can fit is refused at submit, naming what it needs per worker.
TEST_F(ClusterTest, AutoRunThatCannotFitIsRefusedWithTheMemoryItNeeds) {
  const std::string body =
      "name = \"huge\"\n[model]\nlayers = 200\nhidden = 65536\nheads = 64\nvocab = 256\nsequence = 32\n"
      "[data]\npath = \"corpus.txt\"\n[train]\nsteps = 4\nglobal_batch = 8\n";
  auto r = Strata("submit " + WriteSpec("huge", body));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.err.find("needs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("free"), std::string::npos) << r.err;
  const json runs = StrataJson("status");
  for (auto& run : runs) EXPECT_NE(run["name"], "huge") << "the refused run was submitted";
}

TEST_F(ClusterTest, BadSpecsExitTwoNamingTheKeyAndStartNothing) {
  const size_t runs_before = StrataJson("status").size();
  const std::string valid = Spec("bad", 1, 5, 0);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = valid;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  struct Case {
    std::string body, needle;
  } cases[] = {
      {"name = \n[model", "not valid TOML"},
      {with("[model]\n", "[model]\nhiden = 3\n"), "model.hiden"},
      {with("layers = 2", "layers = 0"), "model.layers"},
      {with("global_batch = 8", "global_batch = -8"), "train.global_batch"},
      {with("corpus.txt", "no-such-corpus.txt"), "data.path"},
      {with("heads = 4", "heads = 5"), "hidden % heads"},
  };
  for (const auto& c : cases) {
    auto r = Strata("submit " + WriteSpec("bad", c.body));
    EXPECT_EQ(r.rc, 2) << c.needle;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in: " << r.err;
  }
  auto missing = Strata("submit " + dir_ + "/nope.toml");
  EXPECT_EQ(missing.rc, 2);
  EXPECT_EQ(StrataJson("status").size(), runs_before);
}

TEST_F(ClusterTest, UnreachableCoordinatorIsAClearErrorWithinSeconds) {
  const int64_t start = NowMs();
  auto r = Run("STRATA_CLUSTER=ipc://" + dir_ + "/nobody.sock " + std::string(STRATA_BIN_DIR) + "/strata workers");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("strata up"), std::string::npos) << r.err;
  EXPECT_LT(NowMs() - start, 8000);
}

TEST_F(ClusterTest, GarbageOnTheCoordinatorSocketIsDroppedAndServingContinues) {
  auto cluster = json::parse(ReadFile(dir_ + "/state/cluster.json"));
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 1000);
  raw.connect(cluster["endpoint"].get<std::string>());
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    std::string junk(1 + rng() % 512, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    raw.send(zmq::buffer(junk), zmq::send_flags::none);
  }
  raw.close();
  json workers = StrataJson("workers");
  EXPECT_EQ(workers.size(), 2u);
  const std::string log = ReadFile(dir_ + "/state/logs/coordinator.log");
  EXPECT_NE(log.find("dropped"), std::string::npos);
}

// The coordinator opens none of a run's files (its host may hold none of them: `strata submit`
// checked them where the user is), so a spec whose data only its workers could hold is accepted;
// the worker that cannot open it fails the run naming the key and the path.
TEST_F(ClusterTest, TheCoordinatorOpensNoRunFileAndAWorkerRefusesOneItCannotOpen) {
  auto parsed = ParseRunSpec(Spec("elsewhere", 1, 3, 0), dir_, /*check_files=*/true);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  RunSpec spec = *parsed;
  spec.data.path = dir_ + "/only-on-another-host.txt";
  auto cluster = json::parse(ReadFile(dir_ + "/state/cluster.json"));
  client::CoordinatorClient coordinator(cluster["endpoint"].get<std::string>());
  schema::EnvelopeBuilder submit;
  submit.root().initSubmitRun().setSpecToml(RunSpecToToml(spec));
  auto submitted = coordinator.Call(submit);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const std::string run = (*submitted)->root().getSubmitted().getRunId().cStr();

  json status;
  for (const int64_t start = NowMs(); NowMs() - start < 60000;) {
    status = StrataJson("status " + run);
    if (status["state"] == "failed" || status["state"] == "finished") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(status["state"], "failed") << status.dump();
  EXPECT_NE(status["message"].get<std::string>().find("data.path = \"" + spec.data.path +
                                                      "\" does not exist or is not a file"),
            std::string::npos)
      << status.dump();
}

// Kills run last (gtest runs tests in file order): they change the cluster.
TEST_F(ClusterTest, ZzCoordinatorKill9MidRunAndRestartLosesNothing) {
  auto submitted = Strata("submit " + WriteSpec("survivor", Spec("survivor", 2, 150, 50)));
  ASSERT_EQ(submitted.rc, 0) << submitted.err;
  const std::string run = submitted.out.substr(0, submitted.out.find('\n'));
  // Let it train a little, then kill the coordinator mid-run.
  const int64_t start = NowMs();
  while (NowMs() - start < 60000 && StrataJson("status " + run)["step"].get<int>() < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int coordinator = WorkerPid("coordinator");
  ASSERT_GT(coordinator, 0);
  ASSERT_EQ(kill(coordinator, SIGKILL), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto up = Strata("up --workers 2");  // restarts only what is missing
  ASSERT_EQ(up.rc, 0) << up.err;
  EXPECT_NE(up.out.find("1 process(es) started"), std::string::npos) << up.out;
  // The workers trained on through the outage; the run finishes with every step and checkpoint.
  json status;
  while (NowMs() - start < 120000) {
    status = StrataJson("status " + run);
    if (status["state"] != "running") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(status["state"], "finished") << status.dump();
  EXPECT_EQ(status["checkpoint_steps"], json::array({50, 100, 150}));
  auto losses = status["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 150u);
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_GT(losses[i], 0.0) << "no loss recorded for step " << i + 1;
  EXPECT_LT(losses.back(), losses.front());
  bool restarted = false;
  for (auto& e : StrataJson("events " + run)) restarted |= e["kind"] == "coordinator-restarted";
  EXPECT_TRUE(restarted);
}

TEST_F(ClusterTest, ZzWorkerKill9IsMarkedLostWithinThreeSeconds) {
  const int pid = WorkerPid("worker-1");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const int64_t start = NowMs();
  std::string state;
  while (NowMs() - start < 10000) {
    for (auto& w : StrataJson("workers")) {
      if (w["worker_id"] == "worker-1") state = w["state"];
    }
    if (state == "lost") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int64_t elapsed = NowMs() - start;
  EXPECT_EQ(state, "lost");
  EXPECT_LE(elapsed, 3000) << "took " << elapsed << " ms";
}

// A worker lost mid-run makes the run smaller (dp 2 -> 1 on the survivor, no replacement within
// the grace); when the worker comes back (`strata up` starts it again), the run takes it back at
// its next complete checkpoint, dp 1 -> 2, and finishes with the fault-free losses (same global
// batch throughout).
class GrowBackTest : public ClusterTest {
 protected:
  static constexpr const char* kUp =
      "up --workers 2 --heartbeat-timeout-ms 1000 --replace-grace-ms 0 --grow-back-min-saving-s 0";
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-grow-XXXXXX");
    auto up = Strata(kUp);
    ASSERT_EQ(up.rc, 0) << up.err;
  }

  static json WaitFor(const std::string& run, const std::function<bool(const json&)>& done, const std::string& what) {
    const int64_t deadline = NowMs() + 60000;
    json status;
    while (NowMs() < deadline) {
      status = StrataJson("status " + run);
      if (done(status)) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "run " << run << ": " << what << " did not happen within 60 s; last status " << status.dump();
    return status;
  }
};

TEST_F(GrowBackTest, ARunShrunkByALostWorkerTakesItBackAtItsNextCheckpoint) {
  const int steps = 300;
  const std::string clean = SubmitAndFollow("grow-free", Spec("grow-free", 2, steps, 10));
  const auto clean_losses = StrataJson("status " + clean)["losses"].get<std::vector<double>>();
  ASSERT_EQ(clean_losses.size(), static_cast<size_t>(steps));

  auto submitted = Strata("submit " + WriteSpec("grow", Spec("grow", 2, steps, 10)));
  ASSERT_EQ(submitted.rc, 0) << submitted.err;
  const std::string run = submitted.out.substr(0, submitted.out.find('\n'));
  const json before = WaitFor(
      run, [](const json& s) { return s["step"].get<int64_t>() >= 30; }, "step 30");
  ASSERT_EQ(before["world_size"], 2);
  const std::string victim = before["workers"][1];
  ASSERT_EQ(kill(WorkerPid(victim), SIGKILL), 0);
  WaitFor(
      run, [](const json& s) { return s["world_size"] == 1 && s["state"] == "running"; },
      "the re-plan onto the survivor");
  auto up = Strata(kUp);  // starts the killed worker again
  ASSERT_EQ(up.rc, 0) << up.err;

  Strata("status " + run + " --watch");
  const json status = StrataJson("status " + run);
  ASSERT_EQ(status["state"], "finished") << status.dump();
  EXPECT_EQ(status["world_size"], 2) << "the run did not take the worker back";
  std::string shrank, grew;
  for (auto& e : StrataJson("events " + run)) {
    if (e["kind"] == "replanned") shrank = e["message"];
    if (e["kind"] == "grew") grew = e["message"];
  }
  EXPECT_NE(shrank.find("dp 2 -> 1"), std::string::npos) << shrank;
  EXPECT_NE(grew.find("dp 1 -> 2"), std::string::npos) << grew;
  EXPECT_NE(grew.find("resuming from the checkpoint at step"), std::string::npos) << grew;
  const auto losses = status["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), clean_losses.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    ASSERT_NEAR(losses[i], clean_losses[i], 1e-5 * std::abs(clean_losses[i])) << "step " << i + 1;
  }
}

// With the defaults (no train.checkpoint_every or keep_checkpoints in the spec) a worker lost in
// the last tenth of a long run costs at most a tenth of it: the run checkpoints every tenth of
// its steps, resumes from the newest on the survivor, finishes, and keeps the newest 3.
class DefaultCheckpointsTest : public GrowBackTest {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeClusterScratchDir("/tmp/strata-defaults-XXXXXX");
    auto up = Strata(kUp);
    ASSERT_EQ(up.rc, 0) << up.err;
  }
};

TEST_F(DefaultCheckpointsTest, AWorkerLostLateResumesFromTheLastTenthAndThreeCheckpointsAreKept) {
  const int steps = 400;  // a checkpoint every 40 steps; about 30 s on two CPU workers
  std::string spec = Spec("late-loss", 2, steps, 0);
  for (const std::string line : {"checkpoint_every = 0\n", "keep_checkpoints = 0\n"})
    spec.erase(spec.find(line), line.size());  // the defaults
  auto submitted = Strata("submit " + WriteSpec("late-loss", spec));
  ASSERT_EQ(submitted.rc, 0) << submitted.err;
  const std::string run = submitted.out.substr(0, submitted.out.find('\n'));
  const json before = WaitFor(
      run, [&](const json& s) { return s["step"].get<int64_t>() >= steps * 9 / 10 + 5; }, "the last tenth");
  ASSERT_EQ(before["world_size"], 2);
  ASSERT_EQ(kill(WorkerPid(before["workers"][1]), SIGKILL), 0);
  Strata("status " + run + " --watch");
  const json status = StrataJson("status " + run);
  ASSERT_EQ(status["state"], "finished") << status.dump();
  EXPECT_EQ(status["checkpoints"]["every_steps"], steps / 10) << status.dump();
  EXPECT_EQ(status["checkpoints"]["keep"], 3) << status.dump();
  int64_t lost_at = -1, resumed_from = -1;
  std::smatch number;
  for (auto& e : StrataJson("events " + run)) {
    const std::string message = e["message"];
    if (e["kind"] == "worker-lost" && std::regex_search(message, number, std::regex(R"(at step (\d+))")))
      lost_at = std::stoll(number[1]);
    if (e["kind"] == "recovering" && std::regex_search(message, number, std::regex(R"(checkpoint at step (\d+))")))
      resumed_from = std::stoll(number[1]);
  }
  ASSERT_GE(lost_at, steps * 9 / 10) << StrataJson("events " + run).dump();
  EXPECT_GE(resumed_from, steps * 9 / 10)
      << "resumed from step " << resumed_from << " after losing a worker at step " << lost_at;
  EXPECT_LE(lost_at - resumed_from, steps / 10);
  int complete = 0;
  for (auto& c : StrataJson("checkpoints " + run)) complete += c["state"] == "complete";
  EXPECT_EQ(complete, 3) << StrataJson("checkpoints " + run).dump();
}

// A damaged checkpoint found while resuming: the run does not fail; it falls back to the next
// older complete checkpoint, the journal says why, and nothing stored is deleted. The damage is
// made with the cluster down, beside the store's API (a committed checkpoint is immutable through
// it), so the next resume meets it as a disk fault would look: a RocksDB record cut short, or a
// checkpoint data file cut short.
class DamagedCheckpointTest : public ClusterTest {
 protected:
  // `source`: 8 steps on one worker with a checkpoint every 2, whose step-8 shard is in `store`.
  void ResumeFallsBackToStep6(const std::string& source) {
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
    auto r = Strata("submit " + WriteSpec("resumed", Spec("resumed", 1, 10, 0)) + " --resume " + source + " --follow");
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    const std::string resumed = r.out.substr(0, r.out.find('\n'));
    const json status = StrataJson("status " + resumed);
    EXPECT_EQ(status["state"], "finished");
    std::string said;
    for (auto& e : StrataJson("events " + resumed)) {
      if (e["kind"] == "checkpoint-unreadable") said = e["message"];
    }
    EXPECT_NE(said.find("at step 8"), std::string::npos) << said;
    EXPECT_NE(said.find("resuming from the checkpoint at step 6"), std::string::npos) << said;
    // Steps 7 and 8 were trained again from step 6's checkpoint: the same losses as the source's.
    const auto before = StrataJson("status " + source)["losses"].get<std::vector<double>>();
    const auto after = status["losses"].get<std::vector<double>>();
    ASSERT_EQ(after.size(), 10u);
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_NEAR(after[i], before[i], 1e-5 * std::abs(before[i])) << "step " << i + 1;
    // The damaged checkpoint is still listed (kept, not deleted) as unreadable, never as
    // complete; a plain resume now skips it.
    EXPECT_EQ(StrataJson("checkpoints " + source).back()["step"], 8);
    EXPECT_EQ(StrataJson("checkpoints " + source).back()["state"], "unreadable");
  }

  // Cuts the step-8 data file of run `source` in `store` (STORE/checkpoints/<hex of the run>/) in half.
  static void CutStep8DataFile(const std::string& store, const std::string& source) {
    int cut = 0;
    for (const auto& entry : std::filesystem::directory_iterator(store + "/checkpoints/" + HexOf(source))) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("8-", 0) != 0 || entry.path().extension() != ".bin") continue;
      std::filesystem::resize_file(entry.path(), std::filesystem::file_size(entry.path()) / 2);
      ++cut;
    }
    ASSERT_EQ(cut, 1) << "the step-8 shard has no data file in " << store;
  }
};

// Issue #20: `--resume RUN@8` of a damaged step used to start from step 6 with only an event to
// say so. The step was named: the run fails naming it and the older one to use; asked again, the
// submit itself is refused.
TEST_F(DamagedCheckpointTest, ZzExplicitResumeOfADamagedStepFailsInsteadOfTakingAnOlderOne) {
  const std::string source = SubmitAndFollow("named", Spec("named", 1, 8, 2));
  const json checkpoints = StrataJson("checkpoints " + source);
  ASSERT_EQ(checkpoints.back()["step"], 8) << checkpoints.dump();
  ASSERT_EQ(Strata("down").rc, 0);
  CutStep8DataFile(checkpoints.back()["shards"][0]["store_path"], source);
  ASSERT_EQ(Strata("up --workers 2").rc, 0);
  auto r = Strata("submit " + WriteSpec("named-resumed", Spec("named-resumed", 1, 10, 0)) + " --resume " + source +
                  "@8 --follow");
  EXPECT_NE(r.rc, 0) << r.out;
  const std::string resumed = r.out.substr(0, r.out.find('\n'));
  const json status = StrataJson("status " + resumed);
  EXPECT_EQ(status["state"], "failed");
  EXPECT_NE(status["message"].get<std::string>().find(source + "@6"), std::string::npos) << status["message"];
  auto again =
      Strata("submit " + WriteSpec("named-again", Spec("named-again", 1, 10, 0)) + " --resume " + source + "@8");
  EXPECT_EQ(again.rc, 2) << again.out << again.err;
  EXPECT_NE(again.err.find("unreadable"), std::string::npos) << again.err;
}

TEST_F(DamagedCheckpointTest, ZzTruncatedRecordFallsBackToTheOlderOne) {
  const std::string source = SubmitAndFollow("damaged", Spec("damaged", 1, 8, 2));
  const json checkpoints = StrataJson("checkpoints " + source);
  ASSERT_EQ(checkpoints.back()["step"], 8) << checkpoints.dump();
  const std::string store = checkpoints.back()["shards"][0]["store_path"];
  const std::string piece = checkpoints.back()["shards"][0]["tensors"][0]["name"];
  ASSERT_EQ(Strata("down").rc, 0);
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const char* name : {"default", "checkpoints", "activations", "metadata"})
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), store, families, &handles, &raw).ok()) << store;
    // A truncated record: a few bytes where a header and a tensor (or its reference) were.
    EXPECT_TRUE(
        raw->Put(rocksdb::WriteOptions(), handles[1], storage::keys::TensorKey(source, 8, piece), "trunc").ok());
    for (auto* h : handles) raw->DestroyColumnFamilyHandle(h);
    EXPECT_TRUE(raw->Close().ok());
    delete raw;
  }
  ResumeFallsBackToStep6(source);
}

TEST_F(DamagedCheckpointTest, ZzTruncatedDataFileFallsBackToTheOlderOne) {
  const std::string source = SubmitAndFollow("cut-file", Spec("cut-file", 1, 8, 2));
  const json checkpoints = StrataJson("checkpoints " + source);
  ASSERT_EQ(checkpoints.back()["step"], 8) << checkpoints.dump();
  ASSERT_EQ(Strata("down").rc, 0);
  // The step-8 data file (STORE/checkpoints/<hex of the run>/8-*.bin) loses its second half.
  CutStep8DataFile(checkpoints.back()["shards"][0]["store_path"], source);
  ResumeFallsBackToStep6(source);
}

}  // namespace
}  // namespace strata
