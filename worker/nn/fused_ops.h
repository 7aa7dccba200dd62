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

// A norm whose input goes on as the residual stream too, and where backward sums that input's
// two gradients (the residual path's and the norm's) inside the norm's backward kernel instead
// of in a separate add (kernels.h: AddRmsNorm, NormResidualGrad). Per block:
//   auto [x1, a] = FusedResidualRmsNorm(x, w1, ...);       // a = norm(x); x1 is x
//   ... attn = attention(a) ...
//   auto [mid, m] = FusedAddRmsNorm(x1, attn, w2, ...);    // mid = x + attn; m = norm(mid)
// Outputs may go unused (their gradient undefined); the other's gradient is still right.
struct NormedResidual {
  torch::Tensor residual;  // the residual stream: x itself, or x + y
  torch::Tensor normed;    // its norm, in out_type
};

// {x, RmsNorm(x)}: `residual` is x (a view of it carrying this op's gradient edge), so its
// gradient joins the norm's in one kernel: dx = d_residual + dRmsNorm.
NormedResidual FusedResidualRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                    torch::ScalarType out_type);
NormedResidual FusedResidualLayerNorm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                      double eps, torch::ScalarType out_type);

// {s, RmsNorm(s)} for s = x + y (x the residual, y a sublayer's output, of x's shape): s in the
// dtype LibTorch's x + y takes (fp32 for an fp32 residual and a bf16 y, as under autocast) and
// equal to it; the norm as FusedRmsNorm(s). Backward: ds = d_residual + dRmsNorm in one kernel,
// which is dx and, written again in y's dtype by the same kernel, dy.
NormedResidual FusedAddRmsNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight, double eps,
                               torch::ScalarType out_type);
NormedResidual FusedAddLayerNorm(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight,
                                 const torch::Tensor& bias, double eps, torch::ScalarType out_type);

// gelu(h + bias) in h's dtype: the tanh approximation (GPT-2's gelu_new) or the exact erf form;
// bias [cols] read as fp32, h the up projection's output [..., cols] without its bias.
torch::Tensor FusedBiasGelu(const torch::Tensor& h, const torch::Tensor& bias, bool tanh_approximation);

// silu(gate) * up, elementwise, in gate's dtype.
torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up);

// RoPE over x [batch, seq, heads, head_dim] (rows in sequence order): the first rotary_dims of
// each head rotated by the angles whose cos and sin are [seq, rotary_dims / 2] fp32.
torch::Tensor FusedRotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotary_dims, torch::ScalarType out_type);

}  // namespace strata::worker
