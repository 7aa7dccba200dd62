// Fused kernels behind a plain C++ API: raw pointers, element counts and a stream; no LibTorch.
// Each kernel has a CPU reference (used by CPU workers and CI) and, in CUDA builds, a CUDA
// version (kernels/*.cu) checked against it. Pointers of a CUDA call are device pointers of one
// device; the call is queued on `place.stream` and returns before the kernel finishes.
//
// AdamW, for one flat fp32 vector (a span of a parameter unit, or of this rank's ZeRO shard of
// one, whose elements share one weight decay: the caller passes weight_decay 0 for the vectors
// and norms' spans), in one pass over memory - what the unfused form spends ten kernels and ~40
// bytes per element on:
//   g  = grad * grad_scale                          (gradient clipping's factor, 1 without; times
//                                                    1/dp where the caller left the dp ranks' sum)
//   p  = p * (1 - lr * weight_decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// in fp32, with the scalar factors rounded to fp32 once (as LibTorch's tensor ops do) and every
// operation rounded on its own (no fused multiply-add: adamw_scalars.h), so the CUDA kernel, the
// CPU reference and AdamWHost agree bit for bit, and LibTorch's op-by-op form to within fused
// multiply-add rounding (kernels_test states the bound).
// AdamWHost: the same on the CPU, vectorised (AVX-512 / AVX2 where the CPU has them) and split
// over up to `threads` threads; what AdamW runs on the CPU (threads = 1) and what an offloaded
// optimizer runs ([parallel] offload).
//
// SquareSum: sum over i of g[i]^2 - the gradient norm's share of one span of a unit (the caller
// leaves out tensor-parallel replicas and tied copies, so each element counts once). Accumulated
// into *out, so the spans of a step add into one scalar; deterministic (a fixed reduction order
// for a given n), unlike atomics.
// SquareSumHost: the same sum on the host's cores, in double: chunks of 2^20 elements, each
// summed in order, and the chunks' sums added in order - the same result for any thread count.
// For gradients that live in host memory on a GPU worker (offload = "optimizer+params"), where
// one thread would take seconds a step on a 7B model.
//
// CrossEntropyGradInPlace: the softmax cross-entropy of each row of logits z ([rows, row_stride],
// of which the first `vocab` columns are the vocabulary and the rest padding), and its gradient
// written over the logits - the loss's whole elementwise work in one kernel reading each row
// twice (the second read mostly from L2) and writing it once, where the unfused form widens to
// fp32 and makes ~12 passes. In fp32 whatever the storage dtype:
//   m_i = max_{v < V} z_iv,   lse_i = m_i + log sum_{v < V} exp(z_iv - m_i)
//   row_loss[i] = lse_i - z_{i t_i}
//   z_iv <- grad_scale * (exp(z_iv - lse_i) - [v = t_i])   for v < V;   0 for V <= v < row_stride
// rounded to the storage dtype (bf16: round to nearest even, as LibTorch converts).
// Vocab-parallel, the same in two passes (worker/nn/fused_loss.h): each tensor-parallel rank holds
// the logits of its slice of the vocabulary, and the ranks merge their row statistics between
// the passes. t_i is the target's column in this slice, or any value outside [0, V) where the
// target is another rank's.
//   CrossEntropyRowStats:     lse_i = m_i + log sum_{v < V} exp(z_iv - m_i) over this slice;
//                             target_logit[i] = z_{i t_i} where 0 <= t_i < V, else 0
//   CrossEntropyGradFromLse:  z_iv <- grad_scale * (exp(z_iv - lse_i) - [v = t_i]) for v < V;
//                             0 for V <= v < row_stride  (lse_i: the whole vocabulary's)
//
// Block pieces (block_ops.cu), each a forward and a backward, in fp32 maths whatever the storage
// dtype, rounding once on store (where LibTorch's op-by-op form under autocast widens, computes,
// narrows and casts again for every consumer):
//   RmsNorm (Llama's, one row of `cols` at a time):
//     r = 1 / sqrt(mean_j x_j^2 + eps),   y_j = w_j * (x_j * r)
//     dx_j = r * w_j dy_j - x_j * (r^3 / cols) * sum_k w_k dy_k x_k,   dw_j = sum_rows dy_j x_j r
//     dw comes as fp32 partial sums, [NormWeightPartialRows(place, rows), cols], which the
//     caller adds up (a fixed order: deterministic).
//   LayerNorm (GPT-2's, GPT-NeoX's):  mu = mean_j x_j,  r = 1 / sqrt(mean_j (x_j - mu)^2 + eps),
//     xhat = (x - mu) r,  y = w xhat + b
//     dx = r (g - mean_j g_j - xhat mean_j g_j xhat_j),  g = w dy;  dw = sum_rows dy xhat,  db = sum_rows dy
//     (dw and db as RmsNorm's dw: partial rows the caller adds up)
//   AddRmsNorm, AddLayerNorm (a residual add and the norm after it, one kernel): for the
//   residual stream x and a sublayer's output a (fp32 or bf16 each),
//     s = x + a   in fp32, stored in x's dtype (under autocast x is the fp32 residual and a bf16:
//                 s is fp32, as LibTorch's x + a)
//     y = norm(s) of s as stored (rounded to x's dtype first), saving rstd (and mean)
//   so y, rstd and mean are what the norm's forward gives reading s back; the add's pass over x
//   and a is the norm's first pass over its row (x and a are re-read from L1 by the later ones).
//   The norm backwards take an optional residual gradient (NormResidualGrad), for a norm whose
//   input s also goes on as the residual stream (AddRmsNorm's s, or a block's input x that feeds
//   its first norm and the residual add):
//     ds = d_residual + dx_norm    (fp32; dx_norm the norm's dx above, d_residual absent: 0)
//   stored as dx in x's dtype and, when asked, again in a second dtype (da of s = x + a: the bf16
//   sublayer output's gradient) - what autograd did in two more kernels (an fp32 add of the two
//   gradients of s, and a cast for a). The add is rounded apart from dx_norm's product, so in
//   fp32 ds equals the unfused form's (dx_norm stored, then added) bit for bit.
//   SwiGlu (SiLU-gated MLP hidden):  y = silu(g) * u,  silu(g) = g * sigmoid(g)
//     dg = dy * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),   du = dy * silu(g)
//   Rotary (RoPE as transformers, rotate_half over the first `rotary_dims` of each head; the rest
//   passes through): for x [batch, seq, heads, head_dim], position p of its row, h = rotary_dims/2,
//     y_i = x_i cos_{p,i} - x_{i+h} sin_{p,i},   y_{i+h} = x_{i+h} cos_{p,i} + x_i sin_{p,i}   (i < h)
//   with cos, sin [seq, h] fp32. Its backward is the same rotation with -sin (`inverse`).
//   BiasGelu (GPT-2's and GPT-NeoX's MLP: the bias of the up projection and its GELU, on the
//   matmul's output h [rows, cols] with the bias [cols] fp32):
//     z = h + b,   y = gelu(z)
//     tanh (GPT-2's gelu_new):  gelu(z) = z/2 (1 + tanh(k (z + 0.044715 z^3))),  k = sqrt(2/pi)
//       gelu'(z) = (1 + t)/2 + z/2 (1 - t^2) k (1 + 3 0.044715 z^2),  t = tanh(k (z + 0.044715 z^3))
//     erf:  gelu(z) = z/2 (1 + erf(z / sqrt 2)),  gelu'(z) = (1 + erf(z / sqrt 2))/2 + z exp(-z^2/2) / sqrt(2 pi)
//     dh = dy gelu'(z) (z recomputed from the saved h),  db = sum_rows dh (before rounding dh),
//   as fp32 partial sums [BiasPartialRows(place, rows), cols] the caller adds up. What it
//   replaces: the bias inside the matmul, a GELU kernel each way, and a bf16 column reduction.
//
// AdamW8bit: the AdamW above with its moments m and v kept as 8-bit codes, blockwise (Dettmers et
// al. 2021, "8-bit Optimizers via Block-wise Quantization"; bitsandbytes' blockwise Adam8bit), so
// the state costs 2 bytes per element (and 8 per block of 256) where fp32 AdamW's costs 8. The
// weight decay is one for the whole call, as AdamW's.
//   blocks    the vector is cut into blocks of kAdamW8bitBlock = 256 consecutive elements from its
//             first (the last may be partial): blocks are counted from the first element of
//             each call (worker/train/optimizer.h: each span of this rank's optimizer range).
//   state     per moment, per block b an fp32 scale S_b and per element i an 8-bit code q_i: an
//             index into a sorted table C[0..255] of values in [-1, 1] (AdamW8bitCodeTable): m
//             uses the signed table, v the unsigned one (values in [0, 1]). Element i stands for
//               x_i = C[q_i] * S_b                                  (fp32, one rounding)
//   quantize  S_b = max_{i in b} |x_i|   (m: the largest |m|; v: the largest v, v >= 0)
//             q_i = argmin_k |fl(x_i / S_b) - C[k]|   (fp32 division and distances; ties to the
//                                                      lower k; x_i / S_b taken as 0 if S_b = 0)
//             Both tables hold exactly 0 and 1 (the signed one -1 too): a block's largest value
//             and its zeros are stored exactly, a block of zeros is all codes of 0 with S_b = 0,
//             and |C[q_i] S_b - x_i| <= S_b * (the table's largest gap) / 2 up to fp32 rounding
//             (signed 0.0140625 / 2, unsigned 0.00703125 / 2, both in the top decade; each
//             decade down has gaps a fifth as wide).
//   tables    bitsandbytes' create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8).
//             For each decade d = 0..6, N_d codes at the midpoints of N_d equal steps over
//             [0.1, 1], scaled to the decade:
//               c_{d,k} = 10^(d-6) * (0.1 + (k + 1/2) * 0.9 / N_d),   k = 0..N_d - 1
//             unsigned (N_d = 2^(d+1)): the 254 c_{d,k}, 0 and 1.
//             signed (N_d = 2^d): the 127 c_{d,k}, their negatives but -c_{0,0}, 0, 1 and -1.
//             Computed in double, rounded to fp32 once, sorted. The one change to bitsandbytes'
//             signed map: it has no -1 (its lowest code is -0.99296875, so a block whose largest
//             |m| is negative could not keep it, and m's negative peaks would shrink 0.7% a
//             step); -1 takes the place of -c_{0,0} = -0.55e-6 (negative values within 2e-6 of
//             0, relative to the block's largest, now round to 0 or -3.25e-6). The largest gap
//             stays, and the map is symmetric but for +0.55e-6.
//   step      one pass over each block: per element dequantize m and v, then the AdamW above in
//             fp32 with the same fp32 scalar factors, every operation rounded on its own (no
//             fused multiply-add, so the CUDA kernel and the CPU reference agree bit for bit),
//             store p; then quantize the new m and v (S_b from the block's new values) and store
//             codes and scales. p moves by the new m and v before they are quantized. A step
//             reads g and p (4 bytes each) and both codes (1 each) and writes p and the codes:
//             16 bytes per element, where fp32 AdamW moves 28.
//             A non-finite gradient leaves p NaN, as fp32 AdamW does; the moments of its block
//             are then meaningless too (a NaN x_i / S_b takes code 0).
//
// NF4 (QLoRA's frozen base: quant/nf4.h's layout, bitsandbytes' own; the maths at the top of
// quant/nf4.cc). A matrix of n weights is cut into blocks of 64 (quant::kNf4Blocksize), each stored as 4-bit
// codes (two a byte, the first in the high nibble) and one block scale, itself an 8-bit code in
// groups of 256 blocks (double quantization):
//   Nf4Dequantize:      absmax_b = nested_map[absmax_code_b] * nested_absmax_{b/256} + offset
//                       w_i      = table[code_i] * absmax_{i/64}
//                       in fp32, each operation rounded on its own (no fused multiply-add), then
//                       stored in the output dtype (bf16: round to nearest even) - quant::
//                       DequantizeNf4's bits. Reads half a byte a weight and writes the matmul's
//                       operand once: what a QLoRA linear runs before each of its two matmuls.
//   Nf4QuantizeBlocks:  per block, absmax_b = max |w| and code_i = rounding::Nf4Code of
//                       w_i * (1 / absmax_b) (IEEE reciprocal; an all-zero block codes 0; past n,
//                       a zero pad), the block scales left in fp32;
//   Nf4NestAbsmax:      the scales' 8-bit codes against `offset` (the mean of every absmax, which
//                       the caller takes in double in block order, as quant::Nf4Builder does):
//                       per group of 256, nested_absmax_g = max |absmax_b - offset| and
//                       absmax_code_b = rounding::DynamicCode of (absmax_b - offset) * (1 /
//                       nested_absmax_g) against quant::DynamicMap8bit().
//   Together they are quant::QuantizeNf4(nested = true) bit for bit (quant/nf4_rounding.h holds
//   the roundings both compile), on the device: a 70B base quantized as it loads in seconds, not
//   the host's half hour. CUDA only: the host's quantization is quant::QuantizeNf4 itself.
//
// DrawNormal: the initial values of a seed-drawn parameter (worker/nn/causal_lm.h ParameterDraw),
// elements [first, first + n) of the stream `stream` (normal_draw_math.h: a counter-based
// generator, each value a function of (stream, index) alone, approximately N(mean, std^2)), into
// out[0, n) in fp32 - the same bits on the CPU (DrawNormalHost, split over `threads` threads) and
// on a GPU, for any slice drawn alone.
#pragma once

