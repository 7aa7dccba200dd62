#include "cli/plan_command.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command_set.h"
#include "cli/exit.h"
#include "client/coordinator_client.h"
#include "client/estimate.h"
#include "client/spec_overrides.h"
#include "common/byte_size.h"
#include "model/parameters.h"
#include "schema/envelope.h"
#include "shard/capacity.h"
#include "shard/layout.h"
#include "shard/planner.h"
#include "spec/run_spec.h"
#include "spec/toml_text.h"

namespace strata::cli {
namespace {

using client::ClusterFromCoordinator;
using client::Gib;
using json = nlohmann::json;

// A regular file of at most 1 MiB (spec/run_spec.h): never blocks on a FIFO or reads /dev/zero.
Result<std::string> ReadText(const std::string& path, const std::string& what) { return ReadSpecFile(path, what); }

Result<shard::ClusterView> ClusterFromSpec(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadText(path, "--cluster-spec"));
  STRATA_RETURN_IF_ERROR(CheckTomlText(text, "--cluster-spec " + path));
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "--cluster-spec " << path << " is not valid TOML at line " << e.source().begin.line << ": "
        << e.description();
    return InvalidArgument(msg.str());
  }
  const toml::array* nodes = root["nodes"].as_array();
  if (!nodes || nodes->empty()) {
    return InvalidArgument("--cluster-spec " + path +
                           " describes no GPUs: add at least one [[nodes]] table with count, gpus and memory");
  }
  shard::ClusterView view;
  int group = 0;
  for (const auto& node : *nodes) {
    const toml::table* t = node.as_table();
    const std::string where = "--cluster-spec " + path + ": nodes[" + std::to_string(group) + "].";
    if (!t) return InvalidArgument(where + " must be a table");
    const int64_t count = t->get("count") ? t->get("count")->value_or<int64_t>(-1) : 1;
    const int64_t gpus = t->get("gpus") ? t->get("gpus")->value_or<int64_t>(-1) : -1;
    if (count < 1) return InvalidArgument(where + "count must be an integer >= 1");
    if (gpus < 1) return InvalidArgument(where + "gpus must be an integer >= 1 (workers per node)");
    const std::string memory_text = t->get("memory") ? t->get("memory")->value_or<std::string>("") : "";
    if (memory_text.empty()) return InvalidArgument(where + "memory is missing: the memory of one GPU, e.g. \"80GiB\"");
    STRATA_ASSIGN_OR_RETURN(uint64_t memory, ParseByteSize(memory_text, where + "memory"));
    uint64_t free = memory;
    if (t->get("free")) {
      STRATA_ASSIGN_OR_RETURN(free, ParseByteSize(t->get("free")->value_or<std::string>("?"), where + "free"));
    }
    if (memory == 0) return InvalidArgument(where + "memory must be more than 0");
    if (free > memory)
      return InvalidArgument(where + "free (" + HumanBytes(free) + ") exceeds memory (" + HumanBytes(memory) + ")");
    const std::string link = t->get("link") ? t->get("link")->value_or<std::string>("?") : "nvlink";
    if (link != "nvlink" && link != "pcie" && link != "tcp")
      return InvalidArgument(where + "link must be nvlink, pcie or tcp");
    uint64_t host_memory = 0;  // 0: not given, offload's host memory not checked
    if (t->get("host_memory")) {
      STRATA_ASSIGN_OR_RETURN(host_memory,
                              ParseByteSize(t->get("host_memory")->value_or<std::string>("?"), where + "host_memory"));
      if (host_memory == 0)
        return InvalidArgument(where + "host_memory must be more than 0 (leave it out to not check host memory)");
    }
    const double tflops = t->get("tflops") ? t->get("tflops")->value_or<double>(-1) : 989.0;
    if (!(tflops > 0)) return InvalidArgument(where + "tflops must be a number > 0");
    for (int64_t n = 0; n < count; ++n) {
      for (int64_t g = 0; g < gpus; ++g) {
        shard::WorkerView w;
        w.node = "node" + std::to_string(group) + "-" + std::to_string(n);
        w.name = w.node + "/gpu" + std::to_string(g);
        w.total_bytes = static_cast<int64_t>(memory);
        w.free_bytes = static_cast<int64_t>(free);
        w.link = link;
        w.peak_flops = tflops * 1e12;
        w.host_free_bytes = static_cast<int64_t>(host_memory);
        view.workers.push_back(std::move(w));
      }
    }
    ++group;
  }
  return view;
}

