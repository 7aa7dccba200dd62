// ZeRO-3's embedding lookups without its tables gathered (zero3_shards.h has the gathering
// schedule).
//
// Why: a lookup reads few rows of a large table - GPT-2's token table has 38.6M parameters, a
// Llama 3's 525M, and a rank's micro-batch reads 8,192 rows. Gathered like a layer, in fp32 (the
// residual stream starts from the fp32 rows), the whole table crossed to every rank at the start
// of each forward, with nothing to run beside it, and again for the backward, which reads none of
// it; its gradient was a dense table reduce-scattered at the end of the backward.
//
// Instead, for a table [rows, c] whose flat shard [b, e) this rank holds, with n ids per rank over
// dp ranks:
//   forward   every rank's ids, gathered (dp n numbers); this rank looks them all up in the
//             elements its shard holds - zero where it holds none of a row's elements (a shard's
//             edges may cut a row, so what a rank owns is counted by element; kernels::
//             ShardRowsGather reads the shard in place) - and the reduce-scatter of those dp n
//             rows hands each rank its own ids' rows. Every element is one rank's value plus
//             zeros, so the rows are the table's exactly.
//   backward  every rank's row gradients, gathered (dp n rows); this rank sums those of the rows
//             it holds into its shard's gradient (kernels::ShardRowsScatterAdd: each row's
//             gradients in the ids' order, from their stable sort, in chunks of positions - no
//             dense table, no atomics).
// Per rank that sends and receives (dp - 1) n c fp32 values in each direction, where gathering
// moved (dp - 1)/dp of the table twice and reduce-scattered its dense gradient: about
// 3 (dp - 1)/dp rows c. So the lookup moves less while dp n < 1.5 rows, and it holds two dp n c
// buffers (and, on a GPU, the scatter-add's scratch of dp n c / 16); past that the call gathers (LooksUpRows, which
// counts every table at the tokens' count: GPT-2 at 8,192 tokens a rank looks up to dp = 4). Every data-parallel rank
// looks up as many ids (a training micro-batch: the same rows and sequence on each), so the collectives match. It all
// runs on the side stream, in order with the shards' other collectives (the head's use of a tied table reduce-scatters
// into the same gradient, and its head still gathers the table for its matmul). The ids' sort, which only the backward
// reads, is queued after the first block's gathers, which the forward waits for.
#include "worker/nn/kernel_place.h"
#include "worker/train/tensor_transfer.h"
#include "worker/train/zero3_shards.h"