#include <cstdint>
#include <string>

namespace strata::kernels {

struct Place {
  bool cuda = false;
  void* stream = nullptr;  // a cudaStream_t (CUDA only); null: the default stream
};

// Storage dtype of a kernel's tensors where it takes more than fp32 (bf16 as raw uint16 bits).
enum class DType { kFloat32, kBFloat16 };

struct AdamWArgs {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;         // t, 1-based: the bias corrections' exponent
  double grad_scale = 1.0;  // clipping's factor
};

// True when this build has the CUDA kernels.
bool HasCuda();

// `param_bf16` (optional): also write the updated parameters rounded to bf16 (to nearest even,
// as LibTorch's cast) - the working copy a bf16 run's matmuls read, made in the same pass rather
// than a second one over the fp32 weights.
void AdamW(const Place& place, const AdamWArgs& args, float* param, const float* grad, float* exp_avg,
           float* exp_avg_sq, int64_t n, uint16_t* param_bf16 = nullptr);
void AdamWHost(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               int threads = 1);
double SquareSumHost(const float* grad, int64_t n, int threads = 1);

// `out`: n floats on the place's device; `threads`: the CPU's split (unused on a GPU).
void DrawNormal(const Place& place, uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n,
                int threads = 1);
void DrawNormalHost(uint64_t stream, int64_t first, float mean, float std, float* out, int64_t n, int threads = 1);

// `scratch`: at least SquareSumScratch() floats on the same device (CUDA; unused on CPU).
void SquareSum(const Place& place, const float* grad, int64_t n, float* out, float* scratch);
int64_t SquareSumScratch();

// `targets` [rows] in [0, vocab); `row_loss` [rows] fp32; all on the place's device.
void CrossEntropyGradInPlace(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
                             int64_t row_stride, const int64_t* targets, float grad_scale, float* row_loss);

// `lse` and `target_logit` [rows] fp32; `targets` [rows] any int64.
void CrossEntropyRowStats(const Place& place, DType dtype, const void* logits, int64_t rows, int64_t vocab,
                          int64_t row_stride, const int64_t* targets, float* lse, float* target_logit);
void CrossEntropyGradFromLse(const Place& place, DType dtype, void* logits, int64_t rows, int64_t vocab,
                             int64_t row_stride, const int64_t* targets, const float* lse, float grad_scale);

void RmsNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, DType y_dtype, void* y,
                    float* rstd, int64_t rows, int64_t cols, float eps);
