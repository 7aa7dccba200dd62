// NF4 (4-bit NormalFloat) storage of a frozen weight, bit for bit as bitsandbytes stores it.
// This file holds the NF4 table and thresholds, the 4-bit and 8-bit rounding, ValidateNf4, the
// streaming Nf4Builder (and the nested quantization of absmax), QuantizeNf4* and dequantization.
// bnb's state-dict layout and its packed JSON are in nf4_state_dict.cc.
//
// The maths (QLoRA, Dettmers et al. 2023, section 3; bitsandbytes' functional.py and kernels.cu):
//   * NF4 table q_0 < ... < q_15: quantiles of N(0, 1), create_normal_map(offset=0.9677083,
//     use_extra_value=True): 8 levels from norm.ppf(linspace(0.9677083, 0.5, 9)[:-1]), 7 from the
//     negated ppf of linspace(0.9677083, 0.5, 8)[:-1], and an exact 0, divided by the largest, so
//     q_0 = -1, q_7 = 0, q_15 = 1 (asymmetric: 7 negative, 8 positive levels). bnb hard-codes the
//     16 float32 values (get_4bit_type("nf4") and nf4_dequantization_lut); Nf4Table() holds them.
//   * Blocks of B = 64 consecutive elements of the flattened (row-major) tensor; the last block may
//     be short. absmax_b = max |w| over the block (float32).
//   * code(w) = the table index nearest to x = w * (1.0f / absmax_b) (the CUDA kernel multiplies
//     by the reciprocal; it does not divide). bnb's dQuantizeNF4 decides with a tree of the 15
//     midpoints (q_i + q_{i+1}) / 2, taken as float literals: code = #{midpoints m : x > m}, so a
//     value exactly on a midpoint takes the lower code, and a NaN takes code 0.
//     A block whose absmax is 0 gets 0 * inf = NaN everywhere, so code 0 (q_0 = -1, times 0).
//   * Packing: two codes a byte, element 2k in the HIGH nibble, 2k+1 in the low one; ceil(n/2)
//     bytes. For odd n the last low nibble is a zero pad: code 7, or 0 in an all-zero last block.
//   * Dequantization: w' = q_code * absmax_b (float32 multiply), then to the original dtype.
//   * Double quantization (compress_statistics=True): offset = mean_b absmax_b; the values
//     absmax_b - offset are quantized with bnb's quantize_blockwise in blocks of 256: per group
//     absmax2_g = max |absmax_b - offset|, code8_b = nearest entry of the signed dynamic 8-bit map
//     (create_dynamic_map(signed=True)) to (absmax_b - offset) * (1.0f / absmax2_g), found by a
//     7-step binary search and a float midpoint compare (dQuantize<0>). Decoding:
//     absmax'_b = map[code8_b] * absmax2_g + offset (float32: multiply, then add).
//   * Storage cost per weight: 4 bits of code + 8/64 bits of code8 + 32/(64 * 256) bits of absmax2
//     = 4 + 0.125 + 0.00195 = 4.127 bits (without double quantization 4 + 32/64 = 4.5 bits), plus
//     a constant 16 + 256 floats of tables, one offset and a short JSON.
//
// Where this mirrors bnb exactly and where it cannot. Checked against bitsandbytes built from its
// main branch (CUDA 13, sm_90, torch 2.11) on an H200: 10 tensors up to 16.7M values, f32, bf16
// and fp16, with zero blocks and values placed on the thresholds: every packed code, every 8-bit
// absmax code, the non-nested absmax, quant_map and nested_quant_map were byte-identical, bnb's
// state dicts read back and re-serialized byte-identical, and dequantized values bit-identical.
//   * Codes: the CUDA kernels' arithmetic, with IEEE 1.0f / absmax. bnb builds with
//     --use_fast_math, whose reciprocal differs from IEEE by one ulp for ~13% of inputs; a value
//     within an ulp or two of a midpoint could then take the neighbouring code (never seen in the
//     28M values checked). Subnormal absmax values (below 1.2e-38) follow IEEE here, not fast
//     math's flush to zero.
//   * offset: torch's float32 mean on the GPU sums in an order of its own; we sum in double and
//     round once. It differed from torch's by one ulp in half of the nested cases checked, which
//     moves nested_absmax by an ulp and changes the JSON's digits; no 8-bit code moved.
//   * bnb's CPU ("default") backend differs from its CUDA kernels on edge cases: a zero block
//     there gets code 7, the last short block divides instead of multiplying by the reciprocal,
//     and its float32 midpoints differ from the literals by an ulp at four exact float ties. We
//     follow CUDA, the path Params4bit takes when a model is quantized on load.
//   * Non-finite input is refused (InvalidArgument) rather than encoded.
#include "quant/nf4.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "common/float_bits.h"
#include "quant/nf4_internal.h"
#include "quant/nf4_rounding.h"

