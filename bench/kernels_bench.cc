// Each CUDA kernel of kernels/ against the same maths in LibTorch ops on the same GPU, and
// against the bandwidth it could reach: bytes the kernel must move / its time, next to a
// device-to-device copy's rate (the practical HBM peak) on the same card.
//
//   kernels_bench [--sizes 124439808,885784576] [--iterations 20]
//
// The block pieces run at the shapes of the benchmarked models (GPT-2 124M and Llama 886M at
// 8 x 2048 / 8 x 1024 tokens), forward and backward together, against the op-by-op LibTorch
// form they replaced (autocast's dtypes: fp32 residual in, bf16 out) differentiated by autograd.
// "Bytes it must move" counts each input read once and each output written once, fwd + bwd.
//
// The residual norms (AddRmsNorm, AddLayerNorm with the backward's residual gradient) against
// LibTorch's add, norm and autograd at the same shapes. ZeRO-3's shard lookups (ShardRowsGather,
// ShardRowsScatterAdd) at GPT-2's token table over dp = 2 against the padded copy, embedding and
// embedding_dense_backward they replaced.
//
// Prints one JSON line per (kernel, implementation, size) and a markdown table. Needs a CUDA build.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "worker/nn/torch_compat.h"

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
    auto p = torch::randn({n}, opts), g = torch::randn({n}, opts), m = torch::zeros({n}, opts),
         v = torch::zeros({n}, opts);
    const strata::kernels::AdamWArgs args{3e-4, 0.9, 0.95, 1e-8, 0.1, 10, 0.8};
    rows.push_back({"AdamW", "kernels::AdamW (fused)", n,
                    1e3 * Seconds(
                              [&] {
                                strata::kernels::AdamW(place, args, p.data_ptr<float>(), g.data_ptr<float>(),
                                                       m.data_ptr<float>(), v.data_ptr<float>(), n);
                              },
                              iterations),
                    28.0 * n});
    rows.push_back({"AdamW", "LibTorch ops (the trainer before kernels/)", n,
                    1e3 * Seconds(
                              [&] {
                                torch::NoGradGuard no_grad;
                                auto gs = g * args.grad_scale;
                                p.mul_(1.0 - args.lr * args.weight_decay);
                                m.mul_(args.beta1).add_(gs, 1.0 - args.beta1);
                                v.mul_(args.beta2).addcmul_(gs, gs, 1.0 - args.beta2);
                                auto denom = (v.sqrt() / std::sqrt(1 - std::pow(args.beta2, 10.0))).add_(args.eps);
                                p.addcdiv_(m, denom, -args.lr / (1 - std::pow(args.beta1, 10.0)));
                              },
                              iterations),
                    28.0 * n});
    {
      // The host AdamW of an offloaded optimizer ([parallel] offload), on this machine's cores
      // over pinned host memory; its peak is the host's memory bandwidth, not the GPU's (the row's
      // "share of peak" compares it to the GPU copy and is not meaningful for it).
      const auto pinned = torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true);
      auto hp = p.cpu().pin_memory(), hg = g.cpu().pin_memory(), hm = torch::zeros({n}, pinned),
           hv = torch::zeros({n}, pinned);
      const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      rows.push_back({"AdamW", "kernels::AdamWHost (CPU, " + std::to_string(threads) + " threads)", n,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::AdamWHost(args, hp.data_ptr<float>(), hg.data_ptr<float>(),
                                                             hm.data_ptr<float>(), hv.data_ptr<float>(), n, threads);
                                },
                                std::max(1, iterations / 10)),
                      28.0 * n});
    }
    {
      // 8-bit AdamW: the moments as blockwise codes (kernels.h). Reads g and p (4 bytes each) and
      // the two codes (1 each), writes p and the codes, and reads and writes the two scales of
      // each block of 256: 16 bytes per element and 16 per block. The first steps
      // (the warm-up) take the state from zero to realistic codes.
      auto m_codes = torch::empty({n}, opts.dtype(torch::kUInt8)), v_codes = torch::empty_like(m_codes);
      auto m_scales = torch::empty({strata::kernels::AdamW8bitBlocks(n)}, opts), v_scales = torch::empty_like(m_scales);
      strata::kernels::AdamW8bitInit(place, m_codes.data_ptr<uint8_t>(), m_scales.data_ptr<float>(),
                                     v_codes.data_ptr<uint8_t>(), v_scales.data_ptr<float>(), n);
      rows.push_back({"AdamW", "kernels::AdamW8bit (8-bit blockwise moments)", n,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::AdamW8bit(place, args, p.data_ptr<float>(), g.data_ptr<float>(),
                                                             m_codes.data_ptr<uint8_t>(), m_scales.data_ptr<float>(),
                                                             v_codes.data_ptr<uint8_t>(), v_scales.data_ptr<float>(),
                                                             n);
                                },
                                iterations),
                      16.0 * n + 16.0 * strata::kernels::AdamW8bitBlocks(n)});
    }
