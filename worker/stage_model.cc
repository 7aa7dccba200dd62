#include "worker/stage_model.h"

#include <map>
#include <stdexcept>

#include "worker/torch_compat.h"

namespace strata::worker {

// ---------------------------------------------------------------- collectives on tensors

namespace {

void Check(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

// Runs `op` on an fp32 contiguous buffer the communicator can use, copying back if staged.
template <typename Op>
void OnBuffer(Communicator& comm, torch::Tensor& t, Op op) {
  if (comm.world_size() == 1) return;
  TORCH_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous(), "collectives take contiguous fp32 tensors");
  const bool direct = t.is_cpu() || comm.device_buffers();
  torch::Tensor buffer = direct ? t : t.to(torch::kCPU);
  Check(op(buffer.data_ptr<float>(), static_cast<size_t>(buffer.numel())));
  if (!direct) t.copy_(buffer);
}

}  // namespace

void AllReduceTensor(Communicator& comm, torch::Tensor& t) {
  OnBuffer(comm, t, [&](float* p, size_t n) { return comm.AllReduceSum(p, n); });
}
void ReduceScatterTensor(Communicator& comm, torch::Tensor& t) {
  OnBuffer(comm, t, [&](float* p, size_t n) { return comm.ReduceScatterSum(p, n); });
}
void AllGatherTensor(Communicator& comm, torch::Tensor& t) {
  OnBuffer(comm, t, [&](float* p, size_t n) { return comm.AllGather(p, n); });
}

void SendTensor(Communicator& comm, const torch::Tensor& t, uint32_t peer) {
  auto buffer = t.detach().to(torch::kFloat).contiguous();
  if (!comm.device_buffers()) buffer = buffer.to(torch::kCPU);
  Check(comm.Send(buffer.data_ptr(), static_cast<size_t>(buffer.numel()) * sizeof(float), peer));
}

torch::Tensor RecvTensor(Communicator& comm, const std::vector<int64_t>& shape, const torch::Device& device, uint32_t peer) {
  auto buffer = torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat).device(comm.device_buffers() ? device : torch::kCPU));
  Check(comm.Recv(buffer.data_ptr(), static_cast<size_t>(buffer.numel()) * sizeof(float), peer));
  return buffer.to(device);
}

// ---------------------------------------------------------------- tensor-parallel f and g

namespace {

Communicator* CommOf(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
}

torch::Tensor AllReduced(Communicator& comm, const torch::Tensor& x) {
  auto sum = x.to(torch::kFloat).contiguous().clone();
  AllReduceTensor(comm, sum);
  return sum.to(x.scalar_type());
}

struct CopyToTensorParallelFn : torch::autograd::Function<CopyToTensorParallelFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    return {AllReduced(*CommOf(ctx), g[0]), torch::Tensor()};
  }
};

