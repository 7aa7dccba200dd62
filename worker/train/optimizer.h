// AdamW over one rank's parameter units (internal to worker/, includes LibTorch): the moments it
// keeps, the gradient reduction over the data-parallel group, and the fused update (kernels/).
//
// Per unit u, with g the unit's flat gradient on this rank:
//   reduce   g is summed over the tensor-parallel group where sequence parallelism left it
//            partial, over the tied-embedding group (GPT-2's wte on the first and last stage),
//            then over the dp group - all-reduce (ZeRO 0, 1) or reduce-scatter (ZeRO 2; ZeRO 3
//            reduce-scattered it in backward) - and divided by dp. With dp > 1, ZeRO 0-2 and no
//            offload, a unit's sums start in the backward, as soon as its last gradient of the
//            step is written (GradientReady; PyTorch DDP's buckets, a unit each), on a side
//            stream beside the rest of the backward, which the step joins at its end
//            (JoinBackwardReductions). The sums are the same, in the same order: the losses are
//            bit for bit those of reducing after the backward. Not in the backward: a tied
//            embedding on a pipeline (its other stage is still in its backward) and units
//            without the gradient sink (recomputed, ZeRO-3, a one-stage tied embedding with its
//            two uses). The dp sums on the side stream run beside the compute stream's tp
//            collectives and pipeline transfers, in the same order on every rank (ZeRO-3's
//            pattern);
//   norm     sum of g^2 over this rank's shard, each element counted once (its counted spans:
//            not in the tied copy, tensor-parallel rank 0 for replicated parameters);
//   apply    AdamW with bias correction on the optimizer range [begin, end) - the whole unit, or
//            this rank's 1/dp shard under ZeRO >= 1 - decay on matrices only, one kernel call
//            per span of parameters that share it (the state holds no per-element masks):
//              p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//              p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//            then ZeRO 1/2 all-gather the updated unit.
// The trainer all-reduces the loss and the squared norm between reduce and apply, so the clip
// factor is known before any parameter changes.
//
// Offload ([parallel] offload = "optimizer"): m and v, and a master copy of the parameters over
// the optimizer range, live in host memory (pinned on a GPU). Each unit's reduced gradient goes
// to a host buffer as soon as the unit is reduced (HostCopies: a stream of their own). Apply
// then hands the update to a thread of its own and returns: that thread updates the units in
// the forward's order - waits for the unit's gradient, updates the master copy with the host
// AdamW (kernels::AdamWHost: the GPU kernel's arithmetic, so the losses equal the on-device
// optimizer's bit for bit), and sends it to the device's parameters (and their bf16 working
// copy) on the upload stream. Meanwhile the next step's forward runs: before it reads unit u it
// waits for u's upload (WaitForUnit, StageModel's before-use hook), so the forward of the first
// units hides the update of the later ones. The update is not delayed: no forward ever reads a
// parameter of the step before. ZeRO 1/2 with dp > 1 all-gather the updated shards at once, so
// there Apply waits for the whole update. Host memory: 16 bytes per parameter of the range (m,
// v, master, gradient buffer); the device keeps none of the optimizer state. Whoever writes the
// device's parameters otherwise (a resume) calls ParametersChanged; whoever reads them or the
// state outside the forward calls Settle first (the optimizer's own methods do).
//
// Offload = "optimizer+params" (StageModel's host-streamed units, ParamUnit::on_host): the master
// copy is the unit's own shard, in host memory, so the update uploads nothing - the next forward
// uploads each unit as it gathers it, after WaitForUnit has seen its update done. The gradients
// reach the host use by use (HostGradient, from the backward) and are summed there
// (HostGradientSums); ReduceGradients waits for the sums and takes the norm on the host. Host
// memory: the same 16 bytes per parameter, and the device keeps nothing per parameter.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "spec/run_spec.h"
#include "worker/train/host_copies.h"
#include "worker/train/stage_model.h"

namespace strata::worker {

class UnitOptimizer {
 public:
  struct Moments {
    torch::Tensor exp_avg, exp_avg_sq;  // fp32 over the unit's optimizer range (adamw; undefined under adamw8bit)
    // adamw8bit: one uint8 code per element and one fp32 scale per block of kAdamW8bitBlock
    // (kernels.h), the blocks counted from the start of each update span (below), whose scales
    // start at its `scale_offset`. The spans are cut from this rank's optimizer range, so the
    // blocks depend on dp: a resume under another dp requantizes.
    torch::Tensor exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales;
    int64_t begin = 0, end = 0;  // the optimizer range, in the unit's flat vector
    struct UpdateSpan {
      int64_t begin = 0, length = 0;  // in the optimizer range
      bool decay = false;             // weight decay (matrices) or none (vectors, norms, gaps)
      int64_t scale_offset = 0;       // adamw8bit: its first block's scale
    };
    std::vector<UpdateSpan> update_spans;  // cover the optimizer range, in order
    struct Span {
      int64_t begin = 0, length = 0;
    };
    std::vector<Span> norm_spans;  // the counted elements of this rank's shard, relative to shard_begin
  };
  struct Groups {
    Communicator* dp = nullptr;   // the data-parallel group
    Communicator* tie = nullptr;  // GPT-2's tied embedding: the first and last stage
    Communicator* tp = nullptr;   // the tensor-parallel group (sequence-parallel partial gradients)
  };

