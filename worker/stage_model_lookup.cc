// ZeRO-3's embedding call without its tables gathered (stage_model.h; the gathering schedule is
// stage_model_zero3.cc's).
//
// Why: a lookup reads few rows of a large table - GPT-2's token table has 38.6M parameters, a
// Llama 3's 525M, and a rank's micro-batch reads 8,192 rows. Gathered like a layer, in fp32 (the
// residual stream starts from the fp32 rows), the whole table crossed to every rank at the start
// of each forward, with nothing to run beside it, and again for the backward, which reads none of
// it; its gradient was a dense table reduce-scattered at the end of the backward.
//
// Instead, for a table [rows, c] whose flat shard [b, e) this rank holds, with n ids per rank over
// dp ranks:
//   forward   every rank's ids, gathered (dp n numbers); this rank looks them all up in the rows
//             its shard holds - zero where it holds none of a row's elements (a shard's edges may
//             cut a row, so what a rank owns is counted by element) - and the reduce-scatter of
//             those dp n rows hands each rank its own ids' rows. Every element is one rank's value
//             plus zeros, so the rows are the table's exactly.
//   backward  every rank's row gradients, gathered (dp n rows); this rank sums those of the rows
//             it holds (embedding backward over its padded rows, below) into its shard's gradient.
// Per rank that sends and receives (dp - 1) n c fp32 values in each direction, where gathering
// moved (dp - 1)/dp of the table twice and reduce-scattered its dense gradient: about
// 3 (dp - 1)/dp rows c. So the lookup moves less while dp n < 1.5 rows, and it holds two dp n c
// buffers; past that the call gathers (LooksUpShards, which counts every table at the tokens'
// count: GPT-2 at 8,192 tokens a rank looks up to dp = 4).
// Every data-parallel rank looks up as many ids (a training micro-batch: the same rows and
// sequence on each), so the collectives match. It all runs on the side stream, in order with the
// shards' other collectives (the head's use of a tied table reduce-scatters into the same
// gradient, and its head still gathers the table for its matmul).
//
// The padded rows: r0 = floor(b / c), r1 = ceil(e / c); rows [r0, r1) laid out flat with the
// shard at b - r0 c and zeros around it, plus one zero row for the ids outside [r0, r1).
#include "worker/stage_model.h"

namespace strata::worker {

namespace {

struct PaddedRows {
  int64_t first = 0, end = 0;  // [r0, r1)
  int64_t lead = 0;            // where the shard starts in the padded rows' flat layout
};

PaddedRows PaddedRowsOf(const ParamUnit& unit) {
  const int64_t columns = unit.shapes[0][1];
  PaddedRows p;
  p.first = unit.shard_begin / columns;
  p.end = (unit.shard_end + columns - 1) / columns;
  p.lead = unit.shard_begin - p.first * columns;
  return p;
}

}  // namespace

// The lookup as an autograd function of the shard (an input so that the backward runs; its
// gradient goes straight to the shard's, as a reduce-scatter's does).
struct ShardRowsFunction : torch::autograd::Function<ShardRowsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor /*shard*/, torch::Tensor ids, int64_t model,
                               int64_t unit) {
    auto* stage = reinterpret_cast<StageModel*>(model);
    torch::Tensor local;
    torch::Tensor rows = stage->LookUpShardRows(static_cast<int>(unit), ids, &local);
    ctx->saved_data["model"] = model;
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["local"] = local;
    return rows;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    auto* stage = reinterpret_cast<StageModel*>(ctx->saved_data["model"].toInt());
    stage->AddShardRowsGradient(static_cast<int>(ctx->saved_data["unit"].toInt()), ctx->saved_data["local"].toTensor(), grad[0]);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool StageModel::CanLookUpShards() const {
  if (spec_.parallel.zero != 3 || spec_.parallel.recompute || mesh_.tp != 1 || !first_stage()) return false;
  for (int u : embed_units_) {
    const ParamUnit& unit = units_[static_cast<size_t>(u)];
    // One table a unit, ids exact as fp32 (the gather below carries them so).
    if (!unit.sharded || unit.names.size() != 1 || unit.shapes[0].size() != 2 || unit.offsets[0] != 0 ||
        unit.shapes[0][0] >= (int64_t{1} << 24)) {
      return false;
    }
  }
  return true;
}

bool StageModel::LooksUpShards(const torch::Tensor& tokens) const {
  if (!looks_up_shards_) return false;
  const int64_t world = groups_.dp->world_size();
  if (world == 1) return true;  // nothing crosses either way; the lookup reads the shard in place
  // Bytes each way per rank (the file's head): 2 (dp - 1) n c looking up, against about
  // 3 (dp - 1)/dp rows c gathering, summed over the tables; n is at most the tokens (GPT-2's
  // positions table reads fewer).
  double lookup = 0, gather = 0;
  for (int u : embed_units_) {
    const auto& shape = units_[static_cast<size_t>(u)].shapes[0];
    lookup += 2.0 * static_cast<double>(tokens.numel()) * static_cast<double>(shape[1]);
    gather += 3.0 * static_cast<double>(shape[0]) * static_cast<double>(shape[1]) / static_cast<double>(world);
  }
  return lookup < gather;
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
    const int u = unit_of.at(name);
    const ParamUnit& unit = units_[static_cast<size_t>(u)];
    return ShardRowsFunction::apply(unit.on_host ? host_anchor_ : unit.flat, ids, reinterpret_cast<int64_t>(this), static_cast<int64_t>(u));
  };
  const ParamView view(names, std::vector<torch::Tensor>(names.size()), {}, rows);
  torch::Tensor x = family_->Embed(view, tokens, tensor_parallel_);
  // The first block's gathers, beside the rest of this call.
  const auto [next, next_bf16] = NextCall(embed_units_);
  Prefetch(next, next_bf16);
  return x;
}

