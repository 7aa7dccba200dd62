// The trainer tests' fixture (worker/train/trainer_test.cc, trainer_sharding_test.cc): real LibTorch,
// real RocksDB stores, real ZeroMQ communicators, with the ranks as threads over ipc sockets.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "model/parameters.h"
#include "shard/layout.h"
#include "worker/nn/causal_lm.h"
#include "worker/nn/hf_format.h"
#include "worker/train/trainer.h"

namespace strata::worker {

class NullReporter : public TaskReporter {
 public:
  void ReportStep(int64_t, double, double, double, const StepMemory&) override {}
  void ReportCheckpoint(int64_t, const std::string&, const std::vector<storage::CheckpointTensorInfo>&) override {}
  void ReportChunk(const storage::ActivationChunkInfo&, bool) override {}
  void ReportNotice(const std::string&, const std::string&) override {}
  void ReportOutOfMemory(const OutOfMemoryReport&) override {}
  void ReportStalled(int64_t, const std::string&) override {}
};

// A tiny model of `family` (4 layers), with the variant fields that change its maths on.
inline ModelSpec TinyModel(const std::string& family, int64_t layers = 4) {
  ModelSpec m;
  m.family = ParseChoice<Family>(family).value();
  m.layers = layers;
  m.hidden = 32;
  m.heads = 4;
  m.vocab = 256;
  m.sequence = 32;
  if (family == "gpt2") {
    m.ffn = 128;
  } else if (family == "gpt_neox") {
    m.ffn = 96;
    m.rotary_pct = 0.5;
    m.attention_bias = true;
  } else {
    m.kv_heads = 2;
    m.ffn = 96;
    if (family == "llama") {
      m.head_dim = 16;  // != hidden / heads
      m.attention_bias = true;
      m.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 16};
    }
    if (family == "mistral") m.sliding_window = 8;
    if (family == "qwen3") m.head_dim = 16;  // the per-head q/k norms' width
    m.tie_embeddings = family == "qwen2" || family == "gemma";
  }
  EXPECT_TRUE(ValidateModelSpec(m, "").ok());
  return m;
}

inline ModelSpec LlamaModel(int64_t layers, int64_t hidden, int64_t heads, int64_t sequence, int64_t kv_heads,
                            int64_t ffn) {
  ModelSpec m;
  m.family = Family::kLlama;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.sequence = sequence;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  EXPECT_TRUE(ValidateModelSpec(m, "").ok());
  return m;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char tmpl[] = "/tmp/strata-trainer-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream out(dir_ + "/corpus.txt");
    for (int i = 0; i < 200; ++i)
      out << "the quick brown fox jumps over the lazy dog. pack my box with five dozen jugs. ";
    out.close();
    spec_.name = "t";
    spec_.model = TinyModel("gpt2", 2);
    spec_.data.path = dir_ + "/corpus.txt";
    spec_.train.global_batch = 4;
    spec_.train.lr = 3e-3;
    spec_.train.weight_decay = 0.1;
  }

  // Trains `steps` steps on the mesh of spec_.parallel (one thread per rank); returns every
  // rank's losses. `inspect` sees each rank's trainer at the end.
  std::vector<std::vector<double>> Train(int steps, const std::function<void(uint32_t, Trainer&)>& inspect = nullptr) {
    const auto world = static_cast<uint32_t>(spec_.parallel.workers());
    std::vector<std::string> addresses;
    for (uint32_t r = 0; r < world; ++r)
      addresses.push_back("ipc://" + dir_ + "/run" + std::to_string(runs_) + "r" + std::to_string(r));
    ++runs_;
    std::vector<std::vector<double>> losses(world);
    zmq::context_t zmq_context;
    std::vector<std::thread> threads;
    std::mutex inspect_mutex;
    for (uint32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        torch::set_num_threads(1);
        auto comm = CreateZmqCommunicator(zmq_context, {r, addresses, 5, 30000, std::nullopt});
        ASSERT_TRUE(comm.ok());
        TaskContext context;
        context.run_id = "run";
        context.spec = spec_;
        context.rank = r;
        context.world_size = world;
        context.communicator = comm->get();
        context.store = stores_.empty() ? nullptr : stores_[r].get();
        auto data = TokenData::Load(spec_.data, 256);
        ASSERT_TRUE(data.ok());
        auto made = Trainer::Create(context, std::move(data).value(), torch::kCPU);
        ASSERT_TRUE(made.ok()) << made.status().ToString();
        Trainer& trainer = **made;
        if (!resume_.run_id.empty()) {
          Status st = trainer.Resume(resume_);
          ASSERT_TRUE(st.ok()) << st.ToString();
        }
        while (trainer.step() < steps) {
          auto loss = trainer.Step();
          ASSERT_TRUE(loss.ok()) << loss.status().ToString();
          losses[r].push_back(*loss);
        }
        if (inspect) {
          std::lock_guard<std::mutex> lock(inspect_mutex);
          inspect(r, trainer);
        }
      });
    }
    for (auto& t : threads) t.join();
    return losses;
  }

  // Trains `step` steps on the current mesh with one store per rank (DIR/<prefix><rank>) and saves
  // a checkpoint there: the resume point of it (the stores are closed again, for the resumed
  // ranks to open read-only).
  ResumePoint CheckpointAt(int64_t step, const std::string& prefix) {
    const auto world = spec_.parallel.workers();
    for (int64_t r = 0; r < world; ++r) {
      auto store = storage::ShardStore::Open(dir_ + "/" + prefix + std::to_string(r));
      EXPECT_TRUE(store.ok());
      if (store.ok()) stores_.push_back(std::move(store).value());
    }
    ResumePoint checkpoint{"run", step, {}};
    checkpoint.shards.resize(static_cast<size_t>(world));
    Train(static_cast<int>(step), [&](uint32_t r, Trainer& t) {
      auto saved = t.SaveCheckpointShard();
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
      ResumePoint::Shard shard{dir_ + "/" + prefix + std::to_string(r), {}, {}};
      for (auto& info : saved->tensors) shard.tensors.push_back(info.name);
      checkpoint.shards[r] = shard;
    });
    stores_.clear();
    return checkpoint;
  }

  void SetMesh(int64_t dp, int64_t pp, int64_t tp, int64_t zero = 0, bool recompute = false) {
    spec_.parallel.dp = dp;
    spec_.parallel.pp = pp;
    spec_.parallel.tp = tp;
    spec_.parallel.zero = zero;
    spec_.parallel.recompute = recompute;
  }

  int runs_ = 0;
  std::vector<std::unique_ptr<storage::ShardStore>> stores_;  // one per rank when set
  ResumePoint resume_;                                        // when set, every rank starts from it
  std::string dir_;
  RunSpec spec_;
};

}  // namespace strata::worker