  struct Options {
    bool eight_bit = false;  // train.optimizer = "adamw8bit"
    bool offload = false;    // parallel.offload = "optimizer"
    int host_threads = 1;    // the host AdamW's threads under offload
  };
  // Zeroed moments for every unit of `model`: this rank's ZeRO shard of each when zero >= 1;
  // fp32, or 8-bit codes when `options.eight_bit`; on the host when `options.offload`.
  UnitOptimizer(StageModel& model, int64_t zero, int64_t dp, int64_t tp_rank, torch::Device device,
                const Options& options);
  ~UnitOptimizer();  // waits for a running update
  UnitOptimizer(const UnitOptimizer&) = delete;
  UnitOptimizer& operator=(const UnitOptimizer&) = delete;

  // The backward has written unit `unit`'s last gradient of the step (StageModel's gradient-ready
  // hook, on the backward's thread). Under offload with nothing to reduce (dp = 1, not a tied
  // embedding summed over stages), its download starts now, beside the rest of the backward.
  void GradientReady(size_t unit);
  // The groups the reductions run over; before the first step.
  void SetGroups(const Groups& groups) { groups_ = groups; }
  // At the end of the step's backwards (inside its CUDA graph when there is one), and before each
  // step (for a failed step's, which DiscardGradients leaves running): the device's current
  // stream waits for the reductions the backward started.
  void JoinBackwardReductions();
  // A host-streamed unit's use has reduced its gradient `grad` (StageModel's host-gradient hook,
  // on the side stream): it goes to the unit's host gradient, summed with the step's other uses.
  void HostGradient(size_t unit, const torch::Tensor& grad);
  // Reduces every unit's gradient (above) and returns the squared norm of this rank's share, a
  // scalar on the device. The reduced gradients are kept for Apply.
  // `replayed`: the step's backward was a replayed CUDA graph (no host code ran in it).
  torch::Tensor ReduceGradients(const Groups& groups, bool replayed = false);
  // The update of step `step` with learning rate `lr` and gradient scale `clip`; clears the
  // gradients. A failure part-way leaves the units torn (some updated, some not). Under offload
  // the update may still run when it returns (above).
  void Apply(const TrainSpec& train, int64_t step, double lr, double clip, const Groups& groups);
  // Before the forward reads unit `unit`: the device's current stream waits for the unit's
  // update (offload; returns at once otherwise or when the update has failed - Settle says so).
  void WaitForUnit(size_t unit);
  // Waits for the whole of a running update. Not OK when it failed (the state is then torn, and
  // failed() stays true).
  Status Settle();
  bool failed() const { return failed_; }
  // Under offload, where the last settled update's time went (host clock, seconds): the update
  // thread from start to its last upload queued, of which waiting for gradients to reach the
  // host, and the following forward's waits for units (WaitForUnit). For benchmarks.
  struct OffloadTimes {
    double update = 0, gradient_wait = 0, forward_wait = 0;
  };
  const OffloadTimes& offload_times() const { return offload_times_; }
  // Drops the reduced gradients and clears the units' (a step that will be replayed).
  void DiscardGradients();
  // The device's parameters were written from elsewhere (a checkpoint): under offload the host's
  // master copy is taken from them again. A no-op otherwise.
  void ParametersChanged();

  // The moment's values over the unit's optimizer range as fp32 (`second`: v, else m): the live
  // tensor under adamw, a dequantized copy under adamw8bit. What checkpoints store: the 8-bit
  // state is recovered from it exactly (SetMomentValues), so checkpoints keep one format.
  torch::Tensor MomentValues(size_t unit, bool second);
  // Sets the moment from fp32 values over the optimizer range (quantized under adamw8bit:
  // values that are themselves dequantized 8-bit state give back the same codes and scales).
  void SetMomentValues(size_t unit, bool second, const torch::Tensor& values);
  bool eight_bit() const { return eight_bit_; }

  Moments& moments(size_t unit) { return moments_[unit]; }
  const Moments& moments(size_t unit) const { return moments_[unit]; }
  // Units whose reduction runs beside the backward (the header).
  int64_t units_reduced_in_backward() const {
    return std::count(reduced_in_backward_.begin(), reduced_in_backward_.end(), true);
  }
  // Elements this rank holds per moment.
  int64_t state_elements() const;
  // Bytes of every tensor the optimizer keeps (moments, codes, scales), wherever they live.
  int64_t state_bytes() const;

