// Megatron's f and g (Shoeybi et al. 2019) for a block whose heads and MLP columns are split
// over the tp ranks: the split matmuls' partial sums meet in g, and f is its transpose. Under
// sequence parallelism (Korthikanti et al. 2022) a rank holds its 1/tp of the tokens between
// them: f all-gathers the tokens and g reduce-scatters them, the same bytes as the all-reduces.
#include "worker/train/tensor_parallel.h"

#include <stdexcept>

namespace strata::worker {

TensorParallelGroup::TensorParallelGroup(Communicator* comm, torch::Device device, bool overlap,
                                         std::function<void(int unit)> announce)
    : comm_(comm), announce_(std::move(announce)) {
  if (overlap) side_ = std::make_unique<SideStream>(device);
}

bool TensorParallelGroup::HoldAnnouncement(int unit) {
  // A unit's announcement may start its sum over this group: never while one of this group's
  // collectives runs on the side stream unjoined.
  TORCH_CHECK(!ahead_pending_, "tensor parallel: unit ", unit,
              " completed while a collective beside a matmul was unjoined");
  if (!holding_) return false;
  held_.push_back(unit);
  return true;
}

void TensorParallelGroup::DropUnfinished() {
  deferred_.Clear();
  held_.clear();
}

void TensorParallelGroup::Beside(const std::function<void()>& collective) {
  TORCH_CHECK(!ahead_pending_, "tensor parallel: a collective beside the weight gradients while another was unjoined");
  if (!side_ || deferred_.empty()) {
    collective();
    return;
  }
  const std::shared_ptr<SideStream::Done> done = side_->Run(collective);
  {
    // Joined even when a weight gradient throws (out of memory): the buffers the collective reads
    // and writes are freed on the compute stream, after this wait.
    struct Join {
      TensorParallelGroup& group;
      const std::shared_ptr<SideStream::Done>& done;
      ~Join() {
        group.holding_ = false;
        group.side_->Wait(done);
      }
    } join{*this, done};
    holding_ = true;
    counts_.weight_gradients_deferred += deferred_.RunAll();
  }
  // (With today's families no unit completes beside the collective - a block's last gradient is
  // its input norm's, written after f's backward: a guard.)
  std::vector<int> held;
  held.swap(held_);
  for (int unit : held) announce_(unit);
}

bool TensorParallelGroup::CanRunAhead(const torch::Tensor& t) const {
  return side_ != nullptr && comm_->world_size() > 1 && (t.is_cpu() || comm_->device_buffers()) &&
         (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kFloat);
}

void TensorParallelGroup::Ahead(const std::function<void()>& collective, std::vector<torch::Tensor> keep) {
  ahead_pending_ = true;
  for (auto& t : keep) ahead_keep_.push_back(std::move(t));
  try {
    ahead_ = side_->Run(collective);
  } catch (...) {
    ahead_.reset();  // it may have queued part of its work: Join waits for all of the side stream
    throw;
  }
  ++counts_.collectives_beside_matmuls;
}

void TensorParallelGroup::Join() {
  if (!ahead_pending_) return;
  ahead_pending_ = false;
  // The side stream runs in order: its last collective's end is the end of all. Without one (a
  // CPU, where this is a no-op, or a collective that threw) the whole side stream is waited for.
  if (ahead_) {
    side_->Wait(ahead_);
  } else {
    side_->WaitAll();
  }
  ahead_.reset();
  // Dropped after the wait: the compute stream's later reuse of this memory comes after it.
  ahead_keep_.clear();
}

namespace {

TensorParallelGroup* GroupOf(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<TensorParallelGroup*>(ctx->saved_data["group"].toInt());
}

// Activations cross the tensor-parallel ranks as they are computed: bf16 for a bf16 activation
// (half the bytes of widening it; summing two bf16 partial sums in fp32 and rounding once is
// exact to what NCCL's bf16 sum gives for tp = 2), fp32 otherwise. Where the communicator takes
// host buffers only (ZeroMQ) a CUDA activation is staged through the host.
torch::ScalarType WireType(const torch::Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat;
}
torch::Device WireDevice(Communicator& comm, const torch::Tensor& x) {
  return x.is_cpu() || comm.device_buffers() ? x.device() : torch::Device(torch::kCPU);
}
uint16_t* Bits16(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// Sequence parallelism (stage_model.h): a rank's tokens are its block of the flattened [b * t]
// tokens, held as [b, t / tp, hidden] - the elementwise work between the split matmuls does not
// care which tokens are where, and every collective is over contiguous blocks (ShardRange of the
// flattened tensor, tp dividing t).
enum class SumOf { kEveryToken, kMyTokens };

// The sum over the ranks of x (kEveryToken: all-reduced) or of this rank's block of its tokens
// (kMyTokens: reduce-scattered), a new tensor (x is autograd's and stays as it was). kBeside: f's
// backward, run beside the weight gradients put off for it (TensorParallelGroup::Beside).
template <SumOf kWhat, bool kBeside>
torch::Tensor Summed(TensorParallelGroup& group, const torch::Tensor& x) {
  Communicator& comm = group.comm();
  if (comm.world_size() == 1) return x;
  std::vector<int64_t> sizes = x.sizes().vec();
  if (kWhat == SumOf::kMyTokens) {
    TORCH_CHECK(sizes.size() >= 2 && sizes[1] % comm.world_size() == 0, "sequence parallel: ", sizes[1],
                " tokens a row over tp = ", comm.world_size());
    sizes[1] /= comm.world_size();
  }
  // NCCL's reduce-scatter reads its input in place (the check above keeps it off its in-place
  // fallback for a count the ranks do not divide); an all-reduce, or the host ring, sums into its
  // buffer, which must not be autograd's. One copy otherwise, widening or staging as it goes.
  const bool in_place = kWhat == SumOf::kMyTokens && comm.device_buffers() && x.is_cuda() && x.is_contiguous() &&
                        x.scalar_type() == WireType(x);
  torch::Tensor full =
      in_place ? x : torch::empty(x.sizes(), x.options().dtype(WireType(x)).device(WireDevice(comm, x)));
  if (!in_place) full.copy_(x);
  // Allocated here, on the compute stream, which reads it after Beside's wait.
  torch::Tensor out = kWhat == SumOf::kMyTokens ? torch::empty(sizes, full.options()) : full;
  const auto n = static_cast<size_t>(full.numel());
  const bool bf16 = full.scalar_type() == torch::kBFloat16;
  auto collective = [&] {
    if (kWhat == SumOf::kMyTokens) {
      ThrowIfFailed(bf16 ? comm.ReduceScatterSumBf16To(Bits16(full), Bits16(out), n)
                         : comm.ReduceScatterSumTo(full.data_ptr<float>(), out.data_ptr<float>(), n));
    } else {
      ThrowIfFailed(bf16 ? comm.AllReduceSumBf16(Bits16(full), n) : comm.AllReduceSum(full.data_ptr<float>(), n));
    }
  };
  if (kBeside) {
    group.Beside(collective);
  } else {
    collective();
  }
  return out.to(x.device(), x.scalar_type());
}

torch::Tensor TokensGathered(TensorParallelGroup& group, const torch::Tensor& mine) {
  Communicator& comm = group.comm();
  std::vector<int64_t> sizes = mine.sizes().vec();
  sizes[1] *= comm.world_size();
  const torch::Tensor wire = mine.to(WireDevice(comm, mine), WireType(mine)).contiguous();
  torch::Tensor full = torch::empty(sizes, wire.options());
  const auto n = static_cast<size_t>(full.numel());
  if (wire.scalar_type() == torch::kBFloat16) {
    ThrowIfFailed(comm.AllGather16From(Bits16(wire), Bits16(full), n));
  } else {
    ThrowIfFailed(comm.AllGatherFrom(wire.data_ptr<float>(), full.data_ptr<float>(), n));
  }
  return full.to(mine.device(), mine.scalar_type());
}

// Sequence parallel f's gather started beside the matmul after it (EnterThenLinears): this rank's
// tokens are copied into their block of every token's buffer on the compute stream, and the
// in-place all-gather of the others' runs on the side stream until the group's Join. Only this
// rank's block may be read before. `mine` is in its wire dtype (the caller checks).
torch::Tensor TokensGatheredAhead(TensorParallelGroup& group, const torch::Tensor& mine) {
  Communicator& comm = group.comm();
  std::vector<int64_t> sizes = mine.sizes().vec();
  sizes[1] *= comm.world_size();
  torch::Tensor full = torch::empty(sizes, mine.options());
  const int64_t block = mine.numel();
  full.view({-1}).narrow(0, block * comm.rank(), block).copy_(mine.reshape({-1}));
  const auto n = static_cast<size_t>(full.numel());
  group.Ahead(
      [&comm, full, n] {
        ThrowIfFailed(full.scalar_type() == torch::kBFloat16 ? comm.AllGather16(Bits16(full), n)
                                                             : comm.AllGather(full.data_ptr<float>(), n));
      },
      {full});
  return full;
}

// This rank's block of x's tokens (a copy: autograd's output owns its memory).
torch::Tensor TokenBlock(TensorParallelGroup& group, const torch::Tensor& x) {
  Communicator& comm = group.comm();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[1] /= comm.world_size();
  const int64_t block = x.numel() / comm.world_size();
  return x.contiguous().view({-1}).narrow(0, block * comm.rank(), block).view(sizes).clone();
}

torch::Tensor Same(TensorParallelGroup&, const torch::Tensor& x) { return x; }

constexpr auto AllReduced = Summed<SumOf::kEveryToken, false>;
constexpr auto TokensReduceScattered = Summed<SumOf::kMyTokens, false>;
// f's backward, beside the weight gradients of the matmuls that read f's output.
constexpr auto AllReducedBeside = Summed<SumOf::kEveryToken, true>;
constexpr auto TokensReduceScatteredBeside = Summed<SumOf::kMyTokens, true>;

// An activation's way across the tensor-parallel ranks: `Forward` in forward, `Backward` on its
// gradient (the two are each other's transpose). `group` is the rank's TensorParallelGroup*.
template <torch::Tensor (*Forward)(TensorParallelGroup&, const torch::Tensor&),
          torch::Tensor (*Backward)(TensorParallelGroup&, const torch::Tensor&)>
struct TensorParallelFn : torch::autograd::Function<TensorParallelFn<Forward, Backward>> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t group) {
    ctx->saved_data["group"] = group;
    return Forward(*reinterpret_cast<TensorParallelGroup*>(group), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {Backward(*GroupOf(ctx), g[0]), torch::Tensor()};
  }
};

// Megatron's f (identity; the gradient all-reduced) and g (all-reduce; the gradient as it is).
using CopyToTensorParallelFn = TensorParallelFn<Same, AllReducedBeside>;
using ReduceFromTensorParallelFn = TensorParallelFn<AllReduced, Same>;
// Sequence parallel f: this rank's tokens -> every token (all-gather); backward, the gradient of
// every token summed over the ranks and cut to this rank's (reduce-scatter).
using GatherFromSequenceParallelFn = TensorParallelFn<TokensGathered, TokensReduceScatteredBeside>;
// Sequence parallel g: the ranks' partial sums over every token -> the sum of this rank's tokens
// (reduce-scatter); backward, every token's gradient (all-gather).
using ReduceScatterToSequenceParallelFn = TensorParallelFn<TokensReduceScattered, TokensGathered>;
// GatherFromSequenceParallelFn with its gather left running beside (EnterThenLinears joins it).
using GatherFromSequenceParallelAheadFn = TensorParallelFn<TokensGatheredAhead, TokensReduceScatteredBeside>;
// Every token, the same on every rank (the embedding's output) -> this rank's tokens; backward,
// every token's gradient gathered, so what read every token (the lookup) gets all of it.
using ScatterToSequenceParallelFn = TensorParallelFn<TokenBlock, TokensGathered>;
// This rank's tokens -> every token, for a consumer that every rank runs alike on all of them (a
// head not split by vocabulary): each rank's gradient of every token is already the whole one,
// so backward keeps this rank's block.
using GatherForReplicatedFn = TensorParallelFn<TokensGathered, TokenBlock>;
// A statistic over a split dimension: summed forward, and its gradient summed backward.
using SumOverRanksFn = TensorParallelFn<AllReduced, AllReduced>;

// The group joins its side stream when this leaves scope, however it leaves: what the collectives
// read and write is freed on the compute stream after the wait.
struct JoinAtExit {
  TensorParallelGroup& group;
  ~JoinAtExit() { group.Join(); }
};

// How many chunks a row-parallel matmul and its sum run in: more chunks hide more of the sum and
// make smaller matmuls. Up to 4 of at least 2048 rows each (a matmul that size keeps cuBLAS's
// efficiency on a wide model), else 2 where they divide (small models: the path is exercised).
int64_t SumChunks(int64_t rows) {
  if (rows % 4 == 0 && rows / 4 >= 2048) return 4;
  return rows % 2 == 0 ? 2 : 1;
}

// y W^T summed over the ranks, y [..., in] in W's dtype: the whole sum (all-reduce), or under
// sequence parallelism this rank's block of the tokens (reduce-scatter). Chunk j's rows are
// multiplied on the compute stream and summed on the side stream while chunk j + 1 multiplies.
// Sequence parallel: chunk j takes rows [j r, (j + 1) r) of every rank's block of tokens, so that
// its reduce-scatter gives this rank rows [j r, (j + 1) r) of its own.
torch::Tensor MultipliedAndSummed(TensorParallelGroup& group, const torch::Tensor& y, const torch::Tensor& working,
                                  bool sequence_parallel) {
  Communicator& comm = group.comm();
  const int64_t tp = comm.world_size(), out = working.size(0);
  const torch::Tensor y2d = y.reshape({-1, working.size(1)});
  const int64_t rows = y2d.size(0);
  const bool bf16 = working.scalar_type() == torch::kBFloat16;
  std::vector<int64_t> sizes = y.sizes().vec();
  sizes.back() = out;
  if (!sequence_parallel) {
    torch::Tensor sum = torch::empty({rows, out}, y2d.options());
    const JoinAtExit join{group};  // after `sum`: joined before it is freed, however this leaves
    const int64_t chunks = SumChunks(rows), r = rows / chunks;
    for (int64_t j = 0; j < chunks; ++j) {
      torch::Tensor chunk = sum.narrow(0, j * r, r);
      at::mm_out(chunk, y2d.narrow(0, j * r, r), working.t());
      const auto n = static_cast<size_t>(chunk.numel());
      group.Ahead(
          [&comm, chunk, n, bf16] {
            ThrowIfFailed(bf16 ? comm.AllReduceSumBf16(Bits16(chunk), n)
                               : comm.AllReduceSum(chunk.data_ptr<float>(), n));
          },
          {});
    }
    group.Join();
    return sum.view(sizes);
  }
  TORCH_CHECK(sizes.size() >= 2 && sizes[1] % tp == 0 && rows % tp == 0, "sequence parallel: ", sizes[1],
              " tokens a row over tp = ", tp);
  sizes[1] /= tp;
  const int64_t block = rows / tp, chunks = SumChunks(block), r = block / chunks;
  torch::Tensor sum = torch::empty({block, out}, y2d.options());
  const JoinAtExit join{group};
  for (int64_t j = 0; j < chunks; ++j) {
    torch::Tensor partial = torch::empty({tp * r, out}, y2d.options());
    for (int64_t q = 0; q < tp; ++q) {
      torch::Tensor rows_of_q = partial.narrow(0, q * r, r);
      at::mm_out(rows_of_q, y2d.narrow(0, q * block + j * r, r), working.t());
    }
    torch::Tensor mine = sum.narrow(0, j * r, r);
    const auto n = static_cast<size_t>(partial.numel());
    group.Ahead(
        [&comm, partial, mine, n, bf16] {
          ThrowIfFailed(bf16 ? comm.ReduceScatterSumBf16To(Bits16(partial), Bits16(mine), n)
                             : comm.ReduceScatterSumTo(partial.data_ptr<float>(), mine.data_ptr<float>(), n));
        },
        {partial});
  }
  group.Join();
  return sum.view(sizes);
}

// A row-parallel matmul and g in one: forward MultipliedAndSummed; backward g's (under sequence
// parallelism every token's gradient gathered, beside the own tokens' dx), then the matmul's
// (fused_linear.h: dx, and dW into the sink at once - it runs beside no collective).
struct LinearThenLeaveFn : torch::autograd::Function<LinearThenLeaveFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor y, torch::Tensor /*param*/,
                               torch::Tensor working, int64_t sink, int64_t group, bool sequence_parallel) {
    const torch::Tensor yc = y.to(working.scalar_type());
    ctx->save_for_backward({yc, working});
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["group"] = group;
    ctx->saved_data["sequence_parallel"] = sequence_parallel;
    ctx->saved_data["y_type"] = static_cast<int64_t>(y.scalar_type());
    return MultipliedAndSummed(*reinterpret_cast<TensorParallelGroup*>(group), yc, working, sequence_parallel);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &y = saved[0], &working = saved[1];
    auto* sink = reinterpret_cast<GradientSink*>(ctx->saved_data["sink"].toInt());
    const auto y_type = static_cast<torch::ScalarType>(ctx->saved_data["y_type"].toInt());
    if (!ctx->saved_data["sequence_parallel"].toBool()) {
      return {LinearIntoGradientBackward(g[0], y, working, sink, /*defer=*/nullptr, ctx->needs_input_grad(0), y_type),
              torch::Tensor(),
              torch::Tensor(),
              torch::Tensor(),
              torch::Tensor(),
              torch::Tensor()};
    }
    // g's backward gathers every token's gradient; dx = dy W of this rank's own tokens multiplies
    // while it does (the forward's RowsAhead, on W^T), the other rows and dW after the join.
    TensorParallelGroup& group = *GroupOf(ctx);
    const JoinAtExit join{group};
    const torch::Tensor mine = g[0].to(working.scalar_type());  // the forward's output dtype: the wire's
    const torch::Tensor dy = TokensGatheredAhead(group, mine);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      const int64_t rows = mine.numel() / mine.size(-1), rank = group.comm().rank();
      const RowsAhead ahead{rows * rank, rows * (rank + 1), [&group] { group.Join(); }};
      dx = LinearRows(dy, working.t(), torch::Tensor(), &ahead).to(y_type);
    }
    group.Join();
    LinearIntoGradientBackward(dy, y, working, sink, /*defer=*/nullptr, /*want_dx=*/false, y_type);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::vector<torch::Tensor> EnterThenLinears(TensorParallelGroup& group, const ParamView& p, const torch::Tensor& x,
                                            const std::vector<ProjectionName>& projections, bool sequence_parallel) {
  Communicator& comm = group.comm();
  std::vector<torch::Tensor> out;
  // (A matrix without a sink - ZeRO-3's gathered shards, recomputed blocks - is multiplied by
  // autocast's linear, which casts every row first: nothing would run beside the gather.)
  const bool beside = sequence_parallel && group.CanRunAhead(x) && !projections.empty() &&
                      p.Sunk(projections[0].weight).second != nullptr;
  if (!beside) {
    const torch::Tensor a = EnterTensorParallel(group, x, sequence_parallel);
    for (const ProjectionName& projection : projections) out.push_back(p.Linear(a, projection.weight, projection.bias));
    return out;
  }
  const JoinAtExit join{group};
  const torch::Tensor a = GatherFromSequenceParallelAheadFn::apply(x, reinterpret_cast<int64_t>(&group));
  const int64_t mine = x.numel() / x.size(-1);  // rows of tokens: this rank's are block `rank` of every rank's
  const RowsAhead ahead{mine * comm.rank(), mine * (comm.rank() + 1), [&group] { group.Join(); }};
  out.push_back(p.Linear(a, projections[0].weight, projections[0].bias, &ahead));
  group.Join();
  for (size_t i = 1; i < projections.size(); ++i)
    out.push_back(p.Linear(a, projections[i].weight, projections[i].bias));
  return out;
}

torch::Tensor LinearThenLeave(TensorParallelGroup& group, const ParamView& p, const torch::Tensor& y,
                              const std::string& weight, bool sequence_parallel) {
  const auto [working, sunk] = p.Sunk(weight);
  const bool beside = sunk != nullptr && torch::GradMode::is_enabled() && group.CanRunAhead(working);
  if (!beside) return LeaveTensorParallel(group, p.Linear(y, weight), sequence_parallel);
  sunk->sink->CountUse();
  return LinearThenLeaveFn::apply(y, sunk->param, working.detach(), reinterpret_cast<int64_t>(sunk->sink),
                                  reinterpret_cast<int64_t>(&group), sequence_parallel);
}

torch::Tensor EnterTensorParallel(TensorParallelGroup& group, const torch::Tensor& x, bool sequence_parallel) {
  const auto handle = reinterpret_cast<int64_t>(&group);
  return sequence_parallel ? GatherFromSequenceParallelFn::apply(x, handle) : CopyToTensorParallelFn::apply(x, handle);
}

torch::Tensor LeaveTensorParallel(TensorParallelGroup& group, const torch::Tensor& x, bool sequence_parallel) {
  const auto handle = reinterpret_cast<int64_t>(&group);
  return sequence_parallel ? ReduceScatterToSequenceParallelFn::apply(x, handle)
                           : ReduceFromTensorParallelFn::apply(x, handle);
}

torch::Tensor ScatterToSequenceParallel(TensorParallelGroup& group, const torch::Tensor& x) {
  return ScatterToSequenceParallelFn::apply(x, reinterpret_cast<int64_t>(&group));
}

torch::Tensor SumOverTensorParallelRanks(TensorParallelGroup& group, const torch::Tensor& x) {
  return SumOverRanksFn::apply(x, reinterpret_cast<int64_t>(&group));
}

torch::Tensor GatherForReplicated(TensorParallelGroup& group, const torch::Tensor& x) {
  return GatherForReplicatedFn::apply(x, reinterpret_cast<int64_t>(&group));
}

}  // namespace strata::worker
