#include "worker/trainer.h"

#include "worker/hf_format.h"
#include "worker/torch_compat.h"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace strata::worker {

Trainer::Trainer(const TaskContext& context, TokenData data, torch::Device device)
    : context_(context), data_(std::move(data)), device_(device) {
  // Every rank seeds identically, so all replicas start from the same weights.
  auto model = BuildCausalLm(context.spec.model, context.spec.train.seed);
  if (!model.ok()) {
    init_status_ = model.status();
    model_ = CreateCausalLm(context.spec.model);  // keeps the object usable; init_status() says not to
  } else {
    model_ = *model;
  }
  model_->to(device_);
  for (auto& item : model_->named_parameters()) params_.emplace_back(item.key(), item.value());
  if (context.spec.parallel.zero == 0) {
    for (auto& [name, p] : params_) {
      exp_avg_.push_back(torch::zeros_like(p));
      exp_avg_sq_.push_back(torch::zeros_like(p));
    }
    return;
  }
  std::vector<torch::Tensor> masks;
  for (auto& [name, p] : params_) {
    total_elements_ += p.numel();
    masks.push_back(torch::full({p.numel()}, p.dim() >= 2 ? 1.0f : 0.0f));
  }
  const auto [begin, end] = ShardRange(total_elements_, context.world_size, context.rank);
  shard_begin_ = static_cast<int64_t>(begin);
  shard_end_ = static_cast<int64_t>(end);
  shard_exp_avg_ = torch::zeros({shard_end_ - shard_begin_});
  shard_exp_avg_sq_ = torch::zeros({shard_end_ - shard_begin_});
  shard_decay_mask_ = torch::cat(masks).narrow(0, shard_begin_, shard_end_ - shard_begin_).clone();
}

int64_t Trainer::optimizer_state_elements() const {
  if (context_.spec.parallel.zero > 0) return shard_end_ - shard_begin_;
  int64_t n = 0;
  for (auto& m : exp_avg_) n += m.numel();
  return n;
}

Result<double> Trainer::Step() {
  const auto& spec = context_.spec;
  const int64_t n = context_.world_size;
  const int64_t local_batch = spec.train.global_batch / n;
  const int64_t t = spec.model.sequence;
  auto offsets = data_.BatchOffsets(spec.train.seed, step_, spec.train.global_batch, t);
  auto window = torch::empty({local_batch, t + 1}, torch::kLong);
  auto* w = window.data_ptr<int64_t>();
  for (int64_t row = 0; row < local_batch; ++row) {
    const int64_t start = offsets[context_.rank * local_batch + row];
    for (int64_t i = 0; i <= t; ++i) w[row * (t + 1) + i] = data_.tokens()[start + i];
  }
  window = window.to(device_);

  // Gradient accumulation: the rank's rows in micro-batches, each loss scaled by its share, so
  // the accumulated gradient is that of the mean over all local rows whatever the micro-batch.
  const int64_t micro = spec.parallel.micro_batch > 0 ? spec.parallel.micro_batch : local_batch;
  model_->zero_grad();
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device_));
  for (int64_t begin = 0; begin < local_batch; begin += micro) {
    auto rows = window.narrow(0, begin, micro);
    auto inputs = rows.narrow(1, 0, t);
    auto targets = rows.narrow(1, 1, t);
    torch::Tensor loss;
    {
      compat::AutocastGuard autocast(device_, spec.train.precision == "bf16");
      auto logits = model_->Logits(inputs);
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, spec.model.vocab}).to(torch::kFloat),
                                                  targets.reshape({-1}));
    }
    const double share = static_cast<double>(micro) / static_cast<double>(local_batch);
    (loss * share).backward();
    loss_sum += loss.detach() * share;
  }

  if (spec.parallel.zero > 0) return ShardedStep(loss_sum);
  double mean_loss = 0;
  if (n == 1) {
    mean_loss = loss_sum.item<double>();  // nothing to exchange: gradients stay where they are
  } else {
    // One flat buffer of every gradient plus the loss: one all-reduce per step.
    std::vector<torch::Tensor> pieces;
    for (auto& [name, p] : params_) pieces.push_back(p.grad().reshape({-1}));
    pieces.push_back(loss_sum.reshape({1}));
    auto flat = torch::cat(pieces).to(torch::kCPU, torch::kFloat).contiguous();
    STRATA_RETURN_IF_ERROR(context_.communicator->AllReduceSum(flat.data_ptr<float>(), flat.numel()));
    flat.div_(static_cast<double>(n));
    mean_loss = flat[flat.numel() - 1].item<double>();
    flat = flat.to(device_);
    int64_t offset = 0;
    for (auto& [name, p] : params_) {
      p.mutable_grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  if (!std::isfinite(mean_loss)) {
    return Internal("loss became " + std::to_string(mean_loss) + " at step " + std::to_string(step_ + 1) +
                    "; lower train.lr or set train.grad_clip");
  }

  if (spec.train.grad_clip > 0) {
    // Global norm over all parameters (identical on every rank after the all-reduce).
    std::vector<torch::Tensor> tensors;
    for (auto& [name, p] : params_) tensors.push_back(p);
    torch::nn::utils::clip_grad_norm_(tensors, spec.train.grad_clip);
  }
  ++step_;
  AdamW();
  return mean_loss;
}

void Trainer::AdamW() {
  torch::NoGradGuard no_grad;
  const auto& tr = context_.spec.train;
  const double lr = LearningRate(tr, step_);
  const double bc1 = 1.0 - std::pow(tr.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(tr.beta2, static_cast<double>(step_));
  const double eps = 1e-8;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g = p.grad();
    if (tr.weight_decay > 0 && p.dim() >= 2) p.mul_(1.0 - lr * tr.weight_decay);
    exp_avg_[i].mul_(tr.beta1).add_(g, 1.0 - tr.beta1);
    exp_avg_sq_[i].mul_(tr.beta2).addcmul_(g, g, 1.0 - tr.beta2);
    auto denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bc2)).add_(eps);
    p.addcdiv_(exp_avg_[i], denom, -lr / bc1);
  }
}

