// QLoRA's NF4 storage of a frozen weight (Dettmers et al. 2023), as bitsandbytes writes it:
// bitsandbytes.functional.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
// and dequantize_4bit, and the state-dict layout of QuantState.as_dict(packed=True) that a
// "*-bnb-4bit" checkpoint (transformers' save_pretrained) holds. No LibTorch: plain buffers in,
// plain buffers out. The maths and the bitsandbytes facts relied on are at the top of nf4.cc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "quant/nf4_rounding.h"  // kNf4Blocksize, kNestedBlocksize

namespace strata::quant {

// bitsandbytes' NF4 table (get_4bit_type("nf4")), ascending; code i decodes to Nf4Table()[i].
const std::array<float, 16>& Nf4Table();

// The decision thresholds of bitsandbytes' dQuantizeNF4 (kernels.cu), ascending: the midpoints of
// adjacent table values, computed in double and written as float literals. Code c is chosen for x
// when thresholds[c-1] < x <= thresholds[c] (a value equal to a threshold takes the LOWER code).
const std::array<float, 15>& Nf4Thresholds();

// bitsandbytes' NF4 rounding of one normalized value (x = w * (1/absmax), nominally in [-1, 1]).
// A NaN takes code 0, as every comparison of bnb's tree is false for it.
uint8_t QuantizeNf4Value(float x);

// bitsandbytes create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 ascending
// float32 values from -0.99297 to 1.0 (one 0), the code of the nested (double) quantization of absmax.
std::vector<float> DynamicMap8bit();

// bitsandbytes' 8-bit rounding (dQuantize<0> in kernels.cu) of x against a sorted 256-entry code:
// a 7-step binary search from index 127, then the nearer neighbour by float midpoint.
uint8_t QuantizeDynamicValue(const float* code256, float x);

// bitsandbytes quantize_blockwise with an explicit code (the CUDA kernel's arithmetic): per block
// of `blocksize`, absmax = max |a|, codes = QuantizeDynamicValue(code, a * (1.0f / absmax)); a
// block whose absmax is 0 gets code 0 everywhere (bnb: 0 * inf = NaN -> code 0).
struct Blockwise8bit {
  std::vector<uint8_t> codes;  // one per value
  std::vector<float> absmax;   // one per block
};
Result<Blockwise8bit> QuantizeBlockwise8bit(const float* values, int64_t n, int64_t blocksize,
                                            const std::vector<float>& code256);

// The element type the weight had before quantization; bnb records it as QuantState.dtype
// ("dtype" in the packed JSON) and dequantizes back to it.
enum class SourceDtype { kFloat32, kBfloat16, kFloat16 };
std::string_view SourceDtypeName(SourceDtype d);  // "float32", "bfloat16", "float16" (torch's names)

// One quantized weight, mirroring bnb's QuantState (nested = compress_statistics=True).
struct Nf4Tensor {
  std::vector<int64_t> shape;  // the weight's shape (QuantState.shape)
  SourceDtype dtype = SourceDtype::kFloat32;
  int64_t blocksize = kNf4Blocksize;
  // Packed codes, 2 per byte, the first element in the HIGH nibble; ceil(n/2) bytes. When n is
  // odd the last low nibble encodes a zero pad (code 7, or 0 where the last block's absmax is 0).
  std::vector<uint8_t> codes;
  bool nested = true;
  // Not nested: the float32 absmax of each block (ceil(n/blocksize) values).
  std::vector<float> absmax;
  // Nested: each block's absmax is offset + nested_quant_map[absmax_codes[b]] *
  // nested_absmax[b / nested_blocksize] (float32 operations in that order).
  std::vector<uint8_t> absmax_codes;    // one per block
  std::vector<float> nested_absmax;     // one per nested_blocksize blocks
  std::vector<float> nested_quant_map;  // 256 values; DynamicMap8bit() when we quantize
  int64_t nested_blocksize = kNestedBlocksize;
  float offset = 0.0f;  // mean of the blocks' absmax, subtracted before the nested quantization

