#include "worker/nn/nf4_linear.h"

#include <ATen/Parallel.h>

#include "quant/nf4.h"

namespace strata::worker {

int64_t Nf4Weight::bytes() const {
  return codes.nbytes() + absmax_codes.nbytes() + nested_absmax.nbytes() + nested_map.nbytes() + table.nbytes();
}

namespace {

// quant::QuantizeNf4 of a large matrix on every host core: runs of whole blocks (2^20 weights, an
// even count, so no byte of codes straddles two runs) quantized apart without nesting, then the
// block scales nested once over the whole matrix, with the mean Nf4Builder::Finish takes (a
// double sum in block order): the same bits as the one-thread reference, which a 70B base's
// billions of weights would otherwise wait on.
Result<quant::Nf4Tensor> QuantizeOnEveryCore(const float* values, const std::vector<int64_t>& shape) {
  constexpr int64_t kRun = int64_t{1} << 20;
  static_assert(kRun % quant::kNf4Blocksize == 0);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n <= kRun) return quant::QuantizeNf4(values, shape);
  const int64_t runs = (n + kRun - 1) / kRun;
  std::vector<Result<quant::Nf4Tensor>> parts(static_cast<size_t>(runs), Internal("not quantized"));
  at::parallel_for(0, runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t length = std::min(kRun, n - r * kRun);
      parts[static_cast<size_t>(r)] =
          quant::QuantizeNf4(values + r * kRun, {length}, quant::kNf4Blocksize, /*nested=*/false);
    }
  });
  quant::Nf4Tensor q;
  q.shape = shape;
  q.dtype = quant::SourceDtype::kFloat32;
  q.blocksize = quant::kNf4Blocksize;
  std::vector<float> absmax;
  double sum = 0.0;
  for (auto& part : parts) {
    if (!part.ok()) return part.status();
    q.codes.insert(q.codes.end(), part->codes.begin(), part->codes.end());
    for (float a : part->absmax) sum += a;
    absmax.insert(absmax.end(), part->absmax.begin(), part->absmax.end());
  }
  const float offset = static_cast<float>(sum / static_cast<double>(absmax.size()));
  STRATA_RETURN_IF_ERROR(quant::NestAbsmax(q, absmax, offset));
  return q;
}

}  // namespace

Result<Nf4Weight> QuantizeNf4Weight(const torch::Tensor& whole, const torch::Device& device,
                                    torch::ScalarType compute) {
  const torch::Tensor values = whole.to(torch::kCPU, torch::kFloat).contiguous();
  std::vector<int64_t> shape(values.sizes().begin(), values.sizes().end());
  STRATA_ASSIGN_OR_RETURN(quant::Nf4Tensor q, QuantizeOnEveryCore(values.data_ptr<float>(), shape));
  auto bytes = [&](const std::vector<uint8_t>& v) {
    // copy = true: on a CPU device `to` would otherwise alias the vector, freed on return.
    return torch::from_blob(const_cast<uint8_t*>(v.data()), {static_cast<int64_t>(v.size())}, torch::kUInt8)
        .to(device, torch::kUInt8, /*non_blocking=*/false, /*copy=*/true);
  };
  auto floats = [&](const float* data, size_t n) {
    return torch::from_blob(const_cast<float*>(data), {static_cast<int64_t>(n)}, torch::kFloat)
        .to(device, torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
  };
  Nf4Weight w;
  w.shape = shape;
  w.numel = q.numel();
  w.codes = bytes(q.codes);
  w.absmax_codes = bytes(q.absmax_codes);
  w.nested_absmax = floats(q.nested_absmax.data(), q.nested_absmax.size());
  w.nested_map = floats(q.nested_quant_map.data(), q.nested_quant_map.size());
  w.table = floats(quant::Nf4Table().data(), quant::Nf4Table().size());
  w.offset = q.offset;
  w.compute = compute;
  return w;
}

torch::Tensor DequantizeNf4Weight(const Nf4Weight& w) {
  torch::NoGradGuard no_grad;
  const int64_t blocks = w.absmax_codes.size(0);
  // Two codes a byte, the first in the high nibble.
  const torch::Tensor packed = w.codes.to(torch::kLong);
  const torch::Tensor codes =
      torch::stack({packed.div(16, "floor"), packed.remainder(16)}, 1).reshape({-1}).narrow(0, 0, w.numel);
  torch::Tensor values = w.table.index_select(0, codes);
  // Each block's absmax: the nested decode, a float multiply then a float add (bitsandbytes' order).
  const torch::Tensor scales = w.nested_absmax.repeat_interleave(quant::kNestedBlocksize).narrow(0, 0, blocks);
  const torch::Tensor absmax = w.nested_map.index_select(0, w.absmax_codes.to(torch::kLong)).mul(scales).add(w.offset);
  const int64_t padded = blocks * quant::kNf4Blocksize;
  if (padded != w.numel) values = torch::constant_pad_nd(values, {0, padded - w.numel});
  values = values.view({blocks, quant::kNf4Blocksize}).mul(absmax.unsqueeze(1)).reshape({-1}).narrow(0, 0, w.numel);
  return values.view(w.shape).to(w.compute);
}

namespace {

struct Nf4LinearFunction : torch::autograd::Function<Nf4LinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t handle) {
    const Nf4Weight& w = *reinterpret_cast<const Nf4Weight*>(handle);
    ctx->saved_data["w"] = handle;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    return torch::linear(x.to(w.compute), DequantizeNf4Weight(w));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const Nf4Weight& w = *reinterpret_cast<const Nf4Weight*>(ctx->saved_data["w"].toInt());
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    // dx = dy W, with W dequantized again: the forward kept no copy of it.
    const torch::Tensor dx = torch::matmul(grad[0].to(w.compute), DequantizeNf4Weight(w)).to(x_type);
    return {dx, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Weight& w, const torch::Tensor& bias) {
  torch::Tensor y = Nf4LinearFunction::apply(x, reinterpret_cast<int64_t>(&w));
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace strata::worker