Result<double> Trainer::ShardedStep(const torch::Tensor& loss_sum) {
  torch::NoGradGuard no_grad;
  const auto& tr = context_.spec.train;
  Communicator& comm = *context_.communicator;
  const double n = context_.world_size;
  const int64_t shard = shard_end_ - shard_begin_;

  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : params_) grads.push_back(p.grad().reshape({-1}));
  auto flat_grad = torch::cat(grads).to(torch::kCPU, torch::kFloat).contiguous();
  if (context_.spec.parallel.zero == 1) {
    STRATA_RETURN_IF_ERROR(comm.AllReduceSum(flat_grad.data_ptr<float>(), flat_grad.numel()));
  } else {
    STRATA_RETURN_IF_ERROR(comm.ReduceScatterSum(flat_grad.data_ptr<float>(), flat_grad.numel()));
  }
  auto g = flat_grad.narrow(0, shard_begin_, shard).div_(n);  // mean over ranks, this shard only

  // The loss and the clipping norm: two scalars, one all-reduce.
  auto scalars = torch::stack({loss_sum.to(torch::kCPU, torch::kFloat), g.pow(2).sum()}).contiguous();
  STRATA_RETURN_IF_ERROR(comm.AllReduceSum(scalars.data_ptr<float>(), 2));
  const double mean_loss = scalars[0].item<double>() / n;
  if (!std::isfinite(mean_loss)) {
    return Internal("loss became " + std::to_string(mean_loss) + " at step " + std::to_string(step_ + 1) +
                    "; lower train.lr or set train.grad_clip");
  }
  const double norm = std::sqrt(scalars[1].item<double>());
  if (tr.grad_clip > 0 && norm > tr.grad_clip) g.mul_(tr.grad_clip / (norm + 1e-6));

  // AdamW on this shard (the same element-wise formula as AdamW()).
  ++step_;
  std::vector<torch::Tensor> flat_params;
  for (auto& [name, p] : params_) flat_params.push_back(p.detach().reshape({-1}));
  auto flat_param = torch::cat(flat_params).to(torch::kCPU, torch::kFloat).contiguous();
  auto p = flat_param.narrow(0, shard_begin_, shard);
  const double lr = LearningRate(tr, step_);
  const double bc1 = 1.0 - std::pow(tr.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(tr.beta2, static_cast<double>(step_));
  if (tr.weight_decay > 0) p.mul_(shard_decay_mask_.mul(-lr * tr.weight_decay).add_(1.0));
  shard_exp_avg_.mul_(tr.beta1).add_(g, 1.0 - tr.beta1);
  shard_exp_avg_sq_.mul_(tr.beta2).addcmul_(g, g, 1.0 - tr.beta2);
  auto denom = (shard_exp_avg_sq_.sqrt() / std::sqrt(bc2)).add_(1e-8);
  p.addcdiv_(shard_exp_avg_, denom, -lr / bc1);

  STRATA_RETURN_IF_ERROR(comm.AllGather(flat_param.data_ptr<float>(), flat_param.numel()));
  auto updated = flat_param.to(device_);
  int64_t offset = 0;
  for (auto& [name, param] : params_) {
    param.copy_(updated.narrow(0, offset, param.numel()).view_as(param));
    offset += param.numel();
  }
  return mean_loss;
}

Result<std::vector<storage::CheckpointTensorInfo>> Trainer::SaveCheckpointShard() {
  auto put = [&](const std::string& name, const torch::Tensor& tensor) -> Status {
    auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    return context_.store->PutCheckpointTensor(context_.run_id, step_, name, ViewOf(cpu));
  };
  const bool sharded = context_.spec.parallel.zero > 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (i % context_.world_size != context_.rank) continue;
    const std::string& name = params_[i].first;
    STRATA_RETURN_IF_ERROR(put("param/" + name, params_[i].second));
    if (sharded) continue;
    STRATA_RETURN_IF_ERROR(put("adam_m/" + name, exp_avg_[i]));
    STRATA_RETURN_IF_ERROR(put("adam_v/" + name, exp_avg_sq_[i]));
  }
  if (sharded) {
    const std::string range = std::to_string(shard_begin_) + ":" + std::to_string(shard_end_) + ":" +
                              std::to_string(total_elements_);
    STRATA_RETURN_IF_ERROR(put("zero/adam_m/" + range, shard_exp_avg_));
    STRATA_RETURN_IF_ERROR(put("zero/adam_v/" + range, shard_exp_avg_sq_));
  }
  STRATA_RETURN_IF_ERROR(context_.store->CommitCheckpoint(context_.run_id, step_));
  STRATA_ASSIGN_OR_RETURN(auto list, context_.store->ListCheckpoints(context_.run_id));
  for (auto& info : list) {
    if (info.step == step_) return info.tensors;
  }
  return Internal("checkpoint at step " + std::to_string(step_) + " missing right after its commit");
}

}  // namespace strata::worker