int64_t NormWeightPartialRows(const Place& place, int64_t rows);

// The norm backwards' optional residual gradient (see AddRmsNorm above); the default, all null,
// is the plain backward. Both [rows, cols] on the place's device, neither aliasing dx.
struct NormResidualGrad {
  const void* d_residual = nullptr;  // in x_dtype: the gradient reaching the norm's input by the residual path
  void* dx_copy = nullptr;           // dx (with d_residual added) written again, in copy_dtype
  DType copy_dtype = DType::kBFloat16;
};

// dx in x_dtype; dy in y_dtype (the forward's output dtype).
void RmsNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* rstd,
                     DType dy_dtype, const void* dy, void* dx, float* dweight_partials, int64_t rows, int64_t cols,
                     const NormResidualGrad& residual = {});

// mean and rstd [rows] fp32 (saved for the backward); dweight and dbias partials as RmsNorm's.
void LayerNormForward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* bias,
                      DType y_dtype, void* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
void LayerNormBackward(const Place& place, DType x_dtype, const void* x, const float* weight, const float* mean,
                       const float* rstd, DType dy_dtype, const void* dy, void* dx, float* dweight_partials,
                       float* dbias_partials, int64_t rows, int64_t cols, const NormResidualGrad& residual = {});

// s = x + addend into `sum` (x_dtype; may not alias x or addend), y = the norm of s; the rest as
// RmsNormForward / LayerNormForward. Their backward is the norm's backward of `sum`.
void AddRmsNormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend,
                       void* sum, const float* weight, DType y_dtype, void* y, float* rstd, int64_t rows, int64_t cols,
                       float eps);
