// NF4 (4-bit NormalFloat) storage of a frozen weight, bit for bit as bitsandbytes stores it.
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
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

namespace strata::quant {
namespace {

static_assert(std::endian::native == std::endian::little, "state-dict bytes are written little-endian by memcpy");

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

bool ValidBlocksize(int64_t b) {
  for (int64_t v = 32; v <= 4096; v *= 2)
    if (b == v) return true;
  return false;
}

float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float.
  const float mag = std::ldexp(static_cast<float>(man), -24);
  return sign ? -mag : mag;
}

uint16_t FloatToBf16Rne(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
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

}  // namespace

const std::array<float, 16>& Nf4Table() { return kNf4; }
const std::array<float, 15>& Nf4Thresholds() { return kNf4Mid; }

uint8_t QuantizeNf4Value(float x) {
  // Equivalent to bnb's 4-level tree over the sorted midpoints; every comparison is false for NaN.
  uint8_t code = 0;
  for (float m : kNf4Mid) code += static_cast<uint8_t>(x > m);
  return code;
}

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

uint8_t QuantizeDynamicValue(const float* code, float x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

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
    // torch: offset = absmax.mean() in float32. Summed here in double and rounded once.
    double sum = 0.0;
    for (float a : t_.absmax) sum += a;
    const float offset = static_cast<float>(sum / static_cast<double>(t_.absmax.size()));
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
    // dequantize_blockwise writes map[code] * absmax2 to a float32 tensor; `absmax += offset` then
    // adds in a second float32 operation. Two statements, and -ffp-contract=off (CMakeLists.txt)
    // keeps the compiler from fusing them into one FMA.
    const float scaled =
        t.nested_quant_map[t.absmax_codes[b]] * t.nested_absmax[b / static_cast<size_t>(t.nested_blocksize)];
    out[b] = scaled + t.offset;
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
  for (size_t i = 0; i < f.size(); ++i) out[i] = FloatToBf16Rne(f[i]);
  return out;
}

// ---- the packed JSON -------------------------------------------------------------------------------

std::string PythonFloatRepr(double x) {
  if (std::isnan(x)) return "NaN";  // json.dumps' spelling (allow_nan=True)
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, from to_chars' scientific form "d.ddde[+-]X".
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(sci.substr(e + 1));
  // CPython's float_repr_style 'short': positional when -4 <= exponent < 16, else exponent form.
  if (exp10 < -4 || exp10 >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    const int a = exp10 < 0 ? -exp10 : exp10;
    return sign + m + "e" + (exp10 < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
  }
  std::string out;
  if (exp10 < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exp10) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp10) + 1) + "." + digits.substr(static_cast<size_t>(exp10) + 1);
  }
  return sign + out;
}

std::string BnbQuantStateJson(const Nf4Tensor& t) {
  // json.dumps of QuantState.as_dict()'s non-tensor items, in the dict's insertion order, with
  // json's default separators ", " and ": ". dtype is str(torch.dtype).strip("torch.").
  std::string j = "{\"quant_type\": \"nf4\", \"blocksize\": " + std::to_string(t.blocksize) + ", \"dtype\": \"" +
                  std::string(SourceDtypeName(t.dtype)) + "\", \"shape\": " + ShapeString(t.shape);
  if (t.nested) {
    j += ", \"nested_blocksize\": " + std::to_string(t.nested_blocksize) +
         ", \"nested_dtype\": \"float32\", \"nested_offset\": " + PythonFloatRepr(static_cast<double>(t.offset));
  }
  return j + "}";
}

namespace {

// The JSON that json.dumps writes for the packed quant state: one object of strings, numbers,
// lists of numbers and null. Parsed strictly; anything else is an error.
struct JsonValue {
  enum Kind { kNull, kString, kNumber, kList } kind = kNull;
  std::string str;        // kString; kNumber: the token as written
  double num = 0;         // kNumber
  bool integral = false;  // kNumber written without '.', 'e' or a NaN/Infinity word
  std::vector<JsonValue> list;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  Result<std::vector<std::pair<std::string, JsonValue>>> Object() {
    std::vector<std::pair<std::string, JsonValue>> out;
    Ws();
    if (!Eat('{')) return Err("expected '{'");
    Ws();
    if (Eat('}')) return End(std::move(out));
    while (true) {
      Ws();
      JsonValue key;
      STRATA_RETURN_IF_ERROR(String(key));
      Ws();
      if (!Eat(':')) return Err("expected ':'");
      JsonValue v;
      STRATA_RETURN_IF_ERROR(Value(v, 0));
      out.emplace_back(key.str, std::move(v));
      Ws();
      if (Eat(',')) continue;
      if (Eat('}')) return End(std::move(out));
      return Err("expected ',' or '}'");
    }
  }

