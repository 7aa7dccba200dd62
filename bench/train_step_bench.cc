// Training throughput and peak memory of Strata's trainer on one device, for comparison with
// bench/pytorch_train_baseline.py (same model, batch, precision and optimizer).
//
//   train_step_bench --family gpt2|llama --layers 12 --hidden 768 --heads 12 --vocab 50257
//                    --sequence 1024 --batch 8 --micro-batch 8 --precision bf16 --steps 10
//                    [--cuda-graphs 0]   (train.cuda_graphs, on by default)
//                    [--optimizer adamw8bit]   (train.optimizer)
//                    [--offload optimizer]     (parallel.offload)
//                    [--markov 1]   (learnable tokens: below)
//                    [--lora-rank 16 [--lora-base nf4]]   (LoRA on every linear, alpha 2 x rank;
//                                                          --family first)
//
// Prints one JSON line: tokens/s over the timed steps (after warm-up), the allocator's peak, the
// optimizer state's bytes (its tensors: moments or codes and scales) and the mean loss of the
// last 20 steps.
// Tokens are uniform random (throughput does not depend on the text), or with --markov 1 a
// chain in which each token is followed by one of 4 fixed successors, uniformly: a model can
// learn it down to ln 4 = 1.386 nats, so long runs of two optimizers can be compared by loss.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <type_traits>

#include "worker/torch_executor.h"
#include "worker/train/device_memory.h"
#include "worker/train/trainer.h"

// --profile FILE: a Kineto trace (chrome JSON) of two more steps, LibTorch 2.x only
// (worker/train/device_memory.h StepProfiler); bench/summarize_trace.py groups its GPU kernels.

namespace {}  // namespace