void AddLayerNormForward(const Place& place, DType x_dtype, const void* x, DType addend_dtype, const void* addend,
                         void* sum, const float* weight, const float* bias, DType y_dtype, void* y, float* mean,
                         float* rstd, int64_t rows, int64_t cols, float eps);

// All of g, u, y (and the gradients) in one dtype; n elements.
void SwiGluForward(const Place& place, DType dtype, const void* gate, const void* up, void* y, int64_t n);
void SwiGluBackward(const Place& place, DType dtype, const void* gate, const void* up, const void* dy, void* dgate,
                    void* dup, int64_t n);

struct RotaryShape {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0, rotary_dims = 0;  // rotary_dims even, <= head_dim
};
void Rotary(const Place& place, const RotaryShape& shape, DType x_dtype, const void* x, DType y_dtype, void* y,
            const float* cos, const float* sin, bool inverse);

enum class Gelu { kTanh, kErf };
// h, y, dy and dh in one dtype; bias fp32.
void BiasGeluForward(const Place& place, Gelu kind, DType dtype, const void* h, const float* bias, void* y,
                     int64_t rows, int64_t cols);
int64_t BiasPartialRows(const Place& place, int64_t rows);
void BiasGeluBackward(const Place& place, Gelu kind, DType dtype, const void* h, const float* bias, const void* dy,
                      void* dh, float* dbias_partials, int64_t rows, int64_t cols);