namespace strata::worker {

// The lookup as an autograd function of the shard (an input so that the backward runs; its
// gradient goes straight to the shard's, as a reduce-scatter's does).
struct ShardRowsFunction : torch::autograd::Function<ShardRowsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor /*shard*/, torch::Tensor ids,
                               int64_t model, int64_t unit) {
    auto* shards = reinterpret_cast<Zero3Shards*>(model);
    Zero3Shards::LookedUpIds saved;
    torch::Tensor rows = shards->LookUpShardRows(static_cast<int>(unit), ids, &saved);
    ctx->saved_data["model"] = model;
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["ids"] = saved.ids;
    ctx->saved_data["sorted"] = saved.sorted;
    ctx->saved_data["order"] = saved.order;
    return rows;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* shards = reinterpret_cast<Zero3Shards*>(ctx->saved_data["model"].toInt());
    const Zero3Shards::LookedUpIds saved{ctx->saved_data["ids"].toTensor(), ctx->saved_data["sorted"].toTensor(),
                                         ctx->saved_data["order"].toTensor()};
    shards->AddShardRowsGradient(static_cast<int>(ctx->saved_data["unit"].toInt()), saved, grad[0]);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool Zero3Shards::CanLookUpRows() const {
  if (!layout_.lookups_allowed) return false;
  for (int u : layout_.embed_units) {
    const ParamUnit& unit = units_[static_cast<size_t>(u)];
    // One table a unit, ids exact as fp32 (the gather below carries them so).
    if (!unit.sharded || unit.names.size() != 1 || unit.shapes[0].size() != 2 || unit.offsets[0] != 0 ||
        unit.shapes[0][0] >= (int64_t{1} << 24)) {
      return false;
    }
  }
  return true;
}

bool Zero3Shards::LooksUpRows(const torch::Tensor& tokens) const {
  if (!looks_up_rows_) return false;
  const int64_t world = dp_.world_size();
  if (world == 1) return true;  // nothing crosses either way; the lookup reads the shard in place
  // Bytes each way per rank (the file's head): 2 (dp - 1) n c looking up, against about
  // 3 (dp - 1)/dp rows c gathering, summed over the tables; n is at most the tokens (GPT-2's
  // positions table reads fewer).
  double lookup = 0, gather = 0;
  for (int u : layout_.embed_units) {
    const auto& shape = units_[static_cast<size_t>(u)].shapes[0];
    lookup += 2.0 * static_cast<double>(tokens.numel()) * static_cast<double>(shape[1]);
    gather += 3.0 * static_cast<double>(shape[0]) * static_cast<double>(shape[1]) / static_cast<double>(world);
  }
  return lookup < gather;
}

torch::Tensor Zero3Shards::LookUpRows(int u, const torch::Tensor& ids) {
  return ShardRowsFunction::apply(AutogradInput(units_[static_cast<size_t>(u)]), ids, reinterpret_cast<int64_t>(this),
                                  static_cast<int64_t>(u));
}

void Zero3Shards::AfterLookups() {
  // The first block's gathers, beside the rest of the embedding's call; then the sorts only the
  // backward reads.
  const auto [next, next_bf16] = NextCall(layout_.embed_units);
  Prefetch(next, next_bf16);
  SortLookups();
}

void Zero3Shards::SortLookups() {
  if (unsorted_lookups_.empty()) return;
  side_->Run([&] {
    for (LookedUpIds& l : unsorted_lookups_)
      at::sort_out(l.sorted, l.order, l.ids, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  });
  // Allocated on the compute stream, used on the side stream only: not reused before the sort is
  // done, whenever the forward's autograd node drops them.
  for (const LookedUpIds& l : unsorted_lookups_) {
    for (const torch::Tensor& t : {l.ids, l.sorted, l.order}) side_->KeepUntilDone(t);
  }
  unsorted_lookups_.clear();
}

torch::Tensor Zero3Shards::LookUpShardRows(int u, const torch::Tensor& ids, LookedUpIds* saved) {
  torch::NoGradGuard no_grad;
  const ParamUnit& unit = units_[static_cast<size_t>(u)];
  const int64_t columns = unit.shapes[0][1];
  Communicator& dp = dp_;
  const int64_t world = dp.world_size();
  const torch::Tensor flat_ids = ids.reshape({-1}).to(torch::kLong);
  const int64_t n = flat_ids.numel();
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(columns);
  // Written and read on the side stream only (the sort, the backward; kept alive there by
  // AddShardRowsGradient).
  saved->sorted = torch::empty({world * n}, flat_ids.options());
  saved->order = torch::empty({world * n}, flat_ids.options());
  torch::Tensor out;
  if (world == 1 && !unit.on_host) {  // the shard is the table: looked up where it is, on the compute stream
    saved->ids = flat_ids;
    out = torch::embedding(unit.flat.detach().view({unit.shapes[0][0], columns}), flat_ids).view(shape);
  } else {
    // Written on the side stream, read by the compute stream after the wait.
    out = torch::empty({n * columns}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    saved->ids = torch::empty({world * n}, flat_ids.options());
    const auto done = side_->Run([&] {
      if (world > 1) {
        torch::Tensor every = torch::empty({world * n}, out.options());
        AllGatherTensorFrom(dp, flat_ids.to(torch::kFloat), every);
        saved->ids.copy_(every);
      } else {
        saved->ids.copy_(flat_ids);
      }
      // A host-streamed shard is uploaded first (pinned memory, on the side stream).
      const torch::Tensor shard =
          unit.on_host ? unit.flat.detach().to(device_, /*non_blocking=*/true) : unit.flat.detach();
      torch::Tensor partial = torch::empty({world * n * columns}, out.options());
      kernels::ShardRowsGather(KernelPlace(device_), {columns, unit.shard_begin, unit.shard_end},
                               shard.data_ptr<float>(), saved->ids.data_ptr<int64_t>(), world * n,
                               partial.data_ptr<float>());
      ReduceScatterTensorTo(dp, partial, out);
    });
    side_->Wait(done);  // (so flat_ids, read there, outlives its use)
    out = out.view(shape);
  }
  unsorted_lookups_.push_back(*saved);
  return out;
}

void Zero3Shards::AddShardRowsGradient(int u, const LookedUpIds& saved, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  ParamUnit& unit = units_[static_cast<size_t>(u)];
  const int64_t columns = unit.shapes[0][1], length = unit.shard_end - unit.shard_begin;
  Communicator& dp = dp_;
  const int64_t world = dp.world_size();
  const int64_t n = saved.ids.numel() / world;
  // No gradient reached the rows: zeros, so the shard's gradient is still written this step.
  const torch::Tensor rows =
      grad.defined() ? grad.reshape({-1, columns}).to(torch::kFloat).contiguous()
                     : torch::zeros({n, columns}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  const ShardGradient to = NextShardGradient(static_cast<size_t>(u), rows.options());
  side_->Run([&] {
    torch::Tensor every = rows;
    if (world > 1) {
      every = torch::empty({world * n, columns}, rows.options());
      torch::Tensor every_flat = every.view({-1});
      AllGatherTensorFrom(dp, rows.view({-1}), every_flat);
    }
    // The step's first contribution is written (added into zeros: the same sums); a host-streamed
    // shard's goes to the host.
    torch::Tensor sum = unit.on_host ? torch::zeros({length}, rows.options()) : to.sum;
    if (!unit.on_host && to.first) sum.zero_();
    // The parts of long runs (the CUDA kernels'; the CPU reference needs none).
    const torch::Tensor scratch =
        device_.is_cuda() ? torch::empty({kernels::ShardRowsScatterAddScratch(world * n, columns)}, rows.options())
                          : torch::Tensor();
    kernels::ShardRowsScatterAdd(KernelPlace(device_), {columns, unit.shard_begin, unit.shard_end},
                                 every.data_ptr<float>(), saved.sorted.data_ptr<int64_t>(),
                                 saved.order.data_ptr<int64_t>(), world * n, sum.data_ptr<float>(),
                                 scratch.defined() ? scratch.data_ptr<float>() : nullptr);
    if (unit.on_host) AddToShardGradient(static_cast<size_t>(u), to, sum);
  });
  side_->KeepUntilDone(rows);
  for (const torch::Tensor& t : {saved.ids, saved.sorted, saved.order}) side_->KeepUntilDone(t);
}

}  // namespace strata::worker
