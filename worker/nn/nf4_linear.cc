#include "worker/nn/nf4_linear.h"

#include <ATen/Parallel.h>

#include "kernels/kernels.h"
#include "model/parameters.h"
#include "quant/nf4.h"
#include "worker/nn/kernel_place.h"

namespace strata::worker {

int64_t Nf4Weight::bytes() const {
  return codes.nbytes() + absmax_codes.nbytes() + nested_absmax.nbytes() + nested_map.nbytes();
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
  for (auto& part : parts) {
    if (!part.ok()) return part.status();
    q.codes.insert(q.codes.end(), part->codes.begin(), part->codes.end());
    absmax.insert(absmax.end(), part->absmax.begin(), part->absmax.end());
  }
  STRATA_RETURN_IF_ERROR(
      quant::NestAbsmax(q, absmax, quant::AbsmaxMean(absmax.data(), static_cast<int64_t>(absmax.size()))));
  return q;
}

}  // namespace

namespace {

torch::Tensor ToDevice(const void* data, size_t n, torch::ScalarType type, const torch::Device& device) {
  // copy = true: on a CPU device `to` would otherwise alias the host buffer, freed on return.
  return torch::from_blob(const_cast<void*>(data), {static_cast<int64_t>(n)}, type)
      .to(device, type, /*non_blocking=*/false, /*copy=*/true);
}

// The device form of quant::QuantizeNf4: the blocks' codes and scales in one kernel, their mean in
// double in block order on the host (a float a block: 1/64 of the weights' bytes), the nesting in a
// second kernel.
Result<Nf4Weight> QuantizeOnDevice(const torch::Tensor& whole, const torch::Device& device) {
  const torch::ScalarType source = whole.scalar_type() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat;
  const torch::Tensor values = whole.to(device, source).contiguous();
  const int64_t n = values.numel();
  const int64_t blocks = (n + quant::kNf4Blocksize - 1) / quant::kNf4Blocksize;
  const auto on = torch::TensorOptions().device(device);
  Nf4Weight w;
  w.shape.assign(values.sizes().begin(), values.sizes().end());
  w.numel = n;
  w.codes = torch::empty({(n + 1) / 2}, on.dtype(torch::kUInt8));
  torch::Tensor absmax = torch::empty({blocks}, on.dtype(torch::kFloat));
  torch::Tensor first_nonfinite = torch::full({1}, n, on.dtype(torch::kLong));
  const kernels::Place place = KernelPlace(device);
  kernels::Nf4QuantizeBlocks(place, KernelType(source), values.data_ptr(), n, w.codes.data_ptr<uint8_t>(),
                             absmax.data_ptr<float>(), first_nonfinite.data_ptr<int64_t>());
  const int64_t bad = first_nonfinite.item<int64_t>();
  if (bad < n) {
    return InvalidArgument("NF4: element " + std::to_string(bad) + " of shape " + model::ShapeText(w.shape) +
                           " is not finite (" + std::to_string(values.view({-1})[bad].item<float>()) +
                           "); refusing to quantize it");
  }
  w.offset = quant::AbsmaxMean(absmax.cpu().data_ptr<float>(), blocks);
  w.absmax_codes = torch::empty({blocks}, on.dtype(torch::kUInt8));
  w.nested_absmax =
      torch::empty({(blocks + quant::kNestedBlocksize - 1) / quant::kNestedBlocksize}, on.dtype(torch::kFloat));
  kernels::Nf4NestAbsmax(place, absmax.data_ptr<float>(), blocks, w.offset, w.absmax_codes.data_ptr<uint8_t>(),
                         w.nested_absmax.data_ptr<float>());
  const std::vector<float> map = quant::DynamicMap8bit();
  w.nested_map = ToDevice(map.data(), map.size(), torch::kFloat, device);
  return w;
}

}  // namespace

Result<Nf4Weight> QuantizeNf4Weight(const torch::Tensor& whole, const torch::Device& device,
                                    torch::ScalarType compute) {
  torch::NoGradGuard no_grad;
  if (device.is_cuda()) {
    STRATA_ASSIGN_OR_RETURN(Nf4Weight w, QuantizeOnDevice(whole, device));
    w.compute = compute;
    return w;
  }
  const torch::Tensor values = whole.to(torch::kCPU, torch::kFloat).contiguous();
  std::vector<int64_t> shape(values.sizes().begin(), values.sizes().end());
  STRATA_ASSIGN_OR_RETURN(quant::Nf4Tensor q, QuantizeOnEveryCore(values.data_ptr<float>(), shape));
  Nf4Weight w;
  w.shape = shape;
  w.numel = q.numel();
  w.codes = ToDevice(q.codes.data(), q.codes.size(), torch::kUInt8, device);
  w.absmax_codes = ToDevice(q.absmax_codes.data(), q.absmax_codes.size(), torch::kUInt8, device);
  w.nested_absmax = ToDevice(q.nested_absmax.data(), q.nested_absmax.size(), torch::kFloat, device);
  w.nested_map = ToDevice(q.nested_quant_map.data(), q.nested_quant_map.size(), torch::kFloat, device);
  w.offset = q.offset;
  w.compute = compute;
  return w;
}

torch::Tensor DequantizeNf4Weight(const Nf4Weight& w) {
  // The kernel writes fp32 or bf16; another compute dtype (fp16) is the fp32 values cast once.
  const torch::ScalarType written = w.compute == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat;
  torch::Tensor out = torch::empty(w.shape, w.codes.options().dtype(written));
  kernels::Nf4Parts parts;
  parts.codes = w.codes.data_ptr<uint8_t>();
  parts.absmax_codes = w.absmax_codes.data_ptr<uint8_t>();
  parts.nested_absmax = w.nested_absmax.data_ptr<float>();
  parts.nested_map = w.nested_map.data_ptr<float>();
  parts.offset = w.offset;
  parts.n = w.numel;
  kernels::Nf4Dequantize(KernelPlace(w.codes.device()), parts, KernelType(written), out.data_ptr());
  return written == w.compute ? out : out.to(w.compute);
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