struct ReduceFromTensorParallelFn : torch::autograd::Function<ReduceFromTensorParallelFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x, int64_t comm) {
    return AllReduced(*reinterpret_cast<Communicator*>(comm), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    return {g[0], torch::Tensor()};
  }
};

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

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

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::TensorList, int64_t handle) {
    ctx->saved_data["call"] = handle;
    ctx->save_for_backward({x});
    StageModel::Call& call = *CallOf(handle);
    auto fulls = Gather(call);
    std::vector<std::vector<torch::Tensor>> views;
    for (size_t i = 0; i < fulls.size(); ++i) views.push_back(call.model->ViewsOf(call.model->units_[call.units[i]], fulls[i]));
    return call.fn(x, views);  // the gathered units are dropped on return
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
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
      views.push_back(call.model->ViewsOf(call.model->units_[call.units[i]], fulls[i]));
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

// ---------------------------------------------------------------- the stage

StageModel::StageModel(const RunSpec& spec, const shard::MeshShape& mesh, const shard::MeshPosition& position,
                       const std::vector<std::pair<std::string, torch::Tensor>>& full, torch::Device device, Groups groups,
                       Weights weights)
    : spec_(spec), mesh_(mesh), position_(position), device_(device), groups_(groups) {
  std::map<std::string, torch::Tensor> by_name(full.begin(), full.end());
  const auto [first, last] = shard::StageLayers(spec.model.layers, mesh.pp, position.stage, spec.parallel.stages);
  first_layer_ = first;
  const bool gpt2 = spec.model.family == "gpt2";
  auto add = [&](const std::string& label, std::vector<std::string> names, bool tied_copy = false) {
    AddUnit(label, names, by_name, tied_copy, weights);
    return static_cast<int>(units_.size() - 1);
  };
  if (first_stage()) {
    if (gpt2) {
      wte_unit_ = add("wte", {"wte.weight"});
      embed_units_ = {wte_unit_, add("wpe", {"wpe.weight"})};
    } else {
      embed_units_ = {add("embed", {"embed_tokens.weight"})};
    }
  }
  for (int64_t layer = first; layer < last; ++layer) {
    const std::string prefix = (gpt2 ? "h." : "layers.") + std::to_string(layer) + ".";
    std::vector<std::string> names;
    for (const auto& [name, tensor] : full) {
      if (name.compare(0, prefix.size(), prefix) == 0) names.push_back(name);
    }
    block_units_.push_back(add("block " + std::to_string(layer), names));
  }
  if (last_stage()) {
    if (gpt2) {
      const int ln_f = add("ln_f", {"ln_f.weight", "ln_f.bias"});
      // Tied head: the first stage's embedding when it is on this rank, else a copy whose
      // gradient is summed with the first stage's (Megatron's embedding group).
      if (wte_unit_ < 0) tied_copy_unit_ = add("wte (tied copy)", {"wte.weight"}, /*tied_copy=*/true);
      head_units_ = {ln_f, wte_unit_ >= 0 ? wte_unit_ : tied_copy_unit_};
    } else {
      head_units_ = {add("head", {"norm.weight", "lm_head.weight"})};
    }
  }
  if (!gpt2) {
    const int64_t d = spec.model.hidden / spec.model.heads;
    inv_freq_ = (1.0 / torch::pow(spec.model.rope_theta, torch::arange(0, d, 2, torch::kFloat) / static_cast<double>(d)))
                    .to(device_);
  }
}

void StageModel::AddUnit(const std::string& label, const std::vector<std::string>& names,
                         const std::map<std::string, torch::Tensor>& full, bool tied_copy, Weights weights) {
  ParamUnit unit;
  unit.label = label;
  unit.names = names;
  unit.tied_copy = tied_copy;
  const bool copied = weights == Weights::kCopied;
  std::vector<torch::Tensor> pieces;
  for (const auto& name : names) {
    const torch::Tensor& param = full.at(name);
    const std::vector<int64_t> shape = param.sizes().vec();
    const shard::TensorSplit split = shard::TensorParallelSplit(spec_.model, name, shape);
    const auto slice_shape = shard::SliceShape(split, shape, mesh_.tp);
    int64_t slice_numel = 1;
    for (int64_t d : slice_shape) slice_numel *= d;
    if (copied) {
      const torch::Tensor whole = param.detach().to(torch::kCPU, torch::kFloat).contiguous();
      auto slice = torch::empty(slice_shape, torch::kFloat);
      shard::CopySlice(split, shape, mesh_.tp, position_.tp_rank, sizeof(float),
                       static_cast<const uint8_t*>(whole.data_ptr()), static_cast<uint8_t*>(slice.data_ptr()));
      pieces.push_back(slice.reshape({-1}));
    }
    unit.shapes.push_back(slice_shape);
    unit.full_shapes.push_back(shape);
    unit.replicated.push_back(split.replicated() || mesh_.tp == 1);
    unit.offsets.push_back(unit.numel);
    unit.numel += slice_numel;
  }
  const auto [begin, end] = ShardRange(static_cast<size_t>(unit.numel), static_cast<uint32_t>(mesh_.dp),
                                       static_cast<uint32_t>(position_.dp_rank));
  unit.shard_begin = static_cast<int64_t>(begin);
  unit.shard_end = static_cast<int64_t>(end);
  unit.sharded = spec_.parallel.zero == 3;
  const int64_t held_begin = unit.sharded ? unit.shard_begin : 0, held_end = unit.sharded ? unit.shard_end : unit.numel;
  const auto on_device = torch::TensorOptions().dtype(torch::kFloat).device(device_);
  torch::Tensor held = copied ? torch::cat(pieces).narrow(0, held_begin, held_end - held_begin).to(device_)
                              : torch::empty({held_end - held_begin}, on_device);
  if (unit.sharded) {
    // The leaf: its gradient is this rank's shard. A narrow of the host copy is cut loose from it.
    unit.flat = (copied && device_.is_cpu() ? held.clone() : held).requires_grad_(true);
  } else {
    // Parameters are leaves that alias the flat vector; their gradients are views of one flat
    // buffer, so autograd accumulates into it in place (a contiguous gradient buffer).
    unit.flat = held;
    unit.grad = torch::zeros_like(unit.flat);
    for (auto& view : ViewsOf(unit, unit.flat)) unit.params.push_back(view.detach().requires_grad_(true));
    auto grads = ViewsOf(unit, unit.grad);
    for (size_t i = 0; i < unit.params.size(); ++i) unit.params[i].mutable_grad() = grads[i];
  }
  units_.push_back(std::move(unit));
}

std::vector<torch::Tensor> StageModel::ViewsOf(const ParamUnit& unit, const torch::Tensor& full_flat) const {
  std::vector<torch::Tensor> views;
  for (size_t i = 0; i < unit.names.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : unit.shapes[i]) n *= d;
    views.push_back(full_flat.narrow(0, unit.offsets[i], n).view(unit.shapes[i]));
  }
  return views;
}