json EstimateJson(const shard::MemoryEstimate& m) {
  return {{"weights", m.weights},
          {"gradients", m.gradients},
          {"optimizer_state", m.optimizer_state},
          {"activations", m.activations},
          {"communication_buffers", m.communication_buffers},
          {"workspace", m.workspace},
          {"total", m.total()},
          {"host", m.host}};
}

}  // namespace

int PlanRun(const PlanRequest& request, const Result<CoordinatorAddress>& coordinator) {
  auto text = ReadText(request.spec_path, "run spec");
  if (!text.ok()) return Fail(text.status());
  if (!request.overrides.empty()) text = client::ApplySpecOverrides(*text, request.overrides);
  if (!text.ok()) return Fail(text.status());
  const std::string base = std::filesystem::absolute(request.spec_path).parent_path().string();
  auto spec = ParseRunSpec(*text, base, /*check_files=*/false);
  if (!spec.ok()) return Fail(Status(spec.status().code(), request.spec_path + ": " + spec.status().message()));
  // Only what the spec states is fixed; the rest of [parallel] is searched, as submit will.
  const shard::JobSpec job = shard::JobForRun(*spec);
  Result<shard::ClusterView> cluster = request.cluster_spec.empty() ? Result<shard::ClusterView>(coordinator.status())
                                                                    : ClusterFromSpec(request.cluster_spec);
  if (request.cluster_spec.empty() && coordinator.ok()) {
    client::CoordinatorClient client(coordinator->endpoint, 3000, coordinator->keys);
    cluster = ClusterFromCoordinator(client);
    if (cluster.ok() && cluster->workers.empty()) {
      cluster = Unavailable("the cluster has no live workers to plan for; `strata up` or pass --cluster-spec FILE");
    }
  }
  if (!cluster.ok()) return Fail(cluster.status());
  auto plan = shard::ChoosePlan(spec->model, job, *cluster);
  if (!plan.ok()) return Fail(plan.status());
  const shard::Plan& p = *plan;
  // What each way of holding the optimizer state would train here, at this model's width.
  const std::vector<shard::Capacity> capacities = shard::LargestTrainable(spec->model, job, *cluster);
  std::string recompute;
  for (bool r : p.recompute) recompute += r ? "1" : "0";
  if (request.as_json) {
    json workers = json::array();
    for (const auto& w : p.workers) {
      workers.push_back({{"worker", w.worker},
                         {"stage", w.stage},
                         {"dp_rank", w.dp_rank},
                         {"tp_rank", w.tp_rank},
                         {"estimate", EstimateJson(w.memory)},
                         {"budget", w.budget_bytes}});
    }
    json stages = json::array();
    for (const auto& s : p.stages) stages.push_back({s.begin, s.end});
    json out = {{"parameters", shard::ParameterCount(spec->model)},
                {"dp", p.dp},
                {"pp", p.pp},
                {"tp", p.tp},
                {"zero", p.zero},
                {"micro_batch", p.micro_batch},
                {"gradient_accumulation", p.gradient_accumulation},
                {"recompute", p.recompute},
                {"offload", std::string(Name(p.offload))},
                {"keep_gathered", p.keep_gathered},
                {"vocab_parallel", shard::VocabParallel(spec->model, p.tp)},
                {"sequence_parallel", shard::SequenceParallel(*spec, p.tp)},
                {"stages", stages},
                {"step_time_s",
                 {{"compute", p.step_time.compute_s},
                  {"communication", p.step_time.communication_s},
                  {"bubble", p.step_time.bubble_s},
                  {"total", p.step_time.total_s()}}},
                {"why", p.why},
                {"workers", workers}};
    json largest = json::array();
    for (const auto& c : capacities) {
      largest.push_back({{"option", c.option.name},
                         {"optimizer", std::string(Name(c.option.optimizer))},
                         {"offload", std::string(Name(c.option.offload))},
                         {"lora", c.option.lora.enabled ? json{{"rank", c.option.lora.rank},
                                                               {"base", std::string(Name(c.option.lora.base))}}
                                                        : json(nullptr)},
                         {"layers", c.layers},
                         {"parameters", c.parameters},
                         {"plan", c.plan},
                         {"this_model", {{"fits", c.model_fits}, {"peak", c.model_peak}, {"plan", c.model_plan}}}});
    }
    out["largest_trainable"] = largest;
    if (spec->lora.enabled) out["trainable_parameters"] = model::LoraParameterCount(spec->model, spec->lora);
    std::cout << out.dump(2) << std::endl;
    return kExitOk;
  }
  std::cout << spec->name << ": " << shard::ParameterCount(spec->model) << " parameters";
  if (spec->lora.enabled) {
    std::cout << " (frozen; LoRA r=" << spec->lora.rank << " trains "
              << model::LoraParameterCount(spec->model, spec->lora) << ")";
  }
  std::cout << " on " << cluster->workers.size() << " worker(s)\n";
  std::cout << "plan: dp=" << p.dp << " pp=" << p.pp << " tp=" << p.tp << " zero=" << p.zero << ", micro-batch "
            << p.micro_batch << " x " << p.gradient_accumulation << " accumulation, recompute per stage " << recompute
            << (p.offload == shard::Offload::kOptimizer ? ", optimizer offloaded to host"
                : p.offload == shard::Offload::kOptimizerAndParams
                    ? ", optimizer and parameters offloaded to host (streamed a layer at a time)"
                    : "")
            << (p.keep_gathered > 0 ? ", keep_gathered " + std::to_string(p.keep_gathered) +
                                          " (layers a stage keeps gathered for the backward)"
                                    : "")
            << "\n";
  if (p.tp > 1) {
    const int64_t vocab = spec->model.vocab;
    if (shard::VocabParallel(spec->model, p.tp)) {
      std::cout << "vocabulary: " << vocab << " rows split over tp=" << p.tp << " (each rank holds and multiplies "
                << vocab / p.tp << " rows of the embedding and the head)\n";
    } else {
      // The next multiple of 64 x tp: each rank's rows stay aligned for the head's matmul.
      const int64_t step = 64 * p.tp, padded = (vocab + step - 1) / step * step;
      std::cout << "vocabulary: " << vocab << " rows do not divide by tp=" << p.tp
                << ", so every rank holds the whole embedding and head; model.vocab = " << padded
                << " (padded with unused ids) would split them - for a model trained from scratch: published weights"
                   " keep their vocabulary\n";
    }
    const int64_t sequence = spec->model.sequence;
    if (shard::SequenceParallel(*spec, p.tp)) {
      std::cout << "sequence parallel: norms and residual adds on " << sequence / p.tp << " of each sequence's "
                << sequence << " tokens a rank (parallel.sequence_parallel = false runs them on every token)\n";
    } else if (!spec->parallel.sequence_parallel) {
      std::cout
          << "sequence parallel: off (parallel.sequence_parallel = false); every rank runs the norms on every token\n";
    } else {
      std::cout << "sequence parallel: off - tp=" << p.tp << " does not divide model.sequence = " << sequence
                << "; every rank runs the norms on every token\n";
    }
  }
  std::cout << std::fixed << std::setprecision(4) << "predicted step: " << p.step_time.total_s() << " s (compute "
            << p.step_time.compute_s << ", communication " << p.step_time.communication_s << ", pipeline bubble "
            << p.step_time.bubble_s << ")\n";
  std::cout << "why: " << p.why << "\n\n";
  // Identical rows (same stage and estimate) are shown once with a count: 4096 GPUs fit a screen.
  struct Row {
    shard::WorkerAssignment w;
    int count = 0;
  };
  std::vector<Row> rows;
  for (const auto& w : p.workers) {
    if (!rows.empty() && rows.back().w.stage == w.stage && rows.back().w.memory.total() == w.memory.total() &&
        rows.back().w.budget_bytes == w.budget_bytes) {
      ++rows.back().count;
      continue;
    }
    rows.push_back({w, 1});
  }
  std::cout << std::left << std::setw(22) << "WORKER" << std::setw(7) << "STAGE" << std::setw(9) << "WEIGHTS"
            << std::setw(8) << "GRADS" << std::setw(8) << "OPTIM" << std::setw(8) << "ACTIV" << std::setw(8) << "COMM"
            << std::setw(8) << "WORK" << std::setw(9) << "TOTAL" << std::setw(10) << "BUDGET"
            << "HEADROOM (GiB)\n";
  for (const auto& r : rows) {
    const auto& m = r.w.memory;
    const std::string name = r.count > 1 ? r.w.worker + " +" + std::to_string(r.count - 1) : r.w.worker;
    std::cout << std::setw(22) << name << std::setw(7) << r.w.stage << std::setw(9) << Gib(m.weights) << std::setw(8)
              << Gib(m.gradients) << std::setw(8) << Gib(m.optimizer_state) << std::setw(8) << Gib(m.activations)
              << std::setw(8) << Gib(m.communication_buffers) << std::setw(8) << Gib(m.workspace) << std::setw(9)
              << Gib(m.total()) << std::setw(10) << Gib(r.w.budget_bytes) << Gib(r.w.budget_bytes - m.total()) << "\n";
  }
  std::cout << "(budget = free memory less a 10% margin)\n";
  if (p.offload != shard::Offload::kNone) {
    std::cout << "host memory for the offloaded state: " << Gib(p.workers.front().memory.host)
              << " GiB on each worker of the first stage (m, v, a master copy of the parameters and a gradient buffer"
              << (p.offload == shard::Offload::kOptimizerAndParams ? ", which the GPU streams its layers from" : "")
              << ")\n";
  }
  std::cout << "\n";
  std::cout << "each way of holding the training state on these workers: this model's peak, and the largest model of"
               " this width (hidden "
            << spec->model.hidden << ", ffn " << spec->model.ffn << ", vocab " << spec->model.vocab << ", sequence "
            << spec->model.sequence << ") it trains:\n";
  for (const auto& c : capacities) {
    std::cout << "  " << std::left << std::setw(40) << c.option.name;
    if (c.model_fits) {
      std::cout << "this model: peak " << std::fixed << std::setprecision(2) << Gib(c.model_peak) << " GiB ("
                << c.model_plan << ")\n";
    } else {
      std::cout << "this model does not fit: " << c.model_plan << "\n";
    }
    std::cout << "  " << std::setw(40) << "";
    if (c.layers == 0) {
      std::cout << "not even 1 layer: " << c.plan << "\n";
      continue;
    }
    std::cout << "largest: " << c.layers << " layers, " << std::fixed << std::setprecision(2) << c.parameters / 1e9
              << "B parameters (" << c.plan << ")\n";
  }
  std::cout << "(set train.optimizer, parallel.offload or a [lora] table in the spec to use one; docs/lora.md)"
            << std::endl;
  return kExitOk;
}

void RegisterPlanCommand(CommandSet& set) {
  GlobalOptions& g = set.global();
  auto plan = std::make_shared<PlanRequest>();
  auto* plan_cmd = set.Add(
      "plan", "the planner's mesh, ZeRO stage and micro-batch for a run spec, with each worker's memory estimate",
      [&g, plan] {
        return PlanRun(*plan, plan->cluster_spec.empty() ? client::Coordinator(g)
                                                         : Result<CoordinatorAddress>(CoordinatorAddress{}));
      });
  plan_cmd->add_option("spec", plan->spec_path, "run spec file")->required();
  plan_cmd->add_option("--cluster-spec", plan->cluster_spec,
                       "plan for a described cluster (TOML [[nodes]]) instead of the live one");
  plan_cmd->add_flag("--json", plan->as_json, "machine-readable output");
  plan_cmd->add_option("--set", plan->overrides,
                       "KEY=VALUE: set a spec key before planning, typed like it (e.g. --set train.global_batch=16)");
}

}  // namespace strata::cli
