#include <cmath>
#include <stdexcept>

#include "kernels/adamw_scalars.h"
#include "kernels/kernels.h"

namespace strata::kernels {

void AdamWReference(const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    const float* decay_mask, int64_t n) {
  const AdamWScalars s = ScalarsOf(args);
  for (int64_t i = 0; i < n; ++i) AdamWElement(s, param[i], grad[i], exp_avg[i], exp_avg_sq[i], decay_mask[i]);
}

void MaskedSquareSumReference(const float* grad, const float* mask, int64_t n, float* out) {
  // Double accumulation: the order of a long fp32 sum would otherwise decide its last bits.
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(grad[i] * mask[i]);
    sum += x * x;
  }
  *out += static_cast<float>(sum);
}

int64_t MaskedSquareSumScratch() { return 1024; }

#ifndef STRATA_KERNELS_WITH_CUDA
bool HasCuda() { return false; }

namespace {
[[noreturn]] void NoCuda(const char* what) {
  throw std::logic_error(std::string(what) + ": this build has no CUDA kernels (configure with a CUDA LibTorch)");
}
}  // namespace

void AdamW(const Place& place, const AdamWArgs& args, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
           const float* decay_mask, int64_t n) {
  if (place.cuda) NoCuda("kernels::AdamW");
  AdamWReference(args, param, grad, exp_avg, exp_avg_sq, decay_mask, n);
}

void MaskedSquareSum(const Place& place, const float* grad, const float* mask, int64_t n, float* out, float* scratch) {
  if (place.cuda) NoCuda("kernels::MaskedSquareSum");
  MaskedSquareSumReference(grad, mask, n, out);
}
#endif

}  // namespace strata::kernels