// Embedding rows read from and summed into a ZeRO-3 shard of the table (worker/train/zero3_lookup.cc):
// a table [rows, cols], flat, of which this rank holds the elements [shard_begin, shard_end)
// at `shard` (its edges may cut a row). For n looked-up ids:
//   ShardRowsGather:      out[i, j] = shard[ids[i] cols + j - shard_begin] where that element is
//                         in the shard, else 0 (ids outside the table give zero rows)
//   ShardRowsScatterAdd:  the gradient. `sorted` is the ids stably sorted and `order` where each
//                         came from (sorted[k] = ids[order[k]]); for every row r named, and each
//                         of its elements in the shard,
//                           grad[r cols + j - shard_begin] += sum over the run of k with
//                                                             sorted[k] = r, in order, of dy[order[k], j]
//                         summed in fp32 in two levels: the sorted positions fall in chunks of
//                         kShardRowsChunk (chunk c holds k in [c S, c S + S)); the run's part in
//                         each chunk it meets is summed in order from 0, and those parts in chunk
//                         order from 0, then added once. A run inside one chunk is one part: the
//                         plain sum in order, which is what LibTorch's CPU embedding backward of a
//                         dense table, added into the gradient, gives bit for bit (its CUDA one
//                         sums in segments and rounds otherwise); a longer run differs from it by
//                         rounding only. No dense table and no atomics: each part is one block's,
//                         the parts' sum one block's, so the result is deterministic and the CUDA
//                         kernels' equals the reference's; a run of most of a batch (a padding
//                         token, or text's commonest words) is summed by many blocks side by side.
//                         `scratch`: ShardRowsScatterAddScratch(n, cols) floats on the place's
//                         device (the parts of runs that cross a chunk's edge).
inline constexpr int64_t kShardRowsChunk = 32;
int64_t ShardRowsScatterAddScratch(int64_t n, int64_t cols);
struct ShardRowsShape {
  int64_t cols = 0, shard_begin = 0, shard_end = 0;
};
void ShardRowsGather(const Place& place, const ShardRowsShape& shape, const float* shard, const int64_t* ids, int64_t n,
                     float* out);
