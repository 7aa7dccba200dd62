// Each CUDA kernel of kernels/ against the same maths in LibTorch ops on the same GPU, and
// against the bandwidth it could reach: bytes the kernel must move / its time, next to a
// device-to-device copy's rate (the practical HBM peak) on the same card.
//
//   kernels_bench [--sizes 124439808,885784576] [--iterations 20]
//
// Prints one JSON line per (kernel, implementation, size) and a markdown table. Needs a CUDA build.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/kernels.h"
#include "worker/torch_compat.h"

namespace {

double Seconds(const std::function<void()>& fn, int iterations) {
  for (int i = 0; i < 3; ++i) fn();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) fn();
  torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
}

struct Row {
  std::string kernel, impl;
  int64_t n;
  double ms, bytes;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {124'439'808, 885'784'576};
  int iterations = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes") {
      sizes.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoll(item));
    } else if (flag == "--iterations") {
      iterations = std::atoi(argv[i + 1]);
    }
  }
  if (!torch::cuda::is_available() || !strata::kernels::HasCuda()) {
    std::fprintf(stderr, "kernels_bench: needs a CUDA device and a CUDA build\n");
    return 77;
  }
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA);
  strata::kernels::Place place{true, c10::cuda::getCurrentCUDAStream().stream()};
  std::vector<Row> rows;
  // The practical peak: a large device-to-device copy (read + write).
  double copy_gbs = 0;
  {
    auto a = torch::empty({1ll << 30}, opts), b = torch::empty({1ll << 30}, opts);
    const double s = Seconds([&] { b.copy_(a); }, iterations);
    copy_gbs = 2.0 * a.nbytes() / s / 1e9;
  }
  for (int64_t n : sizes) {
    auto p = torch::randn({n}, opts), g = torch::randn({n}, opts), m = torch::zeros({n}, opts), v = torch::zeros({n}, opts);
    auto mask = (torch::rand({n}, opts) > 0.01).to(torch::kFloat);
    const strata::kernels::AdamWArgs args{3e-4, 0.9, 0.95, 1e-8, 0.1, 10, 0.8};
    rows.push_back({"AdamW", "kernels::AdamW (fused, decay mask)", n,
                    1e3 * Seconds([&] {
                      strata::kernels::AdamW(place, args, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                                             v.data_ptr<float>(), mask.data_ptr<float>(), n);
                    }, iterations),
                    32.0 * n});
    rows.push_back({"AdamW", "LibTorch ops (the trainer before kernels/)", n,
                    1e3 * Seconds([&] {
                      torch::NoGradGuard no_grad;
                      auto gs = g * args.grad_scale;
                      p.mul_(mask.mul(-args.lr * args.weight_decay).add_(1.0));
                      m.mul_(args.beta1).add_(gs, 1.0 - args.beta1);
                      v.mul_(args.beta2).addcmul_(gs, gs, 1.0 - args.beta2);
                      auto denom = (v.sqrt() / std::sqrt(1 - std::pow(args.beta2, 10.0))).add_(args.eps);
                      p.addcdiv_(m, denom, -args.lr / (1 - std::pow(args.beta1, 10.0)));
                    }, iterations),
                    32.0 * n});
#if STRATA_TORCH_HAS_FUSED_ADAMW
    {
      // LibTorch's own fused AdamW: one weight decay for the whole tensor (no mask), one step
      // tensor; the same bytes less the mask's read.
      auto step = torch::full({}, 10.0, opts);
      rows.push_back({"AdamW", "at::_fused_adamw_ (LibTorch, no mask)", n,
                      1e3 * Seconds([&] {
                        at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, args.lr, args.beta1, args.beta2, args.weight_decay,
                                          args.eps, /*amsgrad=*/false, /*maximize=*/false);
                      }, iterations),
                      28.0 * n});
    }
#endif
    auto out = torch::zeros({1}, opts), scratch = torch::empty({strata::kernels::MaskedSquareSumScratch()}, opts);
    rows.push_back({"MaskedSquareSum", "kernels::MaskedSquareSum", n,
                    1e3 * Seconds([&] {
                      strata::kernels::MaskedSquareSum(place, g.data_ptr<float>(), mask.data_ptr<float>(), n,
                                                       out.data_ptr<float>(), scratch.data_ptr<float>());
                    }, iterations),
                    8.0 * n});
    rows.push_back({"MaskedSquareSum", "LibTorch (g * mask).pow(2).sum()", n,
                    1e3 * Seconds([&] { out += (g * mask).pow(2).sum(); }, iterations), 8.0 * n});
  }
  std::printf("{\"device\": \"%s\", \"copy_GB_per_s\": %.0f}\n", torch::cuda::device_count() > 0 ?
              at::cuda::getDeviceProperties(0)->name : "?", copy_gbs);
  std::printf("\n| kernel | implementation | elements | ms | GB/s (bytes it must move / time) | of copy peak |\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double gbs = r.bytes / (r.ms / 1e3) / 1e9;
    std::printf("{\"kernel\": \"%s\", \"impl\": \"%s\", \"n\": %lld, \"ms\": %.3f, \"GB_per_s\": %.0f}\n", r.kernel.c_str(),
                r.impl.c_str(), static_cast<long long>(r.n), r.ms, gbs);
    std::printf("| %s | %s | %lld | %.3f | %.0f | %.0f%% |\n", r.kernel.c_str(), r.impl.c_str(), static_cast<long long>(r.n),
                r.ms, gbs, 100.0 * gbs / copy_gbs);
  }
  return 0;
}
