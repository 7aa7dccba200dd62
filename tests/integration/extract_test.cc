// Extract runs end to end: `strata up` starts real coordinator and worker processes, an extract
// run captures activations into the workers' RocksDB stores, and `strata activations get` reads
// them back over the workers' store servers into .npy / .safetensors files. The reference is a
// direct forward pass of the same model in this process (same seed, same batches, one thread),
// so fp32 data must match bit for bit.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "spec/run_spec.h"
#include "storage/shard_store.h"
#include "tests/integration/harness.h"
#include "worker/extract/direct_forward.h"

namespace strata {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using testing::CommandResult;
using testing::NowMs;
using testing::ReadFile;

class ExtractTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/strata-extract-XXXXXX";
    dir_ = mkdtemp(tmpl);
    setenv("STRATA_STATE_DIR", (dir_ + "/state").c_str(), 1);
    unsetenv("STRATA_CLUSTER");
    std::ofstream corpus(dir_ + "/corpus.txt");
    std::string text;
    std::ifstream gpl("/usr/share/common-licenses/GPL-3");
    if (gpl) {
      std::stringstream ss;
      ss << gpl.rdbuf();
      text = ss.str();
    } else {
      for (int i = 0; i < 800; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    }
    for (int i = 0; i < 8; ++i) corpus << text;  // ~280k tokens: long enough to kill a worker mid-run
    corpus.close();
    auto up = Strata("up --workers 2");
    ASSERT_EQ(up.rc, 0) << up.err;
  }

