// QLoRA's frozen NF4 matrices on the device (internal to worker/, includes LibTorch): the codes and
// double-quantized block scales of quant/nf4.h (bitsandbytes' layout, 4.127 bits a weight), and a
// linear that dequantizes its weight inside each use - forward and again in backward, so no
// dequantized copy outlives the matmul (the activations keep x, never W).
//
//   W[i] = table[code_i] * absmax_b,   absmax_b = offset + nested_map[absmax_code_b] * nested_absmax_{b/256}
//
// in fp32, then the compute dtype; the same bits as quant::DequantizeNf4 (the CPU reference), in
// one pass of kernels::Nf4Dequantize (half a byte read and the operand written once a weight).
// On a CUDA device the weight is also quantized there (kernels::Nf4QuantizeBlocks and
// Nf4NestAbsmax, quant::QuantizeNf4's bits): a base's load costs its reading, not the host's cores.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace strata::worker {

struct Nf4Weight {
  std::vector<int64_t> shape;  // [out, in]
  int64_t numel = 0;
  torch::Tensor codes;          // uint8 [ceil(numel / 2)], the first element in the high nibble
  torch::Tensor absmax_codes;   // uint8 [blocks of 64]
  torch::Tensor nested_absmax;  // fp32 [ceil(blocks / 256)]
  torch::Tensor nested_map;     // fp32 [256]
  float offset = 0.0f;
  torch::ScalarType compute = torch::kFloat;  // what the matmul runs in
  int64_t bytes() const;                      // device bytes held
};

// `whole` (any float dtype, on any device) quantized as bitsandbytes' quantize_4bit (nf4, blocks of
// 64, compress_statistics) and placed on `device`: on its cores where it is a CUDA device, else on
// every host core; the same bits either way. InvalidArgument naming a non-finite value.
Result<Nf4Weight> QuantizeNf4Weight(const torch::Tensor& whole, const torch::Device& device, torch::ScalarType compute);
// The dequantized matrix, [shape] in w.compute.
torch::Tensor DequantizeNf4Weight(const Nf4Weight& w);
// x W^T + b with W dequantized inside (in w.compute); the gradient flows to x only. `w` must
// outlive the backward.
torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Weight& w, const torch::Tensor& bias);

}  // namespace strata::worker