void ShardRowsScatterAdd(const Place& place, const ShardRowsShape& shape, const float* dy, const int64_t* sorted,
                         const int64_t* order, int64_t n, float* grad, float* scratch);

// ---- AdamW8bit (maths above). codes: n bytes per moment; scales: AdamW8bitBlocks(n) floats
// per moment; all on the place's device. `param`, `grad` as AdamW's.
constexpr int64_t kAdamW8bitBlock = 256;
int64_t AdamW8bitBlocks(int64_t n);  // ceil(n / kAdamW8bitBlock): the scales per moment

// The sorted code table, 256 floats on the host (built once, the same in every process): signed
// for m, unsigned for v. C[code] * scale is a stored value.
const float* AdamW8bitCodeTable(bool is_signed);

void AdamW8bit(const Place& place, const AdamWArgs& args, float* param, const float* grad, uint8_t* exp_avg_codes,
               float* exp_avg_scales, uint8_t* exp_avg_sq_codes, float* exp_avg_sq_scales, int64_t n);

// Fresh state (m = v = 0): every code the code of 0, every scale 0.
void AdamW8bitInit(const Place& place, uint8_t* exp_avg_codes, float* exp_avg_scales, uint8_t* exp_avg_sq_codes,
                   float* exp_avg_sq_scales, int64_t n);

// Between fp32 values and blockwise codes, by the rule above (signed: m's table, unsigned: v's):
// for checkpoints written or read in fp32, and for tests. Unsigned, negative values store as 0.
void Dequantize8bit(const Place& place, bool is_signed, const uint8_t* codes, const float* scales, float* out,
                    int64_t n);
void Quantize8bit(const Place& place, bool is_signed, const float* values, uint8_t* codes, float* scales, int64_t n);

// ---- NF4 (maths above). Pointers on the place's device.
struct Nf4Parts {
  const uint8_t* codes = nullptr;         // ceil(n / 2)
  const uint8_t* absmax_codes = nullptr;  // ceil(n / 64)
  const float* nested_absmax = nullptr;   // ceil(blocks / 256)
  const float* nested_map = nullptr;      // 256
  float offset = 0.0f;
  int64_t n = 0;
};
void Nf4Dequantize(const Place& place, const Nf4Parts& parts, DType out_dtype, void* out);
void Nf4DequantizeReference(const Nf4Parts& parts, DType out_dtype, void* out);
// `values` n in `in_dtype`; writes ceil(n / 2) code bytes and ceil(n / 64) block scales, and into
// `first_nonfinite` (one int64, set to n or more by the caller) the lowest index of a value that
// is not finite, whose codes are then meaningless: the caller refuses the tensor.
void Nf4QuantizeBlocks(const Place& place, DType in_dtype, const void* values, int64_t n, uint8_t* codes, float* absmax,
                       int64_t* first_nonfinite);
