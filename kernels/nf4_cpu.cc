// CPU reference of kernels.h's Nf4Dequantize (one weight at a time, quant::BlockAbsmax's order of
// operations), and the dispatch of a build without CUDA kernels. The host's quantization is
// quant::QuantizeNf4 (Nf4QuantizeBlocks and Nf4NestAbsmax are its device form).
#include <algorithm>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"
#include "quant/nf4.h"

namespace strata::kernels {

namespace internal {
const float* Nf4Values() { return quant::Nf4Table().data(); }
const float* Nf4Midpoints() { return quant::Nf4Thresholds().data(); }
const float* Nf4DynamicMap() {
  static const std::vector<float> map = quant::DynamicMap8bit();
  return map.data();
}
}  // namespace internal

void Nf4DequantizeReference(const Nf4Parts& parts, DType out_dtype, void* out) {
  const float* table = quant::Nf4Table().data();
  const int64_t blocks = (parts.n + quant::kNf4Blocksize - 1) / quant::kNf4Blocksize;
  for (int64_t b = 0; b < blocks; ++b) {
    const float absmax = quant::rounding::DecodeScale(parts.nested_map[parts.absmax_codes[b]],
                                                      parts.nested_absmax[b / quant::kNestedBlocksize], parts.offset);
    const int64_t end = std::min(parts.n, (b + 1) * quant::kNf4Blocksize);
    for (int64_t i = b * quant::kNf4Blocksize; i < end; ++i) {
      const uint8_t byte = parts.codes[i / 2];
      internal::Set(out_dtype, out, i, table[i % 2 == 0 ? byte >> 4 : byte & 0x0f] * absmax);
    }
  }
}

#ifndef STRATA_KERNELS_WITH_CUDA
void Nf4Dequantize(const Place& place, const Nf4Parts& parts, DType out_dtype, void* out) {
  if (place.cuda) internal::NoCuda("kernels::Nf4Dequantize");
  Nf4DequantizeReference(parts, out_dtype, out);
}

void Nf4QuantizeBlocks(const Place&, DType, const void*, int64_t, uint8_t*, float*, int64_t*) {
  internal::NoCuda("kernels::Nf4QuantizeBlocks (on the host: quant::QuantizeNf4)");
}

void Nf4NestAbsmax(const Place&, const float*, int64_t, float, uint8_t*, float*) {
  internal::NoCuda("kernels::Nf4NestAbsmax (on the host: quant::QuantizeNf4)");
}
#endif

}  // namespace strata::kernels