 private:
  Result<std::vector<std::pair<std::string, JsonValue>>> End(std::vector<std::pair<std::string, JsonValue>> out) {
    Ws();
    if (i_ != s_.size()) return Err("trailing bytes after the object");
    return out;
  }
  Status Err(const std::string& what) const { return Corruption("JSON at byte " + std::to_string(i_) + ": " + what); }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Word(std::string_view w) {
    if (s_.substr(i_, w.size()) == w) {
      i_ += w.size();
      return true;
    }
    return false;
  }
  Status String(JsonValue& v) {
    if (!Eat('"')) return Err("expected a string");
    v.kind = JsonValue::kString;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) return Err("control character in a string");
      if (c == '\\') {
        if (i_ >= s_.size()) return Err("unterminated escape");
        const char e = s_[i_++];
        switch (e) {
          case '"':
          case '\\':
          case '/':
            c = e;
            break;
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          default:
            return Err(std::string("unsupported escape \\") + e);  // bnb's fields are plain ASCII
        }
      }
      v.str += c;
    }
    if (!Eat('"')) return Err("unterminated string");
    return Status::Ok();
  }
  Status Value(JsonValue& v, int depth) {
    Ws();
    if (i_ >= s_.size()) return Err("expected a value");
    const char c = s_[i_];
    if (c == '"') return String(v);
    if (c == '[') {
      if (depth > 2) return Err("lists nested too deeply");
      ++i_;
      v.kind = JsonValue::kList;
      Ws();
      if (Eat(']')) return Status::Ok();
      while (true) {
        JsonValue e;
        STRATA_RETURN_IF_ERROR(Value(e, depth + 1));
        v.list.push_back(std::move(e));
        Ws();
        if (Eat(',')) continue;
        if (Eat(']')) return Status::Ok();
        return Err("expected ',' or ']'");
      }
    }
    if (Word("null")) {
      v.kind = JsonValue::kNull;
      return Status::Ok();
    }
    v.kind = JsonValue::kNumber;
    if (Word("NaN")) {
      v.num = std::numeric_limits<double>::quiet_NaN();
      return Status::Ok();
    }
    if (Word("Infinity")) {
      v.num = std::numeric_limits<double>::infinity();
      return Status::Ok();
    }
    if (Word("-Infinity")) {
      v.num = -std::numeric_limits<double>::infinity();
      return Status::Ok();
    }
    const size_t begin = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                              s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      ++i_;
    v.str = std::string(s_.substr(begin, i_ - begin));
    if (v.str.empty()) return Err("expected a value");
    const char* first = v.str.data();
    if (*first == '+') return Err("bad number " + v.str);
    auto r = std::from_chars(first, first + v.str.size(), v.num);
    if (r.ec != std::errc() || r.ptr != first + v.str.size()) return Err("bad number " + v.str);
    v.integral = v.str.find_first_of(".eE") == std::string::npos;
    return Status::Ok();
  }

  std::string_view s_;
  size_t i_ = 0;
};

size_t DtypeSize(const std::string& d) { return d == "U8" ? 1 : d == "F32" ? 4 : 0; }

template <typename T>
StateEntry MakeEntry(std::string name, std::string dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  StateEntry e{std::move(name), std::move(dtype), std::move(shape), std::vector<uint8_t>(v.size() * sizeof(T))};
  if (!v.empty()) std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
  return e;
}

// The entry `name`, checked to be `dtype` with `count` elements and bytes to match. A shape of
// other rank is accepted when its element count is right (bnb also reads [1, k] weights).
Result<const StateEntry*> Expect(const std::map<std::string_view, const StateEntry*>& by_name, const std::string& name,
                                 const std::string& dtype, int64_t count) {
  auto it = by_name.find(name);
  if (it == by_name.end()) return NotFound("bnb 4-bit state dict: no entry " + name);
  const StateEntry& e = *it->second;
  if (e.dtype != dtype)
    return Corruption("bnb 4-bit state dict: " + name + " has dtype " + e.dtype + ", expected " + dtype);
  Result<int64_t> n = CheckedNumel(e.shape);
  if (!n.ok()) return Corruption("bnb 4-bit state dict: " + name + ": " + n.status().message());
  if (*n != count)
    return Corruption("bnb 4-bit state dict: " + name + " has shape " + ShapeString(e.shape) + " (" +
                      std::to_string(*n) + " elements), expected " + std::to_string(count) + " elements");
  if (e.bytes.size() != static_cast<size_t>(count) * DtypeSize(dtype))
    return Corruption("bnb 4-bit state dict: " + name + " holds " + std::to_string(e.bytes.size()) + " bytes; shape " +
                      ShapeString(e.shape) + " of " + dtype + " needs " +
                      std::to_string(static_cast<size_t>(count) * DtypeSize(dtype)));
  return &e;
}

