#include "worker/train/stage_model.h"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

#include "worker/nn/fused_loss.h"
#include "worker/nn/torch_compat.h"
#include "worker/train/host_copies.h"

namespace strata::worker {

// ---------------------------------------------------------------- recomputed and ZeRO-3 calls

struct StageModel::Call {
  StageModel* model;
  std::vector<int> units;
  CallFn fn;
  bool bf16;
};

// Inputs: x (any dtype), then the leaves: every parameter of every unit (zero < 3), or each
// unit's shard (ZeRO-3).
struct UnitCallFunction : torch::autograd::Function<UnitCallFunction> {
  static StageModel::Call* CallOf(int64_t handle) { return reinterpret_cast<StageModel::Call*>(handle); }

  // The whole flat vector of each unit of the call: gathered from the shards (ZeRO-3) or the
  // unit's own storage.
  static std::vector<torch::Tensor> Gather(StageModel::Call& call) {
    std::vector<torch::Tensor> out;
    for (int u : call.units) {
      ParamUnit& unit = call.model->units_[u];
      if (!unit.sharded) {
        out.push_back(unit.flat.detach());
        continue;
      }
      auto full = torch::empty({unit.numel}, unit.flat.options().requires_grad(false));
      full.narrow(0, unit.shard_begin, unit.shard_end - unit.shard_begin).copy_(unit.flat.detach());
      AllGatherTensor(*call.model->groups_.dp, full);
      out.push_back(full);
    }
    return out;
  }

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::TensorList,
                               int64_t handle) {
    ctx->saved_data["call"] = handle;
    ctx->save_for_backward({x});
    StageModel::Call& call = *CallOf(handle);
    auto fulls = Gather(call);
    std::vector<std::vector<torch::Tensor>> views;
    for (size_t i = 0; i < fulls.size(); ++i) views.push_back(UnitViews(call.model->units_[call.units[i]], fulls[i]));
    return call.fn(x, views);  // the gathered units are dropped on return
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    StageModel::Call& call = *CallOf(ctx->saved_data["call"].toInt());
    const torch::Tensor x = ctx->get_saved_variables()[0];
    torch::AutoGradMode enable(true);
    // One leaf per parameter (views of the gathered vectors): their gradients come out separate
    // and are laid into flat vectors once, where leaves over a whole flat vector would make
    // autograd sum a zero-padded full-size gradient per parameter.
    std::vector<std::vector<torch::Tensor>> views;
    std::vector<torch::Tensor> inputs;
    const bool x_grad = x.is_floating_point() && x.requires_grad();
    torch::Tensor x_leaf = x_grad ? x.detach().requires_grad_(true) : x;
    if (x_grad) inputs.push_back(x_leaf);
    auto fulls = Gather(call);
    for (size_t i = 0; i < fulls.size(); ++i) {
      views.push_back(UnitViews(call.model->units_[call.units[i]], fulls[i]));
      for (auto& v : views.back()) {
        v = v.detach().requires_grad_(true);
        inputs.push_back(v);
      }
    }
    torch::Tensor y;
    {
      // Autocast is thread-local and the backward may run on another thread: set it again.
      compat::AutocastGuard autocast(call.model->device_, call.bf16);
      y = call.fn(x_leaf, views);
    }
    auto grads = torch::autograd::grad({y}, inputs, {grad[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    torch::autograd::variable_list out;
    out.push_back(x_grad ? grads[0] : torch::Tensor());
    size_t next = x_grad ? 1 : 0;
    for (size_t i = 0; i < views.size(); ++i) {
      ParamUnit& unit = call.model->units_[call.units[i]];
      std::vector<torch::Tensor> per_param;
      for (auto& v : views[i]) {
        torch::Tensor g = grads[next++];
        per_param.push_back(g.defined() ? g : torch::zeros_like(v));
      }
      if (!unit.sharded) {  // one gradient per parameter leaf
        out.insert(out.end(), per_param.begin(), per_param.end());
        continue;
      }
      std::vector<torch::Tensor> flat_pieces;
      for (auto& g : per_param) flat_pieces.push_back(g.to(torch::kFloat).reshape({-1}));
      auto g = torch::cat(flat_pieces);
      ReduceScatterTensor(*call.model->groups_.dp, g);  // each rank keeps its shard's sum
      out.push_back(g.narrow(0, unit.shard_begin, unit.shard_end - unit.shard_begin).clone());
    }
    out.push_back(torch::Tensor());  // the handle
    return out;
  }
};

StageModel::~StageModel() = default;

void StageModel::EndStep() {
  calls_.clear();
  tp_group_->DropUnfinished();
  if (zero3_) zero3_->EndStep();
}

StageModel::StageModel(const RunSpec& spec, const shard::MeshShape& mesh, const shard::MeshPosition& position,
                       const WeightLoader& load, torch::Device device, Groups groups, const WeightLoader& base_load)
    : spec_(spec),
      mesh_(mesh),
      position_(position),
      device_(device),
      groups_(groups),
      family_(CreateModelFamily(spec.model)),
      sequence_parallel_(shard::SequenceParallel(spec, mesh.tp)) {
  const ModelSpec& m = spec.model;
  std::map<std::string, model::Parameter> table;
  for (model::Parameter& p : model::Parameters(m)) table.emplace(p.name, std::move(p));
  const auto [first, last] = shard::StageLayers(m.layers, mesh.pp, position.stage, spec.parallel.stages);
  first_layer_ = first;
  auto add = [&](const std::string& label, std::vector<std::string> names, bool tied_copy = false) {
    AddUnit(label, names, table, tied_copy, load);
    return static_cast<int>(units_.size() - 1);
  };
  const std::string token_embedding = model::TokenEmbeddingName(m);
  if (spec.lora.enabled) {
    BuildLoraUnits(std::move(table), first, last, load, base_load);
  } else {
    if (first_stage()) {
      // The token embedding is a unit of its own: a tied head shares exactly it.
      const int tokens = add("embed", {token_embedding});
      embed_units_ = {tokens};
      if (m.tied()) wte_unit_ = tokens;
      for (const std::string& name : model::EmbeddingNames(m)) {
        if (name != token_embedding) embed_units_.push_back(add(name.substr(0, name.find('.')), {name}));
      }
    }
    const std::vector<model::Parameter> block = model::BlockParameters(m);
    for (int64_t layer = first; layer < last; ++layer) {
      std::vector<std::string> names;
      for (const model::Parameter& p : block) names.push_back(model::BlockPrefix(m, layer) + p.name);
      block_units_.push_back(add("block " + std::to_string(layer), names));
    }
    if (last_stage() && m.tied()) {
      const int norm = add("final norm", model::FinalNormNames(m));
      // Tied head: the first stage's embedding when it is on this rank, else a copy whose
      // gradient is summed with the first stage's (Megatron's embedding group).
      if (wte_unit_ < 0) tied_copy_unit_ = add("embed (tied copy)", {token_embedding}, /*tied_copy=*/true);
      head_units_ = {norm, wte_unit_ >= 0 ? wte_unit_ : tied_copy_unit_};
    } else if (last_stage()) {
      std::vector<std::string> names = model::FinalNormNames(m);
      names.push_back(model::HeadWeightName(m));
      head_units_ = {add("head", names)};
    }
  }
  if (mesh_.tp > 1) {
    // Partial gradients (ParamUnit::tp_partial): under sequence parallelism every replicated
    // parameter of a block and the final norm (read with this rank's tokens only); on any tp, a
    // weight the heads share (read with this rank's heads only).
    const std::vector<std::string> final_norm = model::FinalNormNames(m);
    for (size_t u = 0; u < units_.size(); ++u) {
      ParamUnit& unit = units_[u];
      const bool block = std::find(block_units_.begin(), block_units_.end(), static_cast<int>(u)) != block_units_.end();
      for (size_t i = 0; i < unit.names.size(); ++i) {
        const bool norm = std::find(final_norm.begin(), final_norm.end(), unit.names[i]) != final_norm.end();
        unit.tp_partial[i] = unit.replicated[i] &&
                             ((sequence_parallel_ && (block || norm)) || shard::HeadSharedWeight(m, unit.names[i]));
      }
    }
  }
  // The gradient sink and the bf16 working copies (ParamUnit): every unit whose forward takes its
  // parameters directly - not ZeRO-3 shards, not recomputed blocks.
  const bool working_copies = spec.train.precision == Precision::kBf16 && device_.is_cuda();
  working_copies_ = working_copies;
  slot_begin_.assign(units_.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    ParamUnit& unit = units_[u];
    const bool recomputed = spec.parallel.recompute && std::find(block_units_.begin(), block_units_.end(),
                                                                 static_cast<int>(u)) != block_units_.end();
    // A tied embedding on a one-stage rank has two uses per micro-batch (the lookup and the head).
    // Autograd sums a micro-batch's uses before it accumulates, so data-parallel ranks and
    // gradient accumulation add the same partial sums in the same order (dp = 2 equals dp = 1
    // with two micro-batches bit for bit); the sink would add each use on its own. It stays
    // with AccumulateGrad.
    const bool two_uses = static_cast<int>(u) == wte_unit_ &&
                          std::find(head_units_.begin(), head_units_.end(), wte_unit_) != head_units_.end();
    unit.sink = !unit.sharded && !recomputed && !two_uses;
    if (unit.sharded && !unit.on_host && !spec.parallel.recompute &&
        working_copies) {  // what ZeRO-3 gathers for the matmuls
      unit.working = torch::empty({unit.shard_end - unit.shard_begin},
                                  unit.flat.options().dtype(torch::kBFloat16).requires_grad(false));
    }
    if (!unit.sink) continue;
    unit.received.assign(unit.params.size(), 0);
    unit.uses.assign(unit.params.size(), 0);
    slot_begin_[u] = static_cast<int64_t>(slots_.size());
    for (size_t i = 0; i < unit.params.size(); ++i)
      slots_.emplace_back(unit.params[i].grad(), &unit.received[i], &unit.uses[i], this, static_cast<int>(u));
    if (working_copies) {
      unit.working = torch::empty({unit.numel}, unit.flat.options().dtype(torch::kBFloat16).requires_grad(false));
      unit.working_params = UnitViews(unit, unit.working);
    }
  }
  RefreshWorkingWeights();
  if (spec.parallel.zero == 3) {
    Zero3Shards::Layout layout;
    layout.embed_units = embed_units_;
    layout.block_units = block_units_;
    if (first_stage()) layout.call_order.push_back({embed_units_, false});  // the lookup reads fp32
    for (int b : block_units_) layout.call_order.push_back({{b}, true});
    if (last_stage()) layout.call_order.push_back({head_units_, true});
    layout.keep_gathered = spec.parallel.keep_gathered;
    layout.working_copies = working_copies;
    layout.lookups_allowed = !spec.parallel.recompute && mesh_.tp == 1 && first_stage();
    zero3_ = std::make_unique<Zero3Shards>(units_, *groups_.dp, device_, std::move(layout));
  }
  tp_group_ = std::make_unique<TensorParallelGroup>(groups_.tp, device_, mesh_.tp > 1 && spec.parallel.tp_comm_overlap,
                                                    [this](int u) { gradient_ready_(static_cast<size_t>(u)); });
  if (mesh_.tp > 1) {
    tensor_parallel_.size = mesh_.tp;
    tensor_parallel_.enter_linears = [tp = tp_group_.get(), sp = sequence_parallel_](
                                         const ParamView& p, const torch::Tensor& x,
                                         const std::vector<ProjectionName>& projections) {
      return EnterThenLinears(*tp, p, x, projections, sp);
    };
    tensor_parallel_.linear_leave = [tp = tp_group_.get(), sp = sequence_parallel_](
                                        const ParamView& p, const torch::Tensor& y, const std::string& weight) {
      return LinearThenLeave(*tp, p, y, weight, sp);
    };
    tensor_parallel_.sum_over_ranks = [tp = tp_group_.get()](const torch::Tensor& x) {
      return SumOverTensorParallelRanks(*tp, x);
    };
  }
  vocab_parallel_ = shard::VocabParallel(m, mesh_.tp);
  vocab_rows_ = vocab_parallel_ ? m.vocab / mesh_.tp : m.vocab;
  vocab_begin_ = vocab_parallel_ ? position_.tp_rank * vocab_rows_ : 0;
  if (vocab_parallel_) {
    tensor_parallel_.lookup = [tp = tp_group_.get(), begin = vocab_begin_, rows = vocab_rows_](
                                  const torch::Tensor& table, const torch::Tensor& tokens) {
      // Tokens outside this rank's rows look up row 0 and are zeroed (their gradient with them).
      const torch::Tensor local = tokens - begin;
      const torch::Tensor elsewhere = local.lt(0).logical_or(local.ge(rows));
      const torch::Tensor mine =
          torch::embedding(table, local.masked_fill(elsewhere, 0)).masked_fill(elsewhere.unsqueeze(-1), 0);
      return LeaveTensorParallel(*tp, mine, /*sequence_parallel=*/false);  // the ranks' lookups summed
    };
  }
}

void StageModel::AddUnit(const std::string& label, const std::vector<std::string>& names,
                         const std::map<std::string, model::Parameter>& table, bool tied_copy,
                         const WeightLoader& load) {
  ParamUnit unit;
  unit.label = label;
  unit.names = names;
  unit.tied_copy = tied_copy;
  std::vector<shard::TensorSplit> splits;
  for (const auto& name : names) {
    const std::vector<int64_t>& shape = table.at(name).shape;
    const shard::TensorSplit split = shard::TensorParallelSplit(spec_.model, name, shape, mesh_.tp);
    const auto slice_shape = shard::SliceShape(split, shape, mesh_.tp);
    int64_t slice_numel = 1;
    for (int64_t d : slice_shape) slice_numel *= d;
    splits.push_back(split);
    unit.shapes.push_back(slice_shape);
    unit.full_shapes.push_back(shape);
    unit.replicated.push_back(split.replicated() || mesh_.tp == 1);
    unit.tp_partial.push_back(false);  // marked once the units are known (the constructor)
    unit.column_parallel.push_back(mesh_.tp > 1 && shard::ColumnParallel(split, shape, mesh_.tp));
    unit.offsets.push_back(unit.numel);
    unit.numel += slice_numel;
  }
  const auto [begin, end] = ShardRange(static_cast<size_t>(unit.numel), static_cast<uint32_t>(mesh_.dp),
                                       static_cast<uint32_t>(position_.dp_rank));
  unit.shard_begin = static_cast<int64_t>(begin);
  unit.shard_end = static_cast<int64_t>(end);
  unit.sharded = spec_.parallel.zero == 3;
  unit.on_host = spec_.parallel.offload == Offload::kOptimizerAndParams;
  // The streamed path is the only one that reads a host shard (run_spec.cc refuses the others).
  TORCH_CHECK(!unit.on_host || (unit.sharded && !spec_.parallel.recompute),
              "parallel.offload = \"optimizer+params\" needs parallel.zero = 3 and parallel.recompute = false");
  const int64_t held_begin = unit.sharded ? unit.shard_begin : 0, held_end = unit.sharded ? unit.shard_end : unit.numel;
  torch::Tensor held =
      unit.on_host ? HostCopies::HostBuffer(device_, held_end - held_begin)
                   : torch::empty({held_end - held_begin}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  if (load) {
    // One parameter at a time: load it whole, cut this rank's slice, copy the part of the slice
    // this rank holds straight to the device.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < names.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : unit.shapes[i]) n *= d;
      const int64_t from = std::max(unit.offsets[i], held_begin), to = std::min(unit.offsets[i] + n, held_end);
      if (from >= to) continue;  // ZeRO-3: none of this parameter is in this rank's shard
      load(table.at(names[i]), [&](const torch::Tensor& whole) {
        // In the source's dtype until the device: host memory holds the source tensor and at most
        // this rank's slice of it, never an fp32 copy.
        const torch::Tensor source = whole.contiguous();
        torch::Tensor slice = source;
        if (!unit.replicated[i]) {
          slice = torch::empty(unit.shapes[i], source.options());
          shard::CopySlice(splits[i], unit.full_shapes[i], mesh_.tp, position_.tp_rank, source.element_size(),
                           static_cast<const uint8_t*>(source.data_ptr()), static_cast<uint8_t*>(slice.data_ptr()));
        }
        // To the device in the source dtype, converted there: a CPU-to-GPU copy_ that also
        // converts would widen to fp32 on the host first (twice the bytes, one thread).
        held.narrow(0, from - held_begin, to - from)
            .copy_(slice.reshape({-1}).narrow(0, from - unit.offsets[i], to - from).to(held.device()));
      });
    }
  }
  if (unit.on_host) {
    unit.flat = held;  // its uses' gradients go to the host (SetHostGradient)
  } else if (unit.sharded) {
    unit.flat = held.requires_grad_(true);  // the leaf: its gradient is this rank's shard
  } else {
    // Parameters are leaves that alias the flat vector; their gradients are views of one flat
    // buffer, so autograd accumulates into it in place (a contiguous gradient buffer).
    unit.flat = held;
    unit.grad = torch::zeros_like(unit.flat);
    for (auto& view : UnitViews(unit, unit.flat)) unit.params.push_back(view.detach().requires_grad_(true));
    auto grads = UnitViews(unit, unit.grad);
    for (size_t i = 0; i < unit.params.size(); ++i) unit.params[i].mutable_grad() = grads[i];
  }
  units_.push_back(std::move(unit));
}

ParamView StageModel::ViewOfUnit(const std::vector<int>& units, const std::vector<std::vector<torch::Tensor>>& tensors,
                                 const std::string& strip, const FrozenPart* frozen) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> views;
  std::vector<SunkParameter> sunk;
  const bool zero3_call = zero3_ && zero3_->running();
  const bool sinks = torch::GradMode::is_enabled() &&
                     (zero3_call || std::any_of(units.begin(), units.end(), [&](int u) { return units_[u].sink; }));
  for (size_t u = 0; u < units.size(); ++u) {
    ParamUnit& unit = units_[units[u]];
    for (size_t i = 0; i < unit.names.size(); ++i) {
      names.push_back(unit.names[i].substr(strip.size()));
      views.push_back(tensors[u][i]);
      if (!sinks) continue;
      // A ZeRO-3 call's unit: its slot, whose function takes the shard (or the host anchor) as
      // its autograd input.
      if (GradientSink* shard_slot = zero3_call ? zero3_->SlotOf(units[u], i) : nullptr) {
        sunk.push_back(SunkParameter{zero3_->AutogradInput(unit), shard_slot});
        continue;
      }
      GradSlot* slot =
          unit.sink ? &slots_[static_cast<size_t>(slot_begin_[static_cast<size_t>(units[u])]) + i] : nullptr;
      DeferredWeightGradients* defer = slot != nullptr && unit.column_parallel[i] ? tp_group_->deferred() : nullptr;
      sunk.push_back(SunkParameter{unit.params[i], slot, defer});
    }
  }
  ParamView view(std::move(names), std::move(views), std::move(sunk));
  if (spec_.lora.enabled) {
    if (frozen != nullptr) view.AddFrozen(frozen->names, frozen->tensors, strip, frozen->nf4);
    view.SetLora(&lora_);
  }
  return view;
}

torch::Tensor StageModel::Run(const std::vector<int>& units, const torch::Tensor& x, CallFn fn, bool recompute,
                              bool matmul_weights) {
  const bool sharded = spec_.parallel.zero == 3;
  if (before_use_) {
    for (int u : units) before_use_(static_cast<size_t>(u));
  }
  if (!recompute && !sharded) {
    std::vector<std::vector<torch::Tensor>> views;
    for (int u : units) views.push_back(units_[u].sink ? UnitValues(u, matmul_weights) : units_[u].params);
    return fn(x, views);
  }
  if (sharded && !spec_.parallel.recompute) return zero3_->Run(units, x, fn, matmul_weights, forwards_done_);
  auto call = std::make_shared<Call>(Call{this, units, std::move(fn), spec_.train.precision == Precision::kBf16});
  calls_.push_back(call);
  std::vector<torch::Tensor> leaves;
  for (int u : units) {
    if (units_[u].sharded) {
      leaves.push_back(units_[u].flat);
    } else {
      leaves.insert(leaves.end(), units_[u].params.begin(), units_[u].params.end());
    }
  }
  // An explicit TensorList: a std::vector would pass as a non-tensor argument, invisible to autograd.
  return UnitCallFunction::apply(x, torch::TensorList(leaves), reinterpret_cast<int64_t>(call.get()));
}

torch::Tensor StageModel::Embed(const torch::Tensor& tokens) {
  if (zero3_ && zero3_->LooksUpRows(tokens)) return EmbedFromShards(tokens);
  return Run(
      embed_units_, tokens,
      [this](const torch::Tensor& t, const std::vector<std::vector<torch::Tensor>>& v) {
        torch::Tensor x = family_->Embed(ViewOfUnit(embed_units_, v, "", &frozen_embed_), t, tensor_parallel_);
        // A frozen bf16 table (LoRA): the residual stream is fp32 as in full training.
        if (x.scalar_type() != torch::kFloat) x = x.to(torch::kFloat);
        return sequence_parallel_ ? ScatterToSequenceParallel(*tp_group_, x) : x;
      },
      /*recompute=*/false, /*matmul_weights=*/false);  // a lookup: the residual stream starts from the fp32 table
}

torch::Tensor StageModel::EmbedFromShards(const torch::Tensor& tokens) {
  std::vector<std::string> names;
  std::map<std::string, int> unit_of;
  for (int u : embed_units_) {
    if (before_use_) before_use_(static_cast<size_t>(u));
    names.push_back(units_[static_cast<size_t>(u)].names[0]);
    unit_of[names.back()] = u;
  }
  auto rows = [this, unit_of](const std::string& name, const torch::Tensor& ids) {
    return zero3_->LookUpRows(unit_of.at(name), ids);
  };
  const ParamView view(names, std::vector<torch::Tensor>(names.size()), {}, rows);
  torch::Tensor x = family_->Embed(view, tokens, tensor_parallel_);
  zero3_->AfterLookups();
  return x;
}

torch::Tensor StageModel::Blocks(torch::Tensor x) {
  for (size_t i = 0; i < block_units_.size(); ++i) {
    const int unit = block_units_[i];
    const std::string prefix = model::BlockPrefix(spec_.model, first_layer_ + static_cast<int64_t>(i));
    x = Run(
        {unit}, x,
        [this, unit, prefix, i](const torch::Tensor& in, const std::vector<std::vector<torch::Tensor>>& v) {
          const FrozenPart* frozen = frozen_blocks_.empty() ? nullptr : &frozen_blocks_[i];
          return family_->Block(ViewOfUnit({unit}, v, prefix, frozen), in, tensor_parallel_).resid_post;
        },
        spec_.parallel.recompute);
  }
  return x;
}

// The head's rows padded to a multiple of 64: an odd vocabulary (GPT-2's 50257) leaves the
// logits' leading dimension unaligned, and cuBLAS then falls back to slow align-1 kernels
// (measured: the largest matmul of a GPT-2 124M step ran 3x slower). Logits past the vocabulary
// are dropped (Head) or never count (HeadLoss), so nothing downstream sees the padding.
// With `into`, a head read through a gradient sink (a bf16 working copy's, or a ZeRO-3 slot's)
// is padded as it is, and the loss writes its gradient into the sink (fused_loss.h HeadGradient).
torch::Tensor StageModel::PaddedHeadWeight(const ParamView& p, HeadGradient* into) const {
  const std::string name = model::HeadWeightName(spec_.model);
  const auto [value, sunk] =
      into != nullptr && torch::GradMode::is_enabled() ? p.Sunk(name) : std::pair{p(name), nullptr};
  if (sunk != nullptr) {
    sunk->sink->CountUse();
    *into = HeadGradient{sunk->sink, sunk->param, vocab_rows_};
  }
  const torch::Tensor w = sunk != nullptr ? value.detach() : value;  // vocab_rows_ rows
  const int64_t pad = (64 - vocab_rows_ % 64) % 64;
  return pad == 0 ? w : torch::constant_pad_nd(w, {0, 0, 0, pad});
}

torch::Tensor StageModel::Head(const torch::Tensor& x) {
  return Run(
      head_units_, x,
      [this](const torch::Tensor& in, const std::vector<std::vector<torch::Tensor>>& v) {
        const ParamView p = ViewOfUnit(head_units_, v, "", &frozen_head_);
        // Whole logits need the whole head: its only caller, Trainer::Logits, runs on one rank.
        TORCH_CHECK(!vocab_parallel_, "StageModel::Head: the head is split by vocabulary over tp = ", mesh_.tp,
                    "; logits need the whole model on one rank");
        return torch::linear(family_->FinalNorm(p, in), PaddedHeadWeight(p)).narrow(-1, 0, vocab_rows_);
      },
      /*recompute=*/false);
}

torch::Tensor StageModel::HeadLoss(const torch::Tensor& x, const torch::Tensor& targets) {
  // The fused head + loss (fused_loss.h) on every device: on a GPU it is faster than LibTorch's
  // whole-logits loss and holds a fraction of its memory (docs/benchmarks.md has both); on the
  // CPU it runs kernels/'s reference.
  const torch::ScalarType compute =
      spec_.train.precision == Precision::kBf16 && device_.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  return Run(
      head_units_, x,
      [this, targets, compute](const torch::Tensor& in, const std::vector<std::vector<torch::Tensor>>& v) {
        const ParamView p = ViewOfUnit(head_units_, v, "", &frozen_head_);
        torch::Tensor normed = family_->FinalNorm(p, in);
        if (!vocab_parallel_) {
          // Every rank computes the whole loss with the whole head; under sequence parallelism from
          // every token, gathered.
          if (sequence_parallel_) normed = GatherForReplicated(*tp_group_, normed);
          HeadGradient into;
          const torch::Tensor weight = PaddedHeadWeight(p, &into);
          return LinearCrossEntropy(normed.reshape({-1, normed.size(-1)}), weight, vocab_rows_, targets.reshape({-1}),
                                    compute,
                                    /*chunk_rows=*/0, nullptr, &into);
        }
        // This rank's slice of the vocabulary; its dx is summed over the ranks by f's backward.
        Communicator* tp = groups_.tp;
        const VocabSlice slice{vocab_begin_, [tp](const torch::Tensor& mine) {
                                 auto every = torch::empty({mine.numel() * static_cast<int64_t>(tp->world_size())},
                                                           mine.options());
                                 AllGatherTensorFrom(*tp, mine, every);
                                 return every;
                               }};
        const torch::Tensor entered = EnterTensorParallel(*tp_group_, normed, sequence_parallel_);
        HeadGradient into;
        const torch::Tensor weight = PaddedHeadWeight(p, &into);
        return LinearCrossEntropy(entered.reshape({-1, entered.size(-1)}), weight, vocab_rows_, targets.reshape({-1}),
                                  compute,
                                  /*chunk_rows=*/0, &slice, &into);
      },
      /*recompute=*/false);
}

}  // namespace strata::worker
