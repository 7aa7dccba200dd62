// kernels.h's AdamW8bit on the CPU: the code tables (built here for both implementations), the
// reference step one block at a time with adamw8bit_math.h's per-element pieces, and the
// quantize / dequantize pair. Compiled with -ffp-contract=off (kernels/CMakeLists.txt): the
// reference's roundings are the ones the CUDA kernel spells out.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/adamw8bit_math.h"
#include "kernels/adamw_scalars.h"
#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace strata::kernels {

using adamw8bit::kCodes;

namespace {

// kernels.h, "tables": bitsandbytes' dynamic map, in double, rounded to fp32 once.
std::array<float, kCodes> DynamicMap(bool is_signed) {
  std::vector<double> values = {0.0, 1.0};
  if (is_signed) values.push_back(-1.0);
  for (int decade = 0; decade < 7; ++decade) {
    double divisor = 1;  // 10^(6 - decade), exact in double (a division by it rounds once)
    for (int k = decade; k < 6; ++k) divisor *= 10;
    const int count = is_signed ? 1 << decade : 2 << decade;
    for (int k = 0; k < count; ++k) {
      const double code = (0.1 + (k + 0.5) * 0.9 / count) / divisor;
      values.push_back(code);
      if (is_signed && decade > 0) values.push_back(-code);  // -c_{0,0}'s place is -1's
    }
  }
  std::sort(values.begin(), values.end());
  std::array<float, kCodes> table{};
  if (values.size() != table.size()) throw std::logic_error("AdamW8bit: the dynamic map must have 256 codes");
  for (int k = 0; k < kCodes; ++k) table[k] = static_cast<float>(values[k]);
  return table;
}

// A table as adamw8bit::NearestCode reads it.
struct CodeBook {
  std::array<float, kCodes + 1> sorted;  // C, then C[255] again
  std::array<float, kCodes> tree;        // the search's pivots in heap order, [0] unused
};

CodeBook MakeBook(bool is_signed) {
  const std::array<float, kCodes> table = DynamicMap(is_signed);
  CodeBook book{};
  std::copy(table.begin(), table.end(), book.sorted.begin());
  book.sorted[kCodes] = table[kCodes - 1];
  for (int k = 1; k < kCodes; ++k) book.tree[k] = table[adamw8bit::TreePivot(k)];
  return book;
}

const CodeBook& Book(bool is_signed) {
  static const CodeBook signed_book = MakeBook(true), unsigned_book = MakeBook(false);
  return is_signed ? signed_book : unsigned_book;
}

uint8_t QuantizeWith(const CodeBook& book, float x, float absmax) {
  return adamw8bit::Quantize(book.tree.data(), book.sorted.data(), x, absmax);
}

}  // namespace

int64_t AdamW8bitBlocks(int64_t n) { return n <= 0 ? 0 : (n + kAdamW8bitBlock - 1) / kAdamW8bitBlock; }

const float* AdamW8bitCodeTable(bool is_signed) { return Book(is_signed).sorted.data(); }

void AdamW8bitReference(const AdamWArgs& args, float* param, const float* grad, uint8_t* exp_avg_codes,
                        float* exp_avg_scales, uint8_t* exp_avg_sq_codes, float* exp_avg_sq_scales, int64_t n) {
  const AdamWScalars s = ScalarsOf(args);
  const CodeBook &m_book = Book(true), &v_book = Book(false);
  float m[kAdamW8bitBlock], v[kAdamW8bitBlock];  // the block's new moments, before quantizing
  for (int64_t b = 0, begin = 0; begin < n; ++b, begin += kAdamW8bitBlock) {
    const int len = static_cast<int>(std::min<int64_t>(kAdamW8bitBlock, n - begin));
    float m_absmax = 0.0f, v_absmax = 0.0f;
    for (int j = 0; j < len; ++j) {
      const int64_t i = begin + j;
      m[j] = adamw8bit::Mul(m_book.sorted[exp_avg_codes[i]], exp_avg_scales[b]);
      v[j] = adamw8bit::Mul(v_book.sorted[exp_avg_sq_codes[i]], exp_avg_sq_scales[b]);
      AdamWElement(s, param[i], grad[i], m[j], v[j]);
      m_absmax = std::fmax(m_absmax, std::fabs(m[j]));
      v_absmax = std::fmax(v_absmax, std::fabs(v[j]));
    }
    for (int j = 0; j < len; ++j) {
      exp_avg_codes[begin + j] = QuantizeWith(m_book, m[j], m_absmax);
      exp_avg_sq_codes[begin + j] = QuantizeWith(v_book, v[j], v_absmax);
    }
    exp_avg_scales[b] = m_absmax;
    exp_avg_sq_scales[b] = v_absmax;
  }
}