  int64_t numel() const;       // product of shape (1 for a 0-d shape)
  int64_t num_blocks() const;  // ceil(numel / blocksize)
};

// Shape, sizes and fields consistent (what Dequantize and the serializer rely on); InvalidArgument
// naming the field otherwise.
Status ValidateNf4(const Nf4Tensor& t);

// Quantizes a whole row-major tensor. InvalidArgument for an empty tensor, a negative dimension, a
// blocksize bnb refuses (not one of 32, 64, ..., 4096) or a non-finite value (naming its index).
Result<Nf4Tensor> QuantizeNf4(const float* values, std::vector<int64_t> shape, int64_t blocksize = kNf4Blocksize,
                              bool nested = true);
// bf16 / fp16 input as raw bits (a checkpoint's bytes); each value widens to float32 exactly.
Result<Nf4Tensor> QuantizeNf4Bf16(const uint16_t* bits, std::vector<int64_t> shape, int64_t blocksize = kNf4Blocksize,
                                  bool nested = true);
Result<Nf4Tensor> QuantizeNf4Fp16(const uint16_t* bits, std::vector<int64_t> shape, int64_t blocksize = kNf4Blocksize,
                                  bool nested = true);

// Streaming form: feed the tensor's values in row-major order in chunks of any size (a row, a
// shard's slice); whole blocks are quantized as they complete, so it holds only the packed codes,
// one float per block and at most one partial block. Finish() does the nested quantization.
class Nf4Builder {
 public:
  // Errors as QuantizeNf4's; check status() before use, or let Append/Finish return it.
  Nf4Builder(std::vector<int64_t> shape, SourceDtype dtype, int64_t blocksize = kNf4Blocksize, bool nested = true);
  const Status& status() const { return status_; }
  Status Append(const float* values, int64_t count);
  Status AppendBf16(const uint16_t* bits, int64_t count);
  Status AppendFp16(const uint16_t* bits, int64_t count);
  int64_t numel() const { return n_; }
  int64_t appended() const { return appended_; }
  // InvalidArgument unless exactly numel values were appended.
  Result<Nf4Tensor> Finish() &&;

 private:
  Status AppendOne(float v);
  void FlushBlock();
  Status status_;
  Nf4Tensor t_;
  int64_t n_ = 0;
  int64_t appended_ = 0;
  std::vector<float> block_;  // the current, incomplete block
};

// The nested quantization of a complete absmax vector with a given offset (quantize_4bit's
// compress_statistics step: QuantizeBlockwise8bit(absmax - offset, 256, DynamicMap8bit())).
// Finish() calls it with offset = mean(absmax); exposed to compare against a reference whose
// offset came from another reduction order.
Status NestAbsmax(Nf4Tensor& t, const std::vector<float>& absmax, float offset);

// The offset of the nested quantization: the mean of every block's absmax, summed in double in
// block order and rounded to float once (torch takes absmax.mean() in float32 in an order of its
// own; nf4.cc's header says what that changes). Every quantizer here takes its offset from this.
float AbsmaxMean(const float* absmax, int64_t blocks);

// Each block's absmax as dequantize_4bit uses it (the nested decode where nested).
Result<std::vector<float>> BlockAbsmax(const Nf4Tensor& t);

// CPU reference of dequantize_4bit: Nf4Table()[code] * absmax of its block, float32.
Result<std::vector<float>> DequantizeNf4(const Nf4Tensor& t);
// The same, rounded to bf16 bits (round to nearest even), as dequantize_4bit with dtype=bfloat16.
Result<std::vector<uint16_t>> DequantizeNf4Bf16(const Nf4Tensor& t);

// ---- bitsandbytes' state-dict layout --------------------------------------------------------------

// One tensor of a state dict as safetensors stores it: dtype spelled as safetensors does ("U8",
// "F32"), little-endian bytes.
struct StateEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The entries bnb's Linear4bit._save_to_state_dict writes for weight `weight_name` (e.g.
// "model.layers.0.self_attn.q_proj.weight"), in its order:
//   <w>                                    U8  [ceil(n/2), 1]  packed codes
//   <w>.absmax                             U8  [blocks] (nested) / F32 [blocks] (not nested)
//   <w>.quant_map                          F32 [16]
//   <w>.nested_absmax                      F32 [ceil(blocks/256)]   (nested only)
//   <w>.nested_quant_map                   F32 [256]                (nested only)
//   <w>.quant_state.bitsandbytes__nf4      U8  [len]  json.dumps of the non-tensor fields
Result<std::vector<StateEntry>> ToBnbStateDict(const Nf4Tensor& t, std::string_view weight_name);

// The inverse: finds those entries by name (others are ignored) and checks each one's dtype, shape
// and size against the JSON's shape and blocksize. NotFound naming a missing key; Corruption naming
// the key of a wrong dtype, shape or size, a quant_map other than NF4's, or JSON bnb would reject.
Result<Nf4Tensor> FromBnbStateDict(const std::vector<StateEntry>& entries, std::string_view weight_name);

// The packed JSON alone (what pack_dict_to_tensor encodes), e.g.
// {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4096, 4096],
//  "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.02170562371611595}
std::string BnbQuantStateJson(const Nf4Tensor& t);

// Python's repr() of a double (what json.dumps writes for a float): shortest round-trip digits,
// positional for 1e-4 <= |x| < 1e16, else d.ddde[+-]XX; "NaN", "Infinity", "-Infinity".
std::string PythonFloatRepr(double x);

}  // namespace strata::quant