#if STRATA_TORCH_HAS_FUSED_ADAMW
    {
      // LibTorch's own fused AdamW: one weight decay for the whole tensor, one step tensor; the
      // same bytes.
      auto step = torch::full({}, 10.0, opts);
      rows.push_back({"AdamW", "at::_fused_adamw_ (LibTorch)", n,
                      1e3 * Seconds(
                                [&] {
                                  at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, args.lr, args.beta1, args.beta2,
                                                    args.weight_decay, args.eps, /*amsgrad=*/false, /*maximize=*/false);
                                },
                                iterations),
                      28.0 * n});
    }
#endif
    auto out = torch::zeros({1}, opts), scratch = torch::empty({strata::kernels::SquareSumScratch()}, opts);
    rows.push_back({"SquareSum", "kernels::SquareSum", n,
                    1e3 * Seconds(
                              [&] {
                                strata::kernels::SquareSum(place, g.data_ptr<float>(), n, out.data_ptr<float>(),
                                                           scratch.data_ptr<float>());
                              },
                              iterations),
                    4.0 * n});
    rows.push_back({"SquareSum", "LibTorch g.pow(2).sum()", n,
                    1e3 * Seconds([&] { out += g.pow(2).sum(); }, iterations), 4.0 * n});
  }
  // ---- block pieces, forward + backward
  {
    const auto bf16 = opts.dtype(torch::kBFloat16);
    using strata::kernels::DType;
    auto grad_of = [](const torch::Tensor& y, const std::vector<torch::Tensor>& inputs, const torch::Tensor& dy) {
      return torch::autograd::grad({y}, inputs, {dy});
    };
    // Cross-entropy over GPT-2's logits (8 x 1024 rows, 50257 padded to 50304), bf16: loss and
    // gradient in one kernel; LibTorch: widen, logsumexp, softmax minus one-hot, scale, narrow.
    {
      const int64_t n_rows = 8192, vocab = 50257, stride = 50304;
      auto z = torch::randn({n_rows, stride}, bf16),
           targets = torch::randint(0, vocab, {n_rows}, opts.dtype(torch::kLong));
      auto loss = torch::empty({n_rows}, opts);
      auto work = z.clone();
      rows.push_back({"CrossEntropy (fwd+bwd)", "kernels::CrossEntropyGradInPlace", n_rows * stride,
                      1e3 * Seconds(
                                [&] {
                                  work.copy_(z);
                                  strata::kernels::CrossEntropyGradInPlace(
                                      place, DType::kBFloat16, work.data_ptr(), n_rows, vocab, stride,
                                      targets.data_ptr<int64_t>(), 1.0f / n_rows, loss.data_ptr<float>());
                                },
                                iterations) -
                          1e3 * Seconds([&] { work.copy_(z); }, iterations),
                      4.0 * n_rows * stride});
      rows.push_back({"CrossEntropy (fwd+bwd)", "LibTorch ops (widen, logsumexp, softmax - one-hot, narrow)",
                      n_rows * stride,
                      1e3 * Seconds(
                                [&] {
                                  torch::NoGradGuard no_grad;
                                  auto zf = z.narrow(1, 0, vocab).to(torch::kFloat);
                                  auto lse = torch::logsumexp(zf, 1, true);
                                  loss.copy_((lse.squeeze(1) - zf.gather(1, targets.unsqueeze(1)).squeeze(1)));
                                  auto dz = torch::exp(zf - lse);
                                  dz.scatter_add_(1, targets.unsqueeze(1), torch::full({n_rows, 1}, -1.0f, opts));
                                  work.narrow(1, 0, vocab).copy_(dz.mul_(1.0 / n_rows));
                                },
                                iterations),
                      4.0 * n_rows * stride});
    }
    // Vocab-parallel cross-entropy (tp = 2 of a 32000 vocabulary: this rank's 16000 columns of
    // 8 x 2048 rows, bf16), the two passes around the ranks' merge of row statistics: pass 1
    // reads the slice once (the lse and the target's logit per row); pass 2 reads it and writes
    // the gradient over it. LibTorch: the same maths op by op.
    {
      const int64_t n_rows = 16384, vocab = 16000, stride = 16000;
      auto z = torch::randn({n_rows, stride}, bf16);
      // Half the targets are another rank's (outside [0, vocab)), as under tp = 2.
      auto targets = torch::randint(-vocab, vocab, {n_rows}, opts.dtype(torch::kLong));
      auto lse = torch::empty({n_rows}, opts), target_logit = torch::empty({n_rows}, opts);
      auto work = z.clone();
      rows.push_back({"CrossEntropyRowStats (vocab slice)", "kernels::CrossEntropyRowStats", n_rows * stride,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::CrossEntropyRowStats(place, DType::kBFloat16, z.data_ptr(), n_rows,
                                                                        vocab, stride, targets.data_ptr<int64_t>(),
                                                                        lse.data_ptr<float>(),
                                                                        target_logit.data_ptr<float>());
                                },
                                iterations),
                      2.0 * n_rows * stride});
      const auto mine = targets.ge(0).logical_and(targets.lt(vocab));
      const auto local = targets.clamp(0, vocab - 1).unsqueeze(1);
      rows.push_back({"CrossEntropyRowStats (vocab slice)", "LibTorch ops (widen, logsumexp, gather, mask)",
                      n_rows * stride,
                      1e3 * Seconds(
                                [&] {
                                  torch::NoGradGuard no_grad;
                                  auto zf = z.to(torch::kFloat);
                                  lse.copy_(torch::logsumexp(zf, 1));
                                  target_logit.copy_(zf.gather(1, local).squeeze(1).masked_fill(mine.logical_not(), 0));
                                },
                                iterations),
                      2.0 * n_rows * stride});
      rows.push_back({"CrossEntropyGradFromLse (vocab slice)", "kernels::CrossEntropyGradFromLse", n_rows * stride,
                      1e3 * Seconds(
                                [&] {
                                  work.copy_(z);
                                  strata::kernels::CrossEntropyGradFromLse(
                                      place, DType::kBFloat16, work.data_ptr(), n_rows, vocab, stride,
                                      targets.data_ptr<int64_t>(), lse.data_ptr<float>(), 1.0f / n_rows);
                                },
                                iterations) -
                          1e3 * Seconds([&] { work.copy_(z); }, iterations),
                      4.0 * n_rows * stride});
      rows.push_back({"CrossEntropyGradFromLse (vocab slice)",
                      "LibTorch ops (widen, exp(z - lse) - one-hot, scale, narrow)", n_rows * stride,
                      1e3 * Seconds(
                                [&] {
                                  torch::NoGradGuard no_grad;
                                  auto dz = torch::exp(z.to(torch::kFloat) - lse.unsqueeze(1));
                                  dz.scatter_add_(1, local, mine.to(torch::kFloat).neg().unsqueeze(1));
                                  work.copy_(dz.mul_(1.0 / n_rows));
                                },
                                iterations),
                      4.0 * n_rows * stride});
    }
    struct NormCase {
      const char* name;
      int64_t rows, cols;
      bool centered;
    };
    for (const NormCase& c : {NormCase{"RmsNorm (fwd+bwd), Llama 2048", 16384, 2048, false},
                              NormCase{"LayerNorm (fwd+bwd), GPT-2 768", 8192, 768, true}}) {
      auto x = torch::randn({c.rows, c.cols}, opts), w = torch::randn({c.cols}, opts), b = torch::randn({c.cols}, opts);
      auto dy = torch::randn({c.rows, c.cols}, bf16), y = torch::empty({c.rows, c.cols}, bf16),
           dx = torch::empty_like(x);
      auto mean = torch::empty({c.rows}, opts), rstd = torch::empty({c.rows}, opts);
      auto dw = torch::empty({strata::kernels::NormWeightPartialRows(place, c.rows), c.cols}, opts),
           db = torch::empty_like(dw);
      rows.push_back({c.name, "kernels (fused, bf16 out)", c.rows * c.cols,
                      1e3 * Seconds(
                                [&] {
                                  if (c.centered) {
                                    strata::kernels::LayerNormForward(
                                        place, DType::kFloat32, x.data_ptr(), w.data_ptr<float>(), b.data_ptr<float>(),
                                        DType::kBFloat16, y.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                                        c.rows, c.cols, 1e-5f);
                                    strata::kernels::LayerNormBackward(
                                        place, DType::kFloat32, x.data_ptr(), w.data_ptr<float>(),
                                        mean.data_ptr<float>(), rstd.data_ptr<float>(), DType::kBFloat16, dy.data_ptr(),
                                        dx.data_ptr(), dw.data_ptr<float>(), db.data_ptr<float>(), c.rows, c.cols);
                                    db.sum(0);
                                  } else {
                                    strata::kernels::RmsNormForward(place, DType::kFloat32, x.data_ptr(),
                                                                    w.data_ptr<float>(), DType::kBFloat16, y.data_ptr(),
                                                                    rstd.data_ptr<float>(), c.rows, c.cols, 1e-5f);
                                    strata::kernels::RmsNormBackward(place, DType::kFloat32, x.data_ptr(),
                                                                     w.data_ptr<float>(), rstd.data_ptr<float>(),
                                                                     DType::kBFloat16, dy.data_ptr(), dx.data_ptr(),
                                                                     dw.data_ptr<float>(), c.rows, c.cols);
                                  }
                                  dw.sum(0);
                                },
                                iterations),
                      16.0 * c.rows * c.cols});
      auto xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true),
           bl = b.clone().requires_grad_(true);
      rows.push_back(
          {c.name, "LibTorch ops (fp32 norm, then cast to bf16) + autograd", c.rows * c.cols,
           1e3 * Seconds(
                     [&] {
                       torch::Tensor out;
                       if (c.centered) {
                         out = torch::layer_norm(xl, {c.cols}, wl, bl, 1e-5).to(torch::kBFloat16);
                         grad_of(out, {xl, wl, bl}, dy);
                       } else {
                         out = (wl * (xl * torch::rsqrt(xl.pow(2).mean(-1, true) + 1e-5))).to(torch::kBFloat16);
                         grad_of(out, {xl, wl}, dy);
                       }
                     },
                     iterations),
           16.0 * c.rows * c.cols});
    }
    // The residual add and the norm after it (resid_mid = x + attn_out; m = norm(resid_mid)),
    // forward and backward with both outputs' gradients: fp32 residual x, bf16 sublayer output
    // a and norm output y, as under autocast. Bytes: forward reads x (4) and a (2) and writes s
    // (4) and y (2); backward reads s (4), dy (2) and d_residual (4) and writes ds (4) and its
    // bf16 copy da (2) - 28 a column. LibTorch: the add, the norm, autograd's fp32 add of s's two
    // gradients and the cast of da, which the fused pair does in its two kernels.
    for (const NormCase& c : {NormCase{"AddRmsNorm (fwd+bwd), Llama 2048", 16384, 2048, false},
                              NormCase{"AddLayerNorm (fwd+bwd), GPT-2 768", 8192, 768, true}}) {
      auto x = torch::randn({c.rows, c.cols}, opts), a = torch::randn({c.rows, c.cols}, bf16);
      auto w = torch::randn({c.cols}, opts), b = torch::randn({c.cols}, opts);
      auto dy = torch::randn({c.rows, c.cols}, bf16), d_residual = torch::randn({c.rows, c.cols}, opts);
      auto s = torch::empty_like(x), y = torch::empty({c.rows, c.cols}, bf16), ds = torch::empty_like(x),
           da = torch::empty_like(a);
      auto mean = torch::empty({c.rows}, opts), rstd = torch::empty({c.rows}, opts);
      auto dw = torch::empty({strata::kernels::NormWeightPartialRows(place, c.rows), c.cols}, opts),
           db = torch::empty_like(dw);
      const strata::kernels::NormResidualGrad residual{d_residual.data_ptr(), da.data_ptr(), DType::kBFloat16};
      rows.push_back(
          {c.name, "kernels (fused add + norm, residual gradient in the backward)", c.rows * c.cols,
           1e3 * Seconds(
                     [&] {
                       if (c.centered) {
                         strata::kernels::AddLayerNormForward(
                             place, DType::kFloat32, x.data_ptr(), DType::kBFloat16, a.data_ptr(), s.data_ptr(),
                             w.data_ptr<float>(), b.data_ptr<float>(), DType::kBFloat16, y.data_ptr(),
                             mean.data_ptr<float>(), rstd.data_ptr<float>(), c.rows, c.cols, 1e-5f);
                         strata::kernels::LayerNormBackward(
                             place, DType::kFloat32, s.data_ptr(), w.data_ptr<float>(), mean.data_ptr<float>(),
                             rstd.data_ptr<float>(), DType::kBFloat16, dy.data_ptr(), ds.data_ptr(),
                             dw.data_ptr<float>(), db.data_ptr<float>(), c.rows, c.cols, residual);
                         db.sum(0);
                       } else {
                         strata::kernels::AddRmsNormForward(place, DType::kFloat32, x.data_ptr(), DType::kBFloat16,
                                                            a.data_ptr(), s.data_ptr(), w.data_ptr<float>(),
                                                            DType::kBFloat16, y.data_ptr(), rstd.data_ptr<float>(),
                                                            c.rows, c.cols, 1e-5f);
                         strata::kernels::RmsNormBackward(place, DType::kFloat32, s.data_ptr(), w.data_ptr<float>(),
                                                          rstd.data_ptr<float>(), DType::kBFloat16, dy.data_ptr(),
                                                          ds.data_ptr(), dw.data_ptr<float>(), c.rows, c.cols,
                                                          residual);
                       }
                       dw.sum(0);
                     },
                     iterations),
           28.0 * c.rows * c.cols});
      auto xl = x.clone().requires_grad_(true), al = a.clone().requires_grad_(true);
      auto wl = w.clone().requires_grad_(true), bl = b.clone().requires_grad_(true);
      rows.push_back(
          {c.name, "LibTorch x + a, the norm (fp32, cast to bf16) + autograd", c.rows * c.cols,
           1e3 * Seconds(
                     [&] {
                       auto sum = xl + al;
                       torch::Tensor out;
                       std::vector<torch::Tensor> inputs = {xl, al, wl};
                       if (c.centered) {
                         out = torch::layer_norm(sum, {c.cols}, wl, bl, 1e-5).to(torch::kBFloat16);
                         inputs.push_back(bl);
                       } else {
                         out = (wl * (sum * torch::rsqrt(sum.pow(2).mean(-1, true) + 1e-5))).to(torch::kBFloat16);
                       }
                       torch::autograd::grad({sum, out}, inputs, {d_residual, dy});
                     },
                     iterations),
           28.0 * c.rows * c.cols});
    }
    {
      const int64_t n = int64_t{16384} * 5632;  // Llama 886M's MLP hidden at 8 x 2048 tokens
      auto g = torch::randn({n}, bf16), u = torch::randn({n}, bf16), dy = torch::randn({n}, bf16);
      auto y = torch::empty_like(g), dg = torch::empty_like(g), du = torch::empty_like(g);
      rows.push_back({"SwiGlu (fwd+bwd), Llama MLP", "kernels (fused)", n,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::SwiGluForward(place, DType::kBFloat16, g.data_ptr(), u.data_ptr(),
                                                                 y.data_ptr(), n);
                                  strata::kernels::SwiGluBackward(place, DType::kBFloat16, g.data_ptr(), u.data_ptr(),
                                                                  dy.data_ptr(), dg.data_ptr(), du.data_ptr(), n);
                                },
                                iterations),
                      16.0 * n});
      auto gl = g.clone().requires_grad_(true), ul = u.clone().requires_grad_(true);
      rows.push_back({"SwiGlu (fwd+bwd), Llama MLP", "LibTorch silu(g) * u + autograd", n,
                      1e3 * Seconds(
                                [&] {
                                  grad_of(torch::silu(gl) * ul, {gl, ul}, dy);
                                },
                                iterations),
                      16.0 * n});
    }
    {
      // GPT-2 124M's MLP up projection at 8 x 1024 tokens: bias + GELU (tanh) on its bf16 output.
      const int64_t r = 8192, c = 3072, n = r * c;
      auto h = torch::randn({r, c}, bf16), dy = torch::randn({r, c}, bf16), bias = torch::randn({c}, opts);
      auto y = torch::empty_like(h), dh = torch::empty_like(h);
      auto db = torch::empty({strata::kernels::BiasPartialRows(place, r), c}, opts);
      rows.push_back({"BiasGelu (fwd+bwd), GPT-2 MLP", "kernels (fused)", n,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::BiasGeluForward(place, strata::kernels::Gelu::kTanh,
                                                                   DType::kBFloat16, h.data_ptr(),
                                                                   bias.data_ptr<float>(), y.data_ptr(), r, c);
                                  strata::kernels::BiasGeluBackward(
                                      place, strata::kernels::Gelu::kTanh, DType::kBFloat16, h.data_ptr(),
                                      bias.data_ptr<float>(), dy.data_ptr(), dh.data_ptr(), db.data_ptr<float>(), r, c);
                                  db.sum(0);
                                },
                                iterations),
                      10.0 * n});
      // The form before: the bf16 bias inside the matmul (here an add), LibTorch's GELU, and
      // autograd's bias gradient (a bf16 column sum).
      auto hl = h.clone().requires_grad_(true), bl = bias.to(torch::kBFloat16).requires_grad_(true);
      rows.push_back({"BiasGelu (fwd+bwd), GPT-2 MLP", "LibTorch gelu(h + b) + autograd", n,
                      1e3 * Seconds(
                                [&] {
                                  grad_of(torch::gelu(hl + bl, "tanh"), {hl, bl}, dy);
                                },
                                iterations),
                      10.0 * n});
    }
    {
      const int64_t b = 8, t = 2048, heads = 16, hd = 128, n = b * t * heads * hd;
      auto x = torch::randn({b, t, heads, hd}, bf16), dy = torch::randn({b, t, heads, hd}, bf16);
      auto y = torch::empty_like(x), dx = torch::empty_like(x);
      auto freqs = torch::outer(torch::arange(t, opts), torch::rand({hd / 2}, opts));
      auto cos = freqs.cos().contiguous(), sin = freqs.sin().contiguous();
      const strata::kernels::RotaryShape shape{b, t, heads, hd, hd};
      rows.push_back(
          {"Rotary (fwd+bwd), Llama q", "kernels (fused)", n,
           1e3 * Seconds(
                     [&] {
                       strata::kernels::Rotary(place, shape, DType::kBFloat16, x.data_ptr(), DType::kBFloat16,
                                               y.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), false);
                       strata::kernels::Rotary(place, shape, DType::kBFloat16, dy.data_ptr(), DType::kBFloat16,
                                               dx.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), true);
                     },
                     iterations),
           8.0 * n});
      // The form before kernels/: [b, heads, t, hd] with duplicated-half cos, sin in fp32 (the
      // residual's dtype under autocast), so q * cos widens to fp32.
      auto xl = x.transpose(1, 2).clone().requires_grad_(true);
      auto c2 = torch::cat({freqs, freqs}, -1).cos(), s2 = torch::cat({freqs, freqs}, -1).sin();
      rows.push_back({"Rotary (fwd+bwd), Llama q", "LibTorch rotate_half + autograd", n,
                      1e3 * Seconds(
                                [&] {
                                  auto halves = xl.chunk(2, -1);
                                  auto out = xl * c2 + torch::cat({-halves[1], halves[0]}, -1) * s2;
                                  grad_of(out, {xl}, dy.transpose(1, 2).to(torch::kFloat));
                                },
                                iterations),
                      8.0 * n});
    }
  }
  {
    // ZeRO-3's lookup from a shard (worker/train/zero3_lookup.cc): GPT-2's token table [50257, 768]
    // over dp = 2, this rank's shard its first half, 2 x 8,192 gathered ids. The kernels against
    // the LibTorch form they replaced: a padded copy of the shard and an embedding, then
    // embedding_dense_backward over the padded rows and an add into the shard's gradient. Bytes
    // it must move: the rows written and the shard's elements read (gather); the gradient rows of
    // the shard's ids read and each named row of the shard's gradient read and written
    // (scatter-add; the sort, queued beside the forward, is not counted).
    //
    // Two draws of the ids: uniform over the table (runs of about one), and Zipf's law over it,
    // the r-th most common id drawn with weight 1 / r as in text (the most common id about 9% of
    // the batch, a run of ~1,400: before the scatter-add's chunks, one block summed it alone).
    const int64_t table_rows = 50257, c = 768, begin = 0, end = table_rows * c / 2, n = 16384;
    const auto longs = torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA);
    const auto zipf_weights =
        torch::arange(1, table_rows + 1, torch::TensorOptions().dtype(torch::kDouble).device(torch::kCUDA))
            .reciprocal();
    for (const bool zipf : {false, true}) {
      const std::string draw = zipf ? ", Zipf ids" : ", uniform ids";
      auto ids =
          zipf ? torch::multinomial(zipf_weights, n, /*replacement=*/true) : torch::randint(0, table_rows, {n}, longs);
      auto shard = torch::randn({end - begin}, opts), out = torch::empty({n, c}, opts), dy = torch::randn({n, c}, opts);
      auto grad = torch::zeros({end - begin}, opts);
      auto scratch = torch::empty({strata::kernels::ShardRowsScatterAddScratch(n, c)}, opts);
      const auto sorted = torch::sort(ids, /*stable=*/true, 0, false);
      const auto& sorted_ids = std::get<0>(sorted);
      const auto& order = std::get<1>(sorted);
      const strata::kernels::ShardRowsShape shape{c, begin, end};
      // Rows with an element in the shard (its end cuts row 25,128), and the padded rows the old
      // path looked up in: [0, 25,129) with one zero row after them for every other id.
      const int64_t end_row = (end + c - 1) / c, padded_rows = end_row + 1;
      const auto held = ids < end_row;
      const double held_rows = held.sum().item<double>(),
                   named_rows = std::get<0>(torch::_unique(ids.index({held}))).numel();
      const auto local = ids.masked_fill(ids >= end_row, padded_rows - 1);
      rows.push_back({"ShardRowsGather, GPT-2 wte / dp 2" + draw, "kernels", n * c,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::ShardRowsGather(place, shape, shard.data_ptr<float>(),
                                                                   ids.data_ptr<int64_t>(), n, out.data_ptr<float>());
                                },
                                iterations),
                      4.0 * (static_cast<double>(n) + held_rows) * c});
      auto padded = torch::empty({padded_rows * c}, opts);
      rows.push_back({"ShardRowsGather, GPT-2 wte / dp 2" + draw, "LibTorch padded copy + embedding", n * c,
                      1e3 * Seconds(
                                [&] {
                                  padded.narrow(0, end - begin, padded.numel() - (end - begin)).zero_();
                                  padded.narrow(0, 0, end - begin).copy_(shard);
                                  out.copy_(torch::embedding(padded.view({padded_rows, c}), local));
                                },
                                iterations),
                      4.0 * (static_cast<double>(n) + held_rows) * c});
      rows.push_back({"ShardRowsScatterAdd, GPT-2 wte / dp 2" + draw, "kernels", n * c,
                      1e3 * Seconds(
                                [&] {
                                  strata::kernels::ShardRowsScatterAdd(
                                      place, shape, dy.data_ptr<float>(), sorted_ids.data_ptr<int64_t>(),
                                      order.data_ptr<int64_t>(), n, grad.data_ptr<float>(), scratch.data_ptr<float>());
                                },
                                iterations),
                      4.0 * (held_rows + 2.0 * named_rows) * c});
      rows.push_back({"ShardRowsScatterAdd, GPT-2 wte / dp 2" + draw, "LibTorch embedding_dense_backward + add", n * c,
                      1e3 * Seconds(
                                [&] {
                                  const auto dense = at::embedding_dense_backward(dy, local, padded_rows, -1, false);
                                  grad.add_(dense.view({-1}).narrow(0, 0, end - begin));
                                },
                                iterations),
                      4.0 * (held_rows + 2.0 * named_rows) * c});
    }
  }
  std::printf("{\"device\": \"%s\", \"copy_GB_per_s\": %.0f}\n",
              torch::cuda::device_count() > 0 ? at::cuda::getDeviceProperties(0)->name : "?", copy_gbs);
  std::printf(
      "\n| kernel | implementation | elements | ms | GB/s (bytes it must move / time) | of copy peak "
      "|\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double gbs = r.bytes / (r.ms / 1e3) / 1e9;
    std::printf("{\"kernel\": \"%s\", \"impl\": \"%s\", \"n\": %lld, \"ms\": %.3f, \"GB_per_s\": %.0f}\n",
                r.kernel.c_str(), r.impl.c_str(), static_cast<long long>(r.n), r.ms, gbs);
    std::printf("| %s | %s | %lld | %.3f | %.0f | %.0f%% |\n", r.kernel.c_str(), r.impl.c_str(),
                static_cast<long long>(r.n), r.ms, gbs, 100.0 * gbs / copy_gbs);
  }
  return 0;
}