torch::Tensor StageModel::Run(const std::vector<int>& units, const torch::Tensor& x, CallFn fn, bool recompute) {
  const bool sharded = spec_.parallel.zero == 3;
  if (!recompute && !sharded) {
    std::vector<std::vector<torch::Tensor>> views;
    for (int u : units) views.push_back(units_[u].params);
    return fn(x, views);
  }
  auto call = std::make_shared<Call>(Call{this, units, std::move(fn), spec_.train.precision == "bf16"});
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
  const bool gpt2 = spec_.model.family == "gpt2";
  return Run(embed_units_, tokens, [gpt2](const torch::Tensor& t, const std::vector<std::vector<torch::Tensor>>& v) {
    if (!gpt2) return torch::embedding(v[0][0], t);
    auto positions = torch::arange(t.size(1), torch::TensorOptions().dtype(torch::kLong).device(t.device()));
    return torch::embedding(v[0][0], t) + torch::embedding(v[1][0], positions);
  }, /*recompute=*/false);
}

torch::Tensor StageModel::Blocks(torch::Tensor x) {
  for (size_t i = 0; i < block_units_.size(); ++i) {
    const int64_t layer = first_layer_ + static_cast<int64_t>(i);
    x = Run({block_units_[i]}, x, [this, layer](const torch::Tensor& in, const std::vector<std::vector<torch::Tensor>>& v) {
      return BlockForward(layer, in, v[0]);
    }, spec_.parallel.recompute);
  }
  return x;
}