 private:
  StageModel& model_;
  const int64_t zero_, dp_;
  const bool eight_bit_;
  const torch::Device device_;
  const torch::Device state_device_;  // where the moments live: device_, or the host under offload
  const int host_threads_;
  // Offload: the copies, and per unit over its optimizer range the host buffer of its gradient,
  // the master copy of its parameters, and the ticket of this step's gradient download.
  std::unique_ptr<HostCopies> offload_;
  // The gradients' mean over the data-parallel ranks without a pass over them: each summed
  // gradient is left as the sum, the norm's square sum is scaled by 1/dp^2 and the update's
  // gradient scale by 1/dp. Exact - the same bits as dividing first - where dp is a power of two
  // (scaling by 2^-k rounds nothing, short of subnormals) and the update runs on the device;
  // elsewhere each gradient is divided (ReduceGradients).
  bool MeanInUpdate() const { return dp_ > 1 && (dp_ & (dp_ - 1)) == 0 && !offload_; }
  struct HostUnit {
    torch::Tensor grad, master;  // master: the unit's own shard when it is host-streamed
    size_t ticket = 0;
    bool downloading = false;  // this step's download queued by GradientReady
    int64_t uses = 0;          // host-streamed: this step's gradients handed to `sums_` so far
  };
  std::vector<HostUnit> host_;
  std::unique_ptr<HostGradientSums> sums_;  // host-streamed units' gradients (offload = "optimizer+params")
  // A running host update (offload): its thread, and per unit the ticket of its upload once
  // queued (HostCopies::CurrentStreamWaitsUpload), under `mu`; and the units the forward has
  // waited for already (a unit may be read by several calls: micro-batches, a tied embedding),
  // the forward's own.
  struct Pending {
    Pending(size_t units, int64_t of_step) : uploaded(units, std::nullopt), waited(units, false), step(of_step) {}
    std::thread thread;
    Mutex mu;
    CondVar changed;
    std::vector<std::optional<size_t>> uploaded STRATA_GUARDED_BY(mu);
    std::vector<bool> waited;
    int64_t step = 0;
    bool done STRATA_GUARDED_BY(mu) = false;
    // The thread's until it is joined (Settle reads them after).
    std::string failure;                                           // what stopped it, if something did
    double update_s = 0, gradient_wait_s = 0, forward_wait_s = 0;  // OffloadTimes (forward_wait_s: the forward's)
  };
  OffloadTimes offload_times_;
  std::unique_ptr<Pending> pending_;
  bool failed_ = false;
  // GPT-2's tied embedding on a rank of a pipeline: its gradient is summed with the other stage's.
  bool SummedOverStages(size_t unit) const;
  // The unit has a parameter whose gradient is summed over the tensor-parallel ranks
  // (ParamUnit::tp_partial).
  bool TpPartial(size_t unit) const;
  // What the host update writes on the device for a unit: its optimizer range of the parameters,
  // and, where the update refreshes it, the bf16 working copy and the whole flat vector it is
  // cast from (else undefined; all undefined for a host-streamed unit, whose gradient is summed
  // on the host already and whose master copy is what the forward reads). Made by Apply's
  // thread: Pending's thread touches no unit.
  struct HostTarget {
    torch::Tensor params, working, whole;
  };
  // The host update of the units in order (Pending's thread).
  void UpdateOnHost(const TrainSpec& train, int64_t step, double lr, double clip,
                    const std::vector<HostTarget>& targets);
  // Settle, for the methods that read or write the state: a failed update throws.
  void SettleOrThrow();
  // The reduction of unit u's gradient over the groups (the header's "reduce", but the division).
  void Reduce(size_t unit, torch::Tensor& g, const Groups& groups);
  Groups groups_;
  // Reductions started in the backward (the header): their stream, and the units whose reduction
  // runs there. A unit's entry is set by its first GradientReady and kept: every step's backward
  // (and a CUDA graph replaying a captured one) reduces the same units there.
  std::unique_ptr<SideStream> backward_side_;
  std::vector<bool> reduced_in_backward_;
  std::vector<bool> fired_this_step_;  // ... whose sum this step's backward started (op by op)
  // Units whose sequence-parallel tp sum GradientReady did (on the backward's stream), kept as above.
  std::vector<bool> tp_summed_in_backward_;
  std::vector<Moments> moments_;        // one per unit
  std::vector<torch::Tensor> reduced_;  // ReduceGradients' result per unit, until Apply
  torch::Tensor norm_scratch_;          // kernels::SquareSum's partial sums, on the device
};

}  // namespace strata::worker