template <typename T>
std::vector<T> Values(const StateEntry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace

Result<std::vector<StateEntry>> ToBnbStateDict(const Nf4Tensor& t, std::string_view weight_name) {
  STRATA_RETURN_IF_ERROR(ValidateNf4(t));
  const std::string w(weight_name);
  std::vector<StateEntry> out;
  out.push_back(MakeEntry(w, "U8", {static_cast<int64_t>(t.codes.size()), 1}, t.codes));
  if (t.nested) {
    out.push_back(MakeEntry(w + ".absmax", "U8", {static_cast<int64_t>(t.absmax_codes.size())}, t.absmax_codes));
  } else {
    out.push_back(MakeEntry(w + ".absmax", "F32", {static_cast<int64_t>(t.absmax.size())}, t.absmax));
  }
  std::vector<float> table(kNf4.begin(), kNf4.end());
  out.push_back(MakeEntry(w + ".quant_map", "F32", {16}, table));
  if (t.nested) {
    out.push_back(
        MakeEntry(w + ".nested_absmax", "F32", {static_cast<int64_t>(t.nested_absmax.size())}, t.nested_absmax));
    out.push_back(MakeEntry(w + ".nested_quant_map", "F32", {256}, t.nested_quant_map));
  }
  const std::string json = BnbQuantStateJson(t);
  out.push_back(MakeEntry(w + ".quant_state.bitsandbytes__nf4", "U8", {static_cast<int64_t>(json.size())},
                          std::vector<uint8_t>(json.begin(), json.end())));
  return out;
}

Result<Nf4Tensor> FromBnbStateDict(const std::vector<StateEntry>& entries, std::string_view weight_name) {
  const std::string w(weight_name);
  std::map<std::string_view, const StateEntry*> by_name;
  for (const StateEntry& e : entries) by_name.emplace(e.name, &e);

  const std::string qs_key = w + ".quant_state.bitsandbytes__nf4";
  auto qs = by_name.find(qs_key);
  if (qs == by_name.end()) {
    if (by_name.count(w + ".quant_state.bitsandbytes__fp4"))
      return InvalidArgument("bnb 4-bit state dict: " + w +
                             ".quant_state.bitsandbytes__fp4 is FP4; only NF4 is supported");
    return NotFound("bnb 4-bit state dict: no entry " + qs_key);
  }
  if (qs->second->dtype != "U8" || qs->second->shape.size() != 1 ||
      qs->second->bytes.size() != static_cast<size_t>(qs->second->shape[0]))
    return Corruption("bnb 4-bit state dict: " + qs_key + " must be a 1-d U8 tensor of the JSON's bytes");
  const std::string json(qs->second->bytes.begin(), qs->second->bytes.end());
  auto parsed = JsonParser(json).Object();
  if (!parsed.ok()) return Corruption("bnb 4-bit state dict: " + qs_key + ": " + parsed.status().message());

  // QuantState.from_dict asserts the keys are among valid_qs_keys.
  static const char* kValid[] = {"quant_type",       "blocksize",    "dtype",        "shape",
                                 "nested_blocksize", "nested_dtype", "nested_offset"};
  std::map<std::string, JsonValue> f;
  for (auto& [k, v] : *parsed) {
    const std::string& key = k;
    if (std::none_of(std::begin(kValid), std::end(kValid), [&key](const char* s) { return key == s; }))
      return Corruption("bnb 4-bit state dict: " + qs_key + " has field \"" + k +
                        "\", which bitsandbytes does not know");
    if (!f.emplace(k, std::move(v)).second)
      return Corruption("bnb 4-bit state dict: " + qs_key + " repeats field \"" + k + "\"");
  }
  auto field = [&](const std::string& k, JsonValue::Kind kind) -> Result<const JsonValue*> {
    auto it = f.find(k);
    if (it == f.end()) return NotFound("bnb 4-bit state dict: " + qs_key + " has no field \"" + k + "\"");
    if (it->second.kind != kind)
      return Corruption("bnb 4-bit state dict: " + qs_key + " field \"" + k + "\" has the wrong type");
    return &it->second;
  };
  auto int_field = [&](const std::string& k) -> Result<int64_t> {
    STRATA_ASSIGN_OR_RETURN(const JsonValue* v, field(k, JsonValue::kNumber));
    if (!v->integral || std::fabs(v->num) > 9.0e15)
      return Corruption("bnb 4-bit state dict: " + qs_key + " field \"" + k + "\" is not an integer: " + v->str);
    return static_cast<int64_t>(v->num);
  };

  Nf4Tensor t;
  STRATA_ASSIGN_OR_RETURN(const JsonValue* qt, field("quant_type", JsonValue::kString));
  if (qt->str != "nf4")
    return InvalidArgument("bnb 4-bit state dict: " + qs_key + " says quant_type \"" + qt->str +
                           "\"; only nf4 is supported");
  STRATA_ASSIGN_OR_RETURN(t.blocksize, int_field("blocksize"));
  if (!ValidBlocksize(t.blocksize))
    return Corruption("bnb 4-bit state dict: " + qs_key + " blocksize " + std::to_string(t.blocksize) +
                      " is not one bitsandbytes accepts (32, 64, ..., 4096)");
  STRATA_ASSIGN_OR_RETURN(const JsonValue* dt, field("dtype", JsonValue::kString));
  if (dt->str == "float32") {
    t.dtype = SourceDtype::kFloat32;
  } else if (dt->str == "bfloat16") {
    t.dtype = SourceDtype::kBfloat16;
  } else if (dt->str == "float16") {
    t.dtype = SourceDtype::kFloat16;
  } else {
    return Corruption("bnb 4-bit state dict: " + qs_key + " dtype \"" + dt->str +
                      "\" is not float32, bfloat16 or float16");
  }
  STRATA_ASSIGN_OR_RETURN(const JsonValue* sh, field("shape", JsonValue::kList));
  for (const JsonValue& d : sh->list) {
    if (d.kind != JsonValue::kNumber || !d.integral || d.num < 0 || d.num > 9.0e15)
      return Corruption("bnb 4-bit state dict: " + qs_key + " shape holds a non-integer or negative entry");
    t.shape.push_back(static_cast<int64_t>(d.num));
  }
  Result<int64_t> n = CheckedNumel(t.shape);
  if (!n.ok() || *n == 0)
    return Corruption("bnb 4-bit state dict: " + qs_key + " shape " + ShapeString(t.shape) + " is empty or too large");
  const int64_t blocks = CeilDiv(*n, t.blocksize);

  STRATA_ASSIGN_OR_RETURN(const StateEntry* codes, Expect(by_name, w, "U8", CeilDiv(*n, 2)));
  t.codes = codes->bytes;
  STRATA_ASSIGN_OR_RETURN(const StateEntry* qmap, Expect(by_name, w + ".quant_map", "F32", 16));
  const std::vector<float> map = Values<float>(*qmap);
  for (size_t i = 0; i < 16; ++i)
    if (std::bit_cast<uint32_t>(map[i]) != std::bit_cast<uint32_t>(kNf4[i]))
      return Corruption("bnb 4-bit state dict: " + w + ".quant_map entry " + std::to_string(i) + " is " +
                        std::to_string(map[i]) + ", not NF4's " + std::to_string(kNf4[i]));

  // from_dict: nested exactly when nested_absmax is present; then the nested_* fields must be too.
  t.nested = by_name.count(w + ".nested_absmax") > 0;
  if (!t.nested) {
    for (const char* k : {"nested_blocksize", "nested_dtype", "nested_offset"})
      if (f.count(k))
        return NotFound("bnb 4-bit state dict: " + qs_key + " has \"" + k + "\" but there is no entry " + w +
                        ".nested_absmax");
    STRATA_ASSIGN_OR_RETURN(const StateEntry* am, Expect(by_name, w + ".absmax", "F32", blocks));
    t.absmax = Values<float>(*am);
    return t;
  }
  STRATA_ASSIGN_OR_RETURN(t.nested_blocksize, int_field("nested_blocksize"));
  if (t.nested_blocksize <= 0 || t.nested_blocksize > (1 << 20))
    return Corruption("bnb 4-bit state dict: " + qs_key + " nested_blocksize " + std::to_string(t.nested_blocksize) +
                      " is out of range");
  STRATA_ASSIGN_OR_RETURN(const JsonValue* ndt, field("nested_dtype", JsonValue::kString));
  if (ndt->str != "float32")
    return Corruption("bnb 4-bit state dict: " + qs_key + " nested_dtype \"" + ndt->str + "\" is not float32");
  STRATA_ASSIGN_OR_RETURN(const JsonValue* off, field("nested_offset", JsonValue::kNumber));
  t.offset = static_cast<float>(off->num);  // from_dict: torch.tensor(float(...)), a float32
  STRATA_ASSIGN_OR_RETURN(const StateEntry* am, Expect(by_name, w + ".absmax", "U8", blocks));
  t.absmax_codes = am->bytes;
  STRATA_ASSIGN_OR_RETURN(const StateEntry* nam,
                          Expect(by_name, w + ".nested_absmax", "F32", CeilDiv(blocks, t.nested_blocksize)));
  t.nested_absmax = Values<float>(*nam);
  STRATA_ASSIGN_OR_RETURN(const StateEntry* nqm, Expect(by_name, w + ".nested_quant_map", "F32", 256));
  t.nested_quant_map = Values<float>(*nqm);
  return t;
}

}  // namespace strata::quant