torch::Tensor StageModel::Head(const torch::Tensor& x) {
  const ModelSpec m = spec_.model;
  return Run(head_units_, x, [m](const torch::Tensor& in, const std::vector<std::vector<torch::Tensor>>& v) {
    // The head's rows padded to a multiple of 64: an odd vocabulary (GPT-2's 50257) leaves the
    // logits' leading dimension unaligned, and cuBLAS then falls back to slow align-1 kernels
    // (measured: the largest matmul of a GPT-2 124M step ran 3x slower). The padded logits are
    // sliced back to the vocabulary, so nothing downstream sees the padding.
    auto padded = [&](const torch::Tensor& w) {
      const int64_t pad = (64 - m.vocab % 64) % 64;
      return pad == 0 ? w : torch::constant_pad_nd(w, {0, 0, 0, pad});
    };
    torch::Tensor logits;
    if (m.family == "gpt2") {
      auto normed = torch::layer_norm(in, {m.hidden}, v[0][0], v[0][1], m.norm_eps);
      logits = torch::matmul(normed, padded(v[1][0]).t());  // tied LM head
    } else {
      logits = torch::linear(RmsNorm(in, v[0][0], m.norm_eps), padded(v[0][1]));
    }
    return logits.narrow(-1, 0, m.vocab);
  }, /*recompute=*/false);
}

torch::Tensor StageModel::BlockForward(int64_t layer, const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  const ParamUnit& unit = units_[block_units_[layer - first_layer_]];
  auto param = [&](const char* suffix) -> const torch::Tensor& {
    const std::string dotted = std::string(".") + suffix;
    for (size_t i = 0; i < unit.names.size(); ++i) {
      if (EndsWith(unit.names[i], dotted)) return p[i];
    }
    throw std::runtime_error(unit.label + " has no parameter " + suffix);
  };
  Communicator* tp = mesh_.tp > 1 ? groups_.tp : nullptr;
  auto f = [tp](const torch::Tensor& t) {
    return tp ? CopyToTensorParallelFn::apply(t, reinterpret_cast<int64_t>(tp)) : t;
  };
  auto g = [tp](const torch::Tensor& t) {
    return tp ? ReduceFromTensorParallelFn::apply(t, reinterpret_cast<int64_t>(tp)) : t;
  };
  const ModelSpec& m = spec_.model;
  const int64_t b = x.size(0), t = x.size(1), hd = m.hidden / m.heads, heads = m.heads / mesh_.tp;
  if (m.family == "gpt2") {
    auto a = f(torch::layer_norm(x, {m.hidden}, param("ln_1.weight"), param("ln_1.bias"), m.norm_eps));
    auto qkv = torch::linear(a, param("c_attn.weight"), param("c_attn.bias")).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape({b, t, heads * hd});
    auto h = x + (g(torch::linear(y, param("attn_proj.weight"))) + param("attn_proj.bias"));
    auto mlp = f(torch::layer_norm(h, {m.hidden}, param("ln_2.weight"), param("ln_2.bias"), m.norm_eps));
    mlp = torch::gelu(torch::linear(mlp, param("c_fc.weight"), param("c_fc.bias")), "tanh");
    return h + (g(torch::linear(mlp, param("mlp_proj.weight"))) + param("mlp_proj.bias"));
  }
  const int64_t kv_heads = m.kv_heads / mesh_.tp;
  auto positions = torch::arange(t, torch::TensorOptions().dtype(torch::kFloat).device(x.device()));
  auto freqs = torch::outer(positions, inv_freq_);
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
  auto a = f(RmsNorm(x, param("input_layernorm.weight"), m.norm_eps));
  auto q = torch::linear(a, param("q_proj.weight")).view({b, t, heads, hd}).transpose(1, 2);
  auto k = torch::linear(a, param("k_proj.weight")).view({b, t, kv_heads, hd}).transpose(1, 2);
  auto v = torch::linear(a, param("v_proj.weight")).view({b, t, kv_heads, hd}).transpose(1, 2);
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;
  if (kv_heads != heads) {  // each kv head serves heads / kv_heads consecutive query heads
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  auto y = compat::CausalAttention(q, k, v).transpose(1, 2).reshape({b, t, heads * hd});
  auto h = x + g(torch::linear(y, param("o_proj.weight")));
  auto mlp = f(RmsNorm(h, param("post_attention_layernorm.weight"), m.norm_eps));
  mlp = torch::silu(torch::linear(mlp, param("gate_proj.weight"))) * torch::linear(mlp, param("up_proj.weight"));
  return h + g(torch::linear(mlp, param("down_proj.weight")));
}

}  // namespace strata::worker