torch::Tensor StageModel::LookUpShardRows(int u, const torch::Tensor& ids, torch::Tensor* local) {
  torch::NoGradGuard no_grad;
  const ParamUnit& unit = units_[static_cast<size_t>(u)];
  const int64_t columns = unit.shapes[0][1];
  Communicator& dp = *groups_.dp;
  const int64_t world = dp.world_size();
  const torch::Tensor flat_ids = ids.reshape({-1}).to(torch::kLong);
  const int64_t n = flat_ids.numel();
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(columns);
  if (world == 1 && !unit.on_host) {  // the shard is the table: looked up where it is, on the compute stream
    *local = flat_ids;
    return torch::embedding(unit.flat.detach().view({unit.shapes[0][0], columns}), flat_ids).view(shape);
  }
  // Written on the side stream, read after the wait (out) and by the backward (local).
  torch::Tensor out = torch::empty({n * columns}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  *local = torch::empty({world * n}, flat_ids.options());
  const auto done = side_->Run([&] {
    torch::Tensor every = torch::empty({world * n}, out.options());
    AllGatherTensorFrom(dp, flat_ids.to(torch::kFloat), every);
    const torch::Tensor all_ids = every.to(torch::kLong);
    // (A host-streamed shard is uploaded into its place in the padded rows: pinned memory, on
    // the side stream.)
    const PaddedRows p = PaddedRowsOf(unit);
    const int64_t length = unit.shard_end - unit.shard_begin, padded_rows = p.end - p.first + 1;
    local->copy_((all_ids - p.first).masked_fill_((all_ids < p.first).logical_or_(all_ids >= p.end), padded_rows - 1));
    torch::Tensor padded = torch::empty({padded_rows * columns}, out.options());
    padded.narrow(0, 0, p.lead).zero_();
    padded.narrow(0, p.lead, length).copy_(unit.flat.detach(), /*non_blocking=*/unit.on_host);
    padded.narrow(0, p.lead + length, padded.numel() - p.lead - length).zero_();
    torch::Tensor partial = torch::embedding(padded.view({padded_rows, columns}), *local).view({-1});
    ReduceScatterTensorTo(dp, partial, out);
  });
  side_->Wait(done);  // (so flat_ids, read there, outlives its use)
  return out.view(shape);
}

void StageModel::AddShardRowsGradient(int u, const torch::Tensor& local, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  ParamUnit& unit = units_[static_cast<size_t>(u)];
  const int64_t columns = unit.shapes[0][1], length = unit.shard_end - unit.shard_begin;
  Communicator& dp = *groups_.dp;
  const int64_t world = dp.world_size();
  // No gradient reached the rows: zeros (this rank's n = local's ids / dp), so the shard's
  // gradient is still written this step.
  const torch::Tensor rows = grad.defined() ? grad.reshape({-1, columns}).to(torch::kFloat).contiguous()
                                            : torch::zeros({local.numel() / world, columns}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  const ShardGradient to = NextShardGradient(static_cast<size_t>(u), rows.options());
  side_->Run([&] {
    torch::Tensor every = rows;
    int64_t table_rows = unit.shapes[0][0], lead = 0;
    if (world > 1) {
      every = torch::empty({world * rows.size(0), columns}, rows.options());
      torch::Tensor every_flat = every.view({-1});
      AllGatherTensorFrom(dp, rows.view({-1}), every_flat);
    }
    if (world > 1 || unit.on_host) {  // `local` indexes the padded rows (the forward's)
      const PaddedRows p = PaddedRowsOf(unit);
      table_rows = p.end - p.first + 1;
      lead = p.lead;
    }
    // Summed per row in the order of `every` (LibTorch's embedding backward: sorted by row, each
    // row's gradients in a fixed order; deterministic on both devices).
    const torch::Tensor dense = at::embedding_dense_backward(every, local, table_rows, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
    AddToShardGradient(static_cast<size_t>(u), to, dense.view({-1}).narrow(0, lead, length));
  });
  side_->KeepUntilDone(rows);
  side_->KeepUntilDone(local);
}

}  // namespace strata::worker