  static void TearDownTestSuite() {
    Strata("down");
    // Not std::filesystem::remove_all: linked with pip PyTorch's LibTorch (GPU node) it resolves
    // to a libstdc++ copy inside LibTorch and crashes (measured; the CPU build is fine).
    if (!std::getenv("STRATA_KEEP_TEST_DIRS")) (void)std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  static CommandResult Strata(const std::string& args) {
    return testing::RunCommand(std::string(STRATA_BIN_DIR) + "/strata " + args, dir_);
  }

  static std::string WriteSpec(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << body;
    return path;
  }

  static std::string Submit(const std::string& name, const std::string& body) {
    auto r = Strata("submit " + WriteSpec(name, body));
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    std::istringstream lines(r.out);
    std::string run_id;
    std::getline(lines, run_id);
    return run_id;
  }

  static json Status(const std::string& run) {
    auto r = Strata("status " + run + " --json");
    if (r.rc != 0) return json();
    auto one = json::parse(r.out, nullptr, false);
    return one.is_object() ? one : json();
  }

  static json WaitForEnd(const std::string& run, int64_t timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    while (NowMs() < deadline) {
      json s = Status(run);
      if (s.is_object() && s["state"] != "running" && s["state"] != "pending") return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return Status(run);
  }

  static int WorkerPid(const std::string& name) {
    auto cluster = json::parse(ReadFile(dir_ + "/state/cluster.json"));
    for (auto& p : cluster["processes"]) {
      if (p["name"] == name) return p["pid"].get<int>();
    }
    return 0;
  }

  // The data section of an .npy file (format 1.0) and its header dict.
  static std::pair<std::string, std::string> ReadNpy(const std::string& path) {
    const std::string bytes = ReadFile(path);
    if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return {"", ""};
    const size_t header = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
    return {bytes.substr(10, header), bytes.substr(10 + header)};
  }

  // What the run should have stored for (layer, site): a direct forward pass in this process,
  // batch by batch as the workers do, in the stored dtype.
  static std::string Reference(const RunSpec& spec, int64_t layer, const std::string& site) {
    auto rows = worker::DirectForwardActivations(spec, layer, site);
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    return rows.ok() ? *rows : std::string();
  }

  static std::string dir_;
};
std::string ExtractTest::dir_;

const char* kGpt2Extract = R"(name = "gpt2-extract"
kind = "extract"
[model]
family = "gpt2"
layers = 3
hidden = 32
heads = 4
vocab = 256
sequence = 64
[data]
path = "corpus.txt"
[train]
seed = 7
[parallel]
dp = 2
[extract]
layers = [0, 2]
sites = ["resid_post", "attn_out", "mlp_out"]
batch = 8
tokens = 40000
)";

TEST_F(ExtractTest, TwoWorkersStoreWhatADirectForwardComputesBitForBit) {
  const std::string run = Submit("gpt2-extract", kGpt2Extract);
  json s = WaitForEnd(run, 120000);
  ASSERT_EQ(s["state"], "finished") << s.dump();
  auto spec = ParseRunSpec(kGpt2Extract, dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();

  auto listing = Strata("activations " + run + " --json");
  ASSERT_EQ(listing.rc, 0) << listing.err;
  json index = json::parse(listing.out);
  const int64_t rows = 40000 / 64 * 64;
  EXPECT_EQ(index["rows_total"], rows);
  EXPECT_EQ(index["rows_stored"], rows);
  EXPECT_EQ(index["complete"], true);
  EXPECT_EQ(index["layers"], json::array({0, 2}));
  EXPECT_EQ(index["rows_by_worker"].size(), 2u) << "both workers should hold part of the capture";
  // Its size in the status: chunks times a full chunk's records, at least what is stored and less
  // than one chunk more.
  {
    const json capture = json::parse(Strata("status " + run + " --json").out)["capture"];
    const uint64_t stored =
        index["bytes_per_layer_site"].get<uint64_t>() * index["layers"].size() * index["sites"].size();
    const uint64_t expected = capture["bytes_expected"].get<uint64_t>();
    EXPECT_EQ(capture["bytes_stored"].get<uint64_t>(), expected) << capture.dump();
    EXPECT_GE(expected, stored) << capture.dump();
    EXPECT_LT(expected, stored + expected / s["total_steps"].get<uint64_t>() + 1) << capture.dump();
    EXPECT_NE(Strata("status " + run).out.find("  stored: about"), std::string::npos);
  }

  for (int64_t layer : {0, 2}) {
    for (const std::string site : {"resid_post", "attn_out", "mlp_out"}) {
      const std::string out = dir_ + "/l" + std::to_string(layer) + site + ".npy";
      auto get =
          Strata("activations get " + run + " --layer " + std::to_string(layer) + " --site " + site + " --out " + out);
      ASSERT_EQ(get.rc, 0) << get.err;
      auto [header, data] = ReadNpy(out);
      EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
      EXPECT_NE(header.find("'shape': (" + std::to_string(rows) + ", 32)"), std::string::npos) << header;
      const std::string expected = Reference(*spec, layer, site);
      ASSERT_EQ(data.size(), expected.size());
      EXPECT_TRUE(data == expected) << "layer " << layer << " " << site << " differs from the direct forward pass";
    }
  }

  // TransformerLens' names: the hook names the layer, and the bytes are the same site's.
  {
    const std::string out = dir_ + "/tl.npy";
    auto tl = Strata("activations get " + run + " --site blocks.2.hook_mlp_out --out " + out);
    ASSERT_EQ(tl.rc, 0) << tl.err;
    EXPECT_TRUE(ReadNpy(out).second == Reference(*spec, 2, "mlp_out"));
    auto clash = Strata("activations get " + run + " --layer 0 --site blocks.2.hook_mlp_out --out " + out + "2");
    EXPECT_EQ(clash.rc, 2);
    EXPECT_NE(clash.err.find("name different layers"), std::string::npos) << clash.err;
    auto pre_rotary = Strata("activations get " + run + " --site blocks.2.attn.hook_q --out " + out + "3");
    EXPECT_EQ(pre_rotary.rc, 2);
    EXPECT_NE(pre_rotary.err.find("hook_rot_q"), std::string::npos) << pre_rotary.err;
    auto no_layer = Strata("activations get " + run + " --site mlp_out --out " + out + "4");
    EXPECT_EQ(no_layer.rc, 2);
    EXPECT_NE(no_layer.err.find("--layer is required"), std::string::npos) << no_layer.err;
  }

  // A row slice to safetensors holds exactly those rows.
  const std::string st_path = dir_ + "/slice.safetensors";
  auto get = Strata("activations get " + run + " --layer 2 --rows 1000:5000 --out " + st_path);
  ASSERT_EQ(get.rc, 0) << get.err;
  const std::string file = ReadFile(st_path);
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  json header = json::parse(file.substr(8, n));
  EXPECT_EQ(header["layer2.resid_post"]["shape"], json::array({4000, 32}));
  EXPECT_EQ(header["layer2.resid_post"]["dtype"], "F32");
  const std::string expected = Reference(*spec, 2, "resid_post").substr(1000 * 32 * 4, 4000 * 32 * 4);
  EXPECT_TRUE(file.substr(8 + n) == expected);

  // numpy loads both with the right shape and dtype (system python has numpy; skip without).
  if (fs::exists("/usr/bin/python3") && testing::RunCommand("/usr/bin/python3 -c 'import numpy'", dir_).rc == 0) {
    auto py = testing::RunCommand(
        "/usr/bin/python3 -c \"import numpy as np, json, struct; a = np.load('" + dir_ +
            "/l2mlp_out.npy'); "
            "b = open('" +
            st_path +
            "', 'rb').read(); k = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + k]); "
            "s = np.frombuffer(b[8 + k:], dtype=np.float32).reshape(h['layer2.resid_post']['shape']); "
            "print(a.shape, a.dtype, s.shape, s.dtype)\"",
        dir_);
    EXPECT_EQ(py.rc, 0) << py.err;
    EXPECT_EQ(py.out, "(" + std::to_string(rows) + ", 32) float32 (4000, 32) float32\n");
  }
}

TEST_F(ExtractTest, LayerByLayerExecutionStoresTheSameBytes) {
  // mode = "layerwise" is what a model larger than the device runs (weights visit the device one
  // block at a time); on CPU it must store exactly what the whole-model path and a direct
  // forward pass compute. "auto" on a CPU worker with room picks the whole model and says why.
  std::string body = std::regex_replace(std::string(kGpt2Extract), std::regex("tokens = 40000"),
                                        "tokens = 8192\nmode = \"layerwise\"");
  const std::string run = Submit("gpt2-layerwise", body);
  ASSERT_EQ(WaitForEnd(run, 120000)["state"], "finished");
  auto spec = ParseRunSpec(body, dir_, true);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  for (const std::string site : {"resid_post", "attn_out"}) {
    const std::string out = dir_ + "/layerwise-" + site + ".npy";
    ASSERT_EQ(Strata("activations get " + run + " --layer 2 --site " + site + " --out " + out).rc, 0);
    EXPECT_TRUE(ReadNpy(out).second == Reference(*spec, 2, site)) << site;
  }
  auto events = Strata("events " + run);
  EXPECT_NE(events.out.find("layer by layer"), std::string::npos) << events.out;
  EXPECT_NE(events.out.find("extract.mode = \"layerwise\""), std::string::npos) << events.out;

  const std::string auto_run =
      Submit("gpt2-auto", std::regex_replace(std::string(kGpt2Extract), std::regex("tokens = 40000"), "tokens = 4096"));
  ASSERT_EQ(WaitForEnd(auto_run, 60000)["state"], "finished");
  EXPECT_NE(Strata("events " + auto_run).out.find("whole model on the device"), std::string::npos);
}

TEST_F(ExtractTest, BadQueriesExitNonZeroAndLeaveNothingBehind) {
  const std::string run =
      Submit("gpt2-extract-small",
             std::regex_replace(std::string(kGpt2Extract), std::regex("tokens = 40000"), "tokens = 4096"));
  ASSERT_EQ(WaitForEnd(run, 60000)["state"], "finished");
  const std::string out = dir_ + "/bad.npy";
  auto layer = Strata("activations get " + run + " --layer 1 --out " + out);
  EXPECT_EQ(layer.rc, 2);
  EXPECT_NE(layer.err.find("layer 1 was not captured"), std::string::npos) << layer.err;
  auto site = Strata("activations get " + run + " --layer 0 --site logits --out " + out);
  EXPECT_EQ(site.rc, 2);
  EXPECT_NE(site.err.find("site logits"), std::string::npos) << site.err;
  auto rows = Strata("activations get " + run + " --layer 0 --rows 0:5000 --out " + out);
  EXPECT_EQ(rows.rc, 2);
  EXPECT_NE(rows.err.find("beyond the 4096 rows"), std::string::npos) << rows.err;
  auto path = Strata("activations get " + run + " --layer 0 --out " + dir_ + "/missing-dir/x.npy");
  EXPECT_NE(path.rc, 0);
  EXPECT_NE(path.err.find("missing-dir"), std::string::npos) << path.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  // npy on stdout, for pipes.
  auto piped = Strata("activations get " + run + " --layer 0 --rows 64:128 --out -");
  EXPECT_EQ(piped.rc, 0) << piped.err;
  EXPECT_EQ(piped.out.compare(0, 6, "\x93NUMPY"), 0);
  EXPECT_NE(piped.out.find("'shape': (64, 32)"), std::string::npos);
  // A training run has no activations.
  const std::string train = Submit("tiny-train",
                                   "name = \"tiny-train\"\n[model]\nlayers = 1\nhidden = 16\nheads = 2\nsequence = 16\n"
                                   "[data]\npath = \"corpus.txt\"\n[train]\nsteps = 1\nglobal_batch = 2\n");
  auto not_extract = Strata("activations " + train);
  EXPECT_EQ(not_extract.rc, 2);
  EXPECT_NE(not_extract.err.find("is a training run"), std::string::npos) << not_extract.err;
  WaitForEnd(train, 60000);
  auto unknown = Strata("activations no-such-run");
  EXPECT_NE(unknown.rc, 0);
  EXPECT_NE(unknown.err.find("no run 'no-such-run'"), std::string::npos) << unknown.err;
  auto bad_spec = Strata(
      "submit " + WriteSpec("bad-layer", std::regex_replace(std::string(kGpt2Extract),
                                                            std::regex("layers = \\[0, 2\\]"), "layers = [0, 3]")));
  EXPECT_EQ(bad_spec.rc, 2);
  EXPECT_NE(bad_spec.err.find("extract.layers holds 3"), std::string::npos) << bad_spec.err;
}

TEST_F(ExtractTest, KilledWorkerResumesWithEveryChunkStoredOnceAndTheSameData) {
  std::string body = std::regex_replace(std::string(kGpt2Extract), std::regex("tokens = 40000"), "tokens = 0");
  body = std::regex_replace(body, std::regex("batch = 8"), "batch = 2");
  body = std::regex_replace(body, std::regex("layers = 3"), "layers = 6");
  body = std::regex_replace(body, std::regex("layers = \\[0, 2\\]"), "layers = [1, 5]");
  const std::string run = Submit("gpt2-extract-kill", body);
  // Kill worker-1 once a few chunks are stored, and restart it as a supervisor would.
  const int64_t deadline = NowMs() + 60000;
  while (NowMs() < deadline && Status(run)["step"].get<int64_t>() < 40)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  json before = Status(run);
  ASSERT_EQ(before["state"], "running") << "the capture ended before the kill; make it longer";
  // A query during the capture returns only complete rows and says so.
  auto partial = Strata("activations get " + run + " --layer 5 --out " + dir_ + "/partial.npy");
  EXPECT_EQ(partial.rc, 0) << partial.err;
  EXPECT_NE(partial.err.find("still capturing"), std::string::npos) << partial.err;

  const int pid = WorkerPid("worker-1");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto up = Strata("up --workers 2");
  ASSERT_EQ(up.rc, 0) << up.err;

  json s = WaitForEnd(run, 240000);
  ASSERT_EQ(s["state"], "finished") << s.dump();
  auto spec = ParseRunSpec(body, dir_, true);
  ASSERT_TRUE(spec.ok());
  const int64_t total_chunks = s["total_steps"].get<int64_t>();

  // Every chunk is in exactly one store, and none was computed twice.
  std::map<uint64_t, int> copies;
  for (const std::string w : {"worker-0", "worker-1"}) {
    storage::StoreOptions options;
    options.read_only = true;
    options.create_if_missing = false;
    auto store = storage::ShardStore::Open(dir_ + "/state/workers/" + w, options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto chunks = (*store)->ListActivationChunks(run);
    ASSERT_TRUE(chunks.ok());
    for (auto& c : *chunks) ++copies[c.chunk];
  }
  EXPECT_EQ(static_cast<int64_t>(copies.size()), total_chunks);
  for (auto& [chunk, n] : copies) EXPECT_EQ(n, 1) << "chunk " << chunk << " is stored " << n << " times";
  auto events = Strata("events " + run + " --json");
  ASSERT_EQ(events.rc, 0);
  std::smatch m;
  const std::string text = events.out;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("(\\d+) chunk\\(s\\) computed, (\\d+) found"))) << text;
  // Each chunk was reported once: computed, or (stored by the killed process before it could say
  // so) found by the resumed task. A chunk computed twice would push the sum past the total.
  EXPECT_EQ(std::stoll(m[1]) + std::stoll(m[2]), total_chunks) << m[0];
  EXPECT_NE(text.find("worker-lost"), std::string::npos);

  // The data equals an uninterrupted capture: the direct forward pass.
  const std::string out = dir_ + "/killed.npy";
  ASSERT_EQ(Strata("activations get " + run + " --layer 5 --site mlp_out --out " + out).rc, 0);
  EXPECT_TRUE(ReadNpy(out).second == Reference(*spec, 5, "mlp_out"));
}

}  // namespace
}  // namespace strata