// `absmax` [blocks] -> absmax_codes [blocks], nested_absmax [ceil(blocks / 256)].
void Nf4NestAbsmax(const Place& place, const float* absmax, int64_t blocks, float offset, uint8_t* absmax_codes,
                   float* nested_absmax);

// The CPU references (what the Place-dispatching calls run on the CPU).
void AdamWReference(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    int64_t n, uint16_t* param_bf16 = nullptr);
void AdamW8bitReference(const AdamWArgs& args, float* param, const float* grad, uint8_t* exp_avg_codes,
                        float* exp_avg_scales, uint8_t* exp_avg_sq_codes, float* exp_avg_sq_scales, int64_t n);
void AdamW8bitInitReference(uint8_t* exp_avg_codes, float* exp_avg_scales, uint8_t* exp_avg_sq_codes,
                            float* exp_avg_sq_scales, int64_t n);
void Dequantize8bitReference(bool is_signed, const uint8_t* codes, const float* scales, float* out, int64_t n);
void Quantize8bitReference(bool is_signed, const float* values, uint8_t* codes, float* scales, int64_t n);
void SquareSumReference(const float* grad, int64_t n, float* out);
void ShardRowsGatherReference(const ShardRowsShape& shape, const float* shard, const int64_t* ids, int64_t n,
                              float* out);
void ShardRowsScatterAddReference(const ShardRowsShape& shape, const float* dy, const int64_t* sorted,
                                  const int64_t* order, int64_t n, float* grad);
void CrossEntropyGradInPlaceReference(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                      const int64_t* targets, float grad_scale, float* row_loss);
void CrossEntropyRowStatsReference(DType dtype, const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                   const int64_t* targets, float* lse, float* target_logit);
void CrossEntropyGradFromLseReference(DType dtype, void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                                      const int64_t* targets, const float* lse, float grad_scale);
void RmsNormForwardReference(DType x_dtype, const void* x, const float* weight, DType y_dtype, void* y, float* rstd,
                             int64_t rows, int64_t cols, float eps);
// One partial row: dweight_partials [cols].
void RmsNormBackwardReference(DType x_dtype, const void* x, const float* weight, const float* rstd, DType dy_dtype,
                              const void* dy, void* dx, float* dweight_partials, int64_t rows, int64_t cols,
                              const NormResidualGrad& residual = {});
void LayerNormForwardReference(DType x_dtype, const void* x, const float* weight, const float* bias, DType y_dtype,
                               void* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
void LayerNormBackwardReference(DType x_dtype, const void* x, const float* weight, const float* mean, const float* rstd,
                                DType dy_dtype, const void* dy, void* dx, float* dweight_partials,
                                float* dbias_partials, int64_t rows, int64_t cols,
                                const NormResidualGrad& residual = {});
void AddRmsNormForwardReference(DType x_dtype, const void* x, DType addend_dtype, const void* addend, void* sum,
                                const float* weight, DType y_dtype, void* y, float* rstd, int64_t rows, int64_t cols,
                                float eps);
void AddLayerNormForwardReference(DType x_dtype, const void* x, DType addend_dtype, const void* addend, void* sum,
                                  const float* weight, const float* bias, DType y_dtype, void* y, float* mean,
                                  float* rstd, int64_t rows, int64_t cols, float eps);
void SwiGluForwardReference(DType dtype, const void* gate, const void* up, void* y, int64_t n);
void SwiGluBackwardReference(DType dtype, const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                             int64_t n);
void RotaryReference(const RotaryShape& shape, DType x_dtype, const void* x, DType y_dtype, void* y, const float* cos,
                     const float* sin, bool inverse);
void BiasGeluForwardReference(Gelu kind, DType dtype, const void* h, const float* bias, void* y, int64_t rows,
                              int64_t cols);
// One partial row: dbias_partials [cols].
void BiasGeluBackwardReference(Gelu kind, DType dtype, const void* h, const float* bias, const void* dy, void* dh,
                               float* dbias_partials, int64_t rows, int64_t cols);

}  // namespace strata::kernels