int main(int argc, char** argv) {
  strata::RunSpec spec;
  spec.model.family = strata::Family::kGpt2;  // GPT-2 124M unless flags say otherwise
  spec.model.layers = 12;
  spec.model.hidden = 768;
  spec.model.heads = 12;
  spec.model.vocab = 50257;
  spec.model.sequence = 1024;
  spec.model.kv_heads = 12;
  spec.model.ffn = 3072;
  spec.train.global_batch = 8;
  spec.train.lr = 3e-4;
  spec.train.weight_decay = 0.1;
  spec.train.precision = strata::Precision::kBf16;
  int steps = 10, warmup = 3;
  std::string device = "cuda:0";
  std::string profile;
  bool markov = false;
  // A flag naming one of the run spec's choices, spelled as in its TOML.
  auto choice = [](auto* out, const std::string& flag, const std::string& v) {
    using E = std::remove_pointer_t<decltype(out)>;
    if (const auto value = strata::ParseChoice<E>(v)) {
      *out = *value;
      return true;
    }
    std::fprintf(stderr, "%s %s: use %s\n", flag.c_str(), v.c_str(), strata::ChoiceList<E>().c_str());
    return false;
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--family") {
      if (!choice(&spec.model.family, k, v)) return 2;
    } else if (k == "--layers")
      spec.model.layers = std::stoll(v);
    else if (k == "--hidden")
      spec.model.hidden = std::stoll(v);
    else if (k == "--heads")
      spec.model.heads = std::stoll(v);
    else if (k == "--kv-heads")
      spec.model.kv_heads = std::stoll(v);
    else if (k == "--ffn")
      spec.model.ffn = std::stoll(v);
    else if (k == "--vocab")
      spec.model.vocab = std::stoll(v);
    else if (k == "--sequence")
      spec.model.sequence = std::stoll(v);
    else if (k == "--batch")
      spec.train.global_batch = std::stoll(v);
    else if (k == "--micro-batch")
      spec.parallel.micro_batch = std::stoll(v);
    else if (k == "--precision") {
      if (!choice(&spec.train.precision, k, v)) return 2;
    } else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--device")
      device = v;
    else if (k == "--profile")
      profile = v;
    else if (k == "--cuda-graphs")
      spec.train.cuda_graphs = v != "0";
    else if (k == "--optimizer") {
      if (!choice(&spec.train.optimizer, k, v)) return 2;
    } else if (k == "--offload") {
      if (!choice(&spec.parallel.offload, k, v)) return 2;
    } else if (k == "--zero")
      spec.parallel.zero = std::stoll(v);
    else if (k == "--markov")
      markov = v != "0";
    else if (k == "--lora-rank") {  // LoRA on every linear, alpha = 2 rank (bench/lora_bench.sh's)
      spec.lora.enabled = true;
      spec.lora.rank = std::stoll(v);
      spec.lora.alpha = 2.0 * static_cast<double>(spec.lora.rank);
      spec.lora.target_modules = strata::LoraTargetModules(spec.model.family);
    } else if (k == "--lora-base") {
      if (!choice(&spec.lora.base, k, v)) return 2;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (spec.parallel.offload == strata::Offload::kOptimizerAndParams)
    spec.parallel.zero = 3;  // its streamed path (worker/train/stage_model.h)
  if (spec.model.family == strata::Family::kLlama) spec.model.norm_eps = 1e-6;
  if (spec.model.kv_heads == 12 && spec.model.heads != 12) spec.model.kv_heads = spec.model.heads;
  spec.model.tie_embeddings = spec.model.family == strata::Family::kGpt2 || spec.model.family == strata::Family::kGemma;
  if (strata::Status valid = strata::ValidateModelSpec(spec.model, "model: "); !valid.ok()) {
    std::fprintf(stderr, "%s\n", valid.ToString().c_str());
    return 2;
  }
  spec.model.ffn = spec.model.ffn == 3072 && spec.model.hidden != 768 ? 4 * spec.model.hidden : spec.model.ffn;

  // Token ids in a u16 file (above).
  const std::string data_path = markov ? "/tmp/strata-bench-markov.u16" : "/tmp/strata-bench-tokens.u16";
  {
    std::mt19937 rng(1);
    std::vector<uint16_t> tokens(4 << 20);
    std::vector<uint16_t> successors(4 * static_cast<size_t>(spec.model.vocab));
    for (auto& s : successors) s = static_cast<uint16_t>(rng() % spec.model.vocab);
    uint16_t previous = 0;
    for (auto& t : tokens) {
      t = markov ? successors[4 * size_t{previous} + rng() % 4] : static_cast<uint16_t>(rng() % spec.model.vocab);
      previous = t;
    }
    std::ofstream(data_path, std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  }
  spec.data.path = data_path;
  spec.data.format = strata::TokenFormat::kU16;

  auto executor = strata::worker::CreateTorchExecutor({device});
  if (!executor.ok()) {
    std::fprintf(stderr, "%s\n", executor.status().ToString().c_str());
    return 1;
  }
  auto comm = strata::worker::CreateSoloCommunicator();
  strata::worker::TaskContext context;
  context.run_id = "bench";
  context.spec = spec;
  context.communicator = comm.get();
  auto data = strata::worker::TokenData::Load(spec.data, spec.model.vocab);
  auto made = strata::worker::Trainer::Create(context, std::move(data).value(), torch::Device(device));
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  strata::worker::Trainer& trainer = **made;
  double loss = 0;
  for (int s = 0; s < warmup; ++s) loss = trainer.Step().value();
  std::vector<double> losses;
  // Under offload a step's update runs on beside the next step's forward, which waits for it
  // unit by unit: the timed steps hold the updates of the steps before them (the first, the last
  // warm-up step's), as many updates as steps.
  strata::worker::UnitOptimizer::OffloadTimes offload;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    losses.push_back(loss = trainer.Step().value());  // .item() inside syncs each step
    offload.update += trainer.offload_times().update / steps;
    offload.gradient_wait += trainer.offload_times().gradient_wait / steps;
    offload.forward_wait += trainer.offload_times().forward_wait / steps;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The step's peak: Trainer::Step resets the allocator's peak between the schedule (forward and
  // backward) and the update, so the executor's own reading would hold the update's alone.
  const auto& step_memory = trainer.last_step_memory();
  const double peak_bytes =
      static_cast<double>(std::max(step_memory.schedule_peak_bytes, step_memory.update_peak_bytes));
  if (!profile.empty()) {
    strata::worker::StepProfiler profiler(profile, 1, 2);
    for (int64_t s = 1; s <= 2; ++s) {
      profiler.BeforeStep(s);
      loss = trainer.Step().value();
      profiler.AfterStep(s);
    }
  }
  int64_t params = 0;
  for (auto& [name, p] : trainer.parameters()) params += p.numel();
  const size_t tail = std::min<size_t>(20, losses.size());
  double tail_loss = 0;
  for (size_t i = losses.size() - tail; i < losses.size(); ++i) tail_loss += losses[i] / static_cast<double>(tail);
  std::printf(
      "{\"impl\": \"strata\", \"family\": \"%s\", \"params\": %ld, \"batch\": %ld, \"sequence\": %ld, \"precision\": "
      "\"%s\", \"optimizer\": \"%s\", \"offload\": \"%s\", \"cuda_graph\": %s, \"tokens_per_s\": %.0f, \"step_ms\": "
      "%.1f, \"peak_gib\": %.3f, "
      "\"optimizer_state_bytes\": %ld, \"offload_update_ms\": %.1f, \"offload_gradient_wait_ms\": %.1f, "
      "\"offload_forward_wait_ms\": %.1f, "
      "\"loss\": %.4f, \"last20_loss\": %.4f}\n",
      std::string(strata::Name(spec.model.family)).c_str(), static_cast<long>(params),
      static_cast<long>(spec.train.global_batch), static_cast<long>(spec.model.sequence),
      std::string(strata::Name(spec.train.precision)).c_str(), std::string(strata::Name(spec.train.optimizer)).c_str(),
      std::string(strata::Name(spec.parallel.offload)).c_str(), trainer.last_step_replayed_graph() ? "true" : "false",
      steps * spec.train.global_batch * spec.model.sequence / seconds, 1000 * seconds / steps,
      peak_bytes / double(1ull << 30), static_cast<long>(trainer.optimizer_state_bytes()), 1000 * offload.update,
      1000 * offload.gradient_wait, 1000 * offload.forward_wait, loss, tail_loss);
  return 0;
}