namespace strata::quant {
namespace {

// nf4_dequantization_lut in bitsandbytes' csrc/kernels.cu (= get_4bit_type("nf4") in functional.py).
constexpr std::array<float, 16> kNf4 = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// The comparison constants of dQuantizeNF4 in csrc/kernels.cu, in ascending order.
constexpr std::array<float, 15> kNf4Mid = {
    -0.8480964004993439f,  -0.6106329262256622f,   -0.4599952697753906f, -0.33967943489551544f, -0.23460740596055984f,
    -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f, 0.1202552504837513f,   0.2035212516784668f,
    0.2920137718319893f,   0.3893125355243683f,    0.5016634166240692f,  0.6427869200706482f,   0.8614784181118011f,
};

}  // namespace

namespace internal {

bool ValidBlocksize(int64_t b) {
  for (int64_t v = 32; v <= 4096; v *= 2)
    if (b == v) return true;
  return false;
}

Result<int64_t> CheckedNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      return InvalidArgument("NF4: dimension " + std::to_string(i) + " of the shape is " + std::to_string(shape[i]) +
                             "; dimensions must be >= 0");
    if (shape[i] != 0 && n > (int64_t{1} << 62) / shape[i])
      return InvalidArgument("NF4: the shape's element count overflows");
    n *= shape[i];
  }
  return n;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace internal

using internal::CeilDiv;
using internal::CheckedNumel;
using internal::ShapeString;
using internal::ValidBlocksize;

const std::array<float, 16>& Nf4Table() { return kNf4; }
const std::array<float, 15>& Nf4Thresholds() { return kNf4Mid; }

uint8_t QuantizeNf4Value(float x) { return rounding::Nf4Code(kNf4Mid.data(), x); }

std::vector<float> DynamicMap8bit() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for i = 0..6, the means of
  // adjacent points of torch.linspace(0.1, 1, 2^i + 1) (float32), times 10^(i-6) (a Python float,
  // which torch rounds to float32 before the float32 multiply), both signs; then 0 and 1.0; sorted.
  // torch's CPU linspace: step = (end - start) / (steps - 1) in float, then start + step * k for
  // the first half and end - step * (steps - 1 - k) for the rest. Its AVX2 and AVX512 builds
  // contract those into fused multiply-adds (one rounding), and that is what std::fma does here;
  // the map then equals bnb's create_dynamic_map() under torch 2.11 bit for bit. (torch's non-SIMD
  // "DEFAULT" build rounds twice and gives a map that differs in 42 of the 256 entries.)
  std::vector<float> data;
  data.reserve(256);
  for (int i = 0; i < 7; ++i) {
    const int64_t steps = (int64_t{1} << i) + 1;
    const float start = 0.1f, end = 1.0f;
    const float step = (end - start) / static_cast<float>(steps - 1);
    const int64_t halfway = steps / 2;
    std::vector<float> b(static_cast<size_t>(steps));
    for (int64_t k = 0; k < steps; ++k) {
      b[static_cast<size_t>(k)] = k < halfway ? std::fma(step, static_cast<float>(k), start)
                                              : std::fma(-step, static_cast<float>(steps - 1 - k), end);
    }
    const float scale = static_cast<float>(std::pow(10.0, static_cast<double>(i - 6)));
    for (int64_t k = 0; k + 1 < steps; ++k) {
      const float mean = (b[static_cast<size_t>(k)] + b[static_cast<size_t>(k + 1)]) / 2.0f;
      data.push_back(scale * mean);
      data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return data;
}

uint8_t QuantizeDynamicValue(const float* code, float x) { return rounding::DynamicCode(code, x); }

Result<Blockwise8bit> QuantizeBlockwise8bit(const float* values, int64_t n, int64_t blocksize,
                                            const std::vector<float>& code256) {
  if (code256.size() != 256) return InvalidArgument("QuantizeBlockwise8bit: the code must have 256 entries");
  if (blocksize <= 0) return InvalidArgument("QuantizeBlockwise8bit: blocksize must be positive");
  if (n < 0) return InvalidArgument("QuantizeBlockwise8bit: negative element count");
  Blockwise8bit out;
  out.codes.resize(static_cast<size_t>(n));
  out.absmax.resize(static_cast<size_t>(CeilDiv(n, blocksize)));
  for (int64_t b = 0; b * blocksize < n; ++b) {
    const int64_t begin = b * blocksize, end = std::min(n, begin + blocksize);
    float absmax = 0.0f;
    for (int64_t i = begin; i < end; ++i) absmax = std::fmax(absmax, std::fabs(values[i]));
    out.absmax[static_cast<size_t>(b)] = absmax;
    const float inv = 1.0f / absmax;
    for (int64_t i = begin; i < end; ++i)
      out.codes[static_cast<size_t>(i)] = absmax == 0.0f ? 0 : QuantizeDynamicValue(code256.data(), values[i] * inv);
  }
  return out;
}

std::string_view SourceDtypeName(SourceDtype d) {
  switch (d) {
    case SourceDtype::kFloat32:
      return "float32";
    case SourceDtype::kBfloat16:
      return "bfloat16";
    case SourceDtype::kFloat16:
      return "float16";
  }
  return "float32";
}

int64_t Nf4Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Nf4Tensor::num_blocks() const { return blocksize > 0 ? CeilDiv(numel(), blocksize) : 0; }

Status ValidateNf4(const Nf4Tensor& t) {
  STRATA_ASSIGN_OR_RETURN(int64_t n, CheckedNumel(t.shape));
  if (n == 0) return InvalidArgument("NF4: the tensor has no elements");
  if (!ValidBlocksize(t.blocksize))
    return InvalidArgument("NF4: blocksize " + std::to_string(t.blocksize) +
                           " is not one bitsandbytes accepts (32, 64, ..., 4096)");
  const int64_t blocks = CeilDiv(n, t.blocksize);
  if (static_cast<int64_t>(t.codes.size()) != CeilDiv(n, 2))
    return InvalidArgument("NF4: codes has " + std::to_string(t.codes.size()) + " bytes; shape " +
                           ShapeString(t.shape) + " needs " + std::to_string(CeilDiv(n, 2)));
  if (!t.nested) {
    if (static_cast<int64_t>(t.absmax.size()) != blocks)
      return InvalidArgument("NF4: absmax has " + std::to_string(t.absmax.size()) + " values; " +
                             std::to_string(blocks) + " blocks need one each");
    return Status::Ok();
  }
  if (static_cast<int64_t>(t.absmax_codes.size()) != blocks)
    return InvalidArgument("NF4: absmax_codes has " + std::to_string(t.absmax_codes.size()) + " values; " +
                           std::to_string(blocks) + " blocks need one each");
  if (t.nested_blocksize <= 0 || t.nested_blocksize > (1 << 20))
    return InvalidArgument("NF4: nested_blocksize " + std::to_string(t.nested_blocksize) + " is out of range");
  if (static_cast<int64_t>(t.nested_absmax.size()) != CeilDiv(blocks, t.nested_blocksize))
    return InvalidArgument("NF4: nested_absmax has " + std::to_string(t.nested_absmax.size()) + " values; " +
                           std::to_string(blocks) + " blocks in groups of " + std::to_string(t.nested_blocksize) +
                           " need " + std::to_string(CeilDiv(blocks, t.nested_blocksize)));
  if (t.nested_quant_map.size() != 256)
    return InvalidArgument("NF4: nested_quant_map has " + std::to_string(t.nested_quant_map.size()) +
                           " values, not 256");
  return Status::Ok();
}

// ---- quantization ----------------------------------------------------------------------------------

Nf4Builder::Nf4Builder(std::vector<int64_t> shape, SourceDtype dtype, int64_t blocksize, bool nested) {
  t_.shape = std::move(shape);
  t_.dtype = dtype;
  t_.blocksize = blocksize;
  t_.nested = nested;
  Result<int64_t> n = CheckedNumel(t_.shape);
  if (!n.ok()) {
    status_ = n.status();
    return;
  }
  n_ = *n;
  if (n_ == 0) {
    status_ = InvalidArgument("NF4: shape " + ShapeString(t_.shape) + " has no elements; nothing to quantize");
    return;
  }
  if (!ValidBlocksize(blocksize)) {
    status_ = InvalidArgument("NF4: blocksize " + std::to_string(blocksize) +
                              " is not one bitsandbytes accepts (32, 64, 128, ..., 4096)");
    return;
  }
  t_.codes.assign(static_cast<size_t>(CeilDiv(n_, 2)), 0);
  t_.absmax.reserve(static_cast<size_t>(CeilDiv(n_, blocksize)));
  block_.reserve(static_cast<size_t>(blocksize));
}

void Nf4Builder::FlushBlock() {
  // The block's first element index is even (blocksize is), so it starts on a byte.
  const int64_t first = appended_ - static_cast<int64_t>(block_.size());
  float absmax = 0.0f;
  for (float v : block_) absmax = std::fmax(absmax, std::fabs(v));
  t_.absmax.push_back(absmax);
  const float inv = 1.0f / absmax;
  auto code_of = [&](float v) -> uint8_t { return absmax == 0.0f ? 0 : QuantizeNf4Value(v * inv); };
  uint8_t* out = t_.codes.data() + first / 2;
  const size_t m = block_.size();
  for (size_t j = 0; j + 1 < m; j += 2) *out++ = static_cast<uint8_t>(code_of(block_[j]) << 4 | code_of(block_[j + 1]));
  if (m % 2) *out = static_cast<uint8_t>(code_of(block_[m - 1]) << 4 | code_of(0.0f));  // zero pad, as bnb loads it
  block_.clear();
}

Status Nf4Builder::AppendOne(float v) {
  if (!std::isfinite(v))
    return InvalidArgument("NF4: element " + std::to_string(appended_) + " of shape " + ShapeString(t_.shape) +
                           " is not finite (" + std::to_string(v) + "); refusing to quantize it");
  block_.push_back(v);
  ++appended_;
  if (static_cast<int64_t>(block_.size()) == t_.blocksize) FlushBlock();
  return Status::Ok();
}

Status Nf4Builder::Append(const float* values, int64_t count) {
  STRATA_RETURN_IF_ERROR(status_);
  if (count < 0 || count > n_ - appended_)
    return InvalidArgument("NF4: appending " + std::to_string(count) + " values after " + std::to_string(appended_) +
                           " of " + std::to_string(n_));
  for (int64_t i = 0; i < count; ++i) {
    Status s = AppendOne(values[i]);
    if (!s.ok()) return status_ = s;
  }
  return Status::Ok();
}

Status Nf4Builder::AppendBf16(const uint16_t* bits, int64_t count) {
  STRATA_RETURN_IF_ERROR(status_);
  if (count < 0 || count > n_ - appended_)
    return InvalidArgument("NF4: appending " + std::to_string(count) + " values after " + std::to_string(appended_) +
                           " of " + std::to_string(n_));
  for (int64_t i = 0; i < count; ++i) {
    Status s = AppendOne(Bf16ToFloat(bits[i]));
    if (!s.ok()) return status_ = s;
  }
  return Status::Ok();
}

Status Nf4Builder::AppendFp16(const uint16_t* bits, int64_t count) {
  STRATA_RETURN_IF_ERROR(status_);
  if (count < 0 || count > n_ - appended_)
    return InvalidArgument("NF4: appending " + std::to_string(count) + " values after " + std::to_string(appended_) +
                           " of " + std::to_string(n_));
  for (int64_t i = 0; i < count; ++i) {
    Status s = AppendOne(Fp16ToFloat(bits[i]));
    if (!s.ok()) return status_ = s;
  }
  return Status::Ok();
}

float AbsmaxMean(const float* absmax, int64_t blocks) {
  double sum = 0.0;
  for (int64_t b = 0; b < blocks; ++b) sum += absmax[b];
  return static_cast<float>(sum / static_cast<double>(blocks));
}

Status NestAbsmax(Nf4Tensor& t, const std::vector<float>& absmax, float offset) {
  std::vector<float> centered(absmax.size());
  for (size_t i = 0; i < absmax.size(); ++i) centered[i] = absmax[i] - offset;  // float32, as torch does
  std::vector<float> map = DynamicMap8bit();
  STRATA_ASSIGN_OR_RETURN(Blockwise8bit q, QuantizeBlockwise8bit(centered.data(), static_cast<int64_t>(centered.size()),
                                                                 kNestedBlocksize, map));
  t.nested = true;
  t.offset = offset;
  t.nested_blocksize = kNestedBlocksize;
  t.absmax_codes = std::move(q.codes);
  t.nested_absmax = std::move(q.absmax);
  t.nested_quant_map = std::move(map);
  t.absmax.clear();
  return Status::Ok();
}

Result<Nf4Tensor> Nf4Builder::Finish() && {
  STRATA_RETURN_IF_ERROR(status_);
  if (appended_ != n_)
    return InvalidArgument("NF4: " + std::to_string(appended_) + " of the " + std::to_string(n_) + " values of shape " +
                           ShapeString(t_.shape) + " were given");
  if (!block_.empty()) FlushBlock();
  if (t_.nested) {
    const float offset = AbsmaxMean(t_.absmax.data(), static_cast<int64_t>(t_.absmax.size()));
    std::vector<float> absmax = std::move(t_.absmax);
    STRATA_RETURN_IF_ERROR(NestAbsmax(t_, absmax, offset));
  }
  return std::move(t_);
}

Result<Nf4Tensor> QuantizeNf4(const float* values, std::vector<int64_t> shape, int64_t blocksize, bool nested) {
  Nf4Builder b(std::move(shape), SourceDtype::kFloat32, blocksize, nested);
  STRATA_RETURN_IF_ERROR(b.Append(values, b.numel()));
  return std::move(b).Finish();
}

Result<Nf4Tensor> QuantizeNf4Bf16(const uint16_t* bits, std::vector<int64_t> shape, int64_t blocksize, bool nested) {
  Nf4Builder b(std::move(shape), SourceDtype::kBfloat16, blocksize, nested);
  STRATA_RETURN_IF_ERROR(b.AppendBf16(bits, b.numel()));
  return std::move(b).Finish();
}

Result<Nf4Tensor> QuantizeNf4Fp16(const uint16_t* bits, std::vector<int64_t> shape, int64_t blocksize, bool nested) {
  Nf4Builder b(std::move(shape), SourceDtype::kFloat16, blocksize, nested);
  STRATA_RETURN_IF_ERROR(b.AppendFp16(bits, b.numel()));
  return std::move(b).Finish();
}

// ---- dequantization --------------------------------------------------------------------------------

Result<std::vector<float>> BlockAbsmax(const Nf4Tensor& t) {
  STRATA_RETURN_IF_ERROR(ValidateNf4(t));
  if (!t.nested) return t.absmax;
  std::vector<float> out(t.absmax_codes.size());
  for (size_t b = 0; b < out.size(); ++b) {
    out[b] = rounding::DecodeScale(t.nested_quant_map[t.absmax_codes[b]],
                                   t.nested_absmax[b / static_cast<size_t>(t.nested_blocksize)], t.offset);
  }
  return out;
}

Result<std::vector<float>> DequantizeNf4(const Nf4Tensor& t) {
  STRATA_ASSIGN_OR_RETURN(std::vector<float> absmax, BlockAbsmax(t));
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = t.codes[static_cast<size_t>(i / 2)];
    const uint8_t code = (i % 2 == 0) ? byte >> 4 : byte & 0x0f;
    out[static_cast<size_t>(i)] = kNf4[code] * absmax[static_cast<size_t>(i / t.blocksize)];
  }
  return out;
}

Result<std::vector<uint16_t>> DequantizeNf4Bf16(const Nf4Tensor& t) {
  STRATA_ASSIGN_OR_RETURN(std::vector<float> f, DequantizeNf4(t));
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = FloatToBf16(f[i]);
  return out;
}

}  // namespace strata::quant
