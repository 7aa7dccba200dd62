// The block pieces of kernels/ as differentiable LibTorch ops (internal to worker/, includes
// LibTorch): what the model families call where the op-by-op form was (maths in kernels.h).
// Each takes its inputs in fp32 or bf16 (anything else is widened to fp32 first) and writes its
// output in `out_type` - the compute dtype (compat::ComputeType: bf16 under the trainer's
// autocast, else the input's), so no consumer casts it again. On the CPU they run kernels/'s
// references; on a GPU its CUDA kernels on the current stream.
#pragma once

#include <torch/torch.h>

namespace strata::worker {

// Llama's RMSNorm over the last dimension: w * (x / sqrt(mean(x^2) + eps)); x [..., cols],
// weight [cols] (fp32 master or any float: read as fp32).
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps, torch::ScalarType out_type);

// LayerNorm over the last dimension: w * (x - mean) / sqrt(var + eps) + b (biased variance, as
// torch.nn.LayerNorm); weight and bias [cols], read as fp32.
torch::Tensor FusedLayerNorm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                             torch::ScalarType out_type);

// gelu(h + bias) in h's dtype: the tanh approximation (GPT-2's gelu_new) or the exact erf form;
// bias [cols] read as fp32, h the up projection's output [..., cols] without its bias.
torch::Tensor FusedBiasGelu(const torch::Tensor& h, const torch::Tensor& bias, bool tanh_approximation);

// silu(gate) * up, elementwise, in gate's dtype.
torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up);

// RoPE over x [batch, seq, heads, head_dim] (rows in sequence order): the first rotary_dims of
// each head rotated by the angles whose cos and sin are [seq, rotary_dims / 2] fp32.
torch::Tensor FusedRotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, int64_t rotary_dims,
                          torch::ScalarType out_type);

}  // namespace strata::worker