void Quantize8bitReference(bool is_signed, const float* values, uint8_t* codes, float* scales, int64_t n) {
  const CodeBook& book = Book(is_signed);
  for (int64_t b = 0, begin = 0; begin < n; ++b, begin += kAdamW8bitBlock) {
    const int64_t end = std::min(n, begin + kAdamW8bitBlock);
    float absmax = 0.0f;
    for (int64_t i = begin; i < end; ++i) absmax = std::fmax(absmax, std::fabs(values[i]));
    for (int64_t i = begin; i < end; ++i) codes[i] = QuantizeWith(book, values[i], absmax);
    scales[b] = absmax;
  }
}

void Dequantize8bitReference(bool is_signed, const uint8_t* codes, const float* scales, float* out, int64_t n) {
  const float* table = Book(is_signed).sorted.data();
  for (int64_t i = 0; i < n; ++i) out[i] = adamw8bit::Mul(table[codes[i]], scales[i / kAdamW8bitBlock]);
}

void AdamW8bitInitReference(uint8_t* exp_avg_codes, float* exp_avg_scales, uint8_t* exp_avg_sq_codes,
                            float* exp_avg_sq_scales, int64_t n) {
  if (n <= 0) return;
  std::memset(exp_avg_codes, adamw8bit::kSignedZeroCode, static_cast<size_t>(n));
  std::memset(exp_avg_sq_codes, adamw8bit::kUnsignedZeroCode, static_cast<size_t>(n));
  std::fill_n(exp_avg_scales, AdamW8bitBlocks(n), 0.0f);
  std::fill_n(exp_avg_sq_scales, AdamW8bitBlocks(n), 0.0f);
}

#ifndef STRATA_KERNELS_WITH_CUDA
using internal::NoCuda;

void AdamW8bit(const Place& place, const AdamWArgs& args, float* param, const float* grad, uint8_t* exp_avg_codes,
               float* exp_avg_scales, uint8_t* exp_avg_sq_codes, float* exp_avg_sq_scales, int64_t n) {
  if (place.cuda) NoCuda("kernels::AdamW8bit");
  AdamW8bitReference(args, param, grad, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, n);
}

void AdamW8bitInit(const Place& place, uint8_t* exp_avg_codes, float* exp_avg_scales, uint8_t* exp_avg_sq_codes,
                   float* exp_avg_sq_scales, int64_t n) {
  if (place.cuda) NoCuda("kernels::AdamW8bitInit");
  AdamW8bitInitReference(exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, n);
}

void Dequantize8bit(const Place& place, bool is_signed, const uint8_t* codes, const float* scales, float* out,
                    int64_t n) {
  if (place.cuda) NoCuda("kernels::Dequantize8bit");
  Dequantize8bitReference(is_signed, codes, scales, out, n);
}

void Quantize8bit(const Place& place, bool is_signed, const float* values, uint8_t* codes, float* scales, int64_t n) {
  if (place.cuda) NoCuda("kernels::Quantize8bit");
  Quantize8bitReference(is_signed, values, codes, scales, n);
}
#endif

}  // namespace strata::kernels
