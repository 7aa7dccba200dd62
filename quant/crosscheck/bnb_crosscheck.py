# Cross-check of strata's quant/nf4 against real bitsandbytes on CUDA (not run by CI: it needs a GPU
# and bitsandbytes' source). Layout it expects, in one folder: bnb/ (bitsandbytes' repository),
# quant/ and common/status.{h,cc} from strata, driver.cc and this file. On a GPU machine:
#   cmake -S bnb -B bnb/build -G Ninja -DCOMPUTE_BACKEND=cuda -DCOMPUTE_CAPABILITY=90 && cmake --build bnb/build
#   g++ -std=c++20 -O2 -ffp-contract=off -I. driver.cc quant/nf4.cc quant/nf4_state_dict.cc common/status.cc -o driver
#   OUT=/tmp/out python3 bnb_crosscheck.py     # writes $OUT/report.json
import json, os, struct, subprocess, sys, time
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "bnb"))
import bitsandbytes.functional as F  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/out")
DRV = os.path.join(HERE, "driver")
W = os.path.join("/tmp", "nf4cases")
os.makedirs(W, exist_ok=True)
report = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
          "gpu": torch.cuda.get_device_name(0)}
NF4_MID = np.array([-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
                    -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
                    0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                    0.5016634166240692, 0.6427869200706482, 0.8614784181118011], dtype=np.float32)


def drv(*args):
    r = subprocess.run([DRV, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"driver {args[0]} failed: {r.stderr}")


def dt_name(t):
    return {torch.uint8: "U8", torch.float32: "F32"}[t.dtype]


def save_sd(d, sd):
    os.makedirs(d, exist_ok=True)
    for k, v in sd.items():
        v = v.detach().cpu().contiguous()
        open(f"{d}/{k}.bin", "wb").write(v.numpy().tobytes())
        open(f"{d}/{k}.meta", "w").write(" ".join([dt_name(v)] + [str(x) for x in v.shape]) + "\n")


def rd(p):
    return open(p, "rb").read()


def nibbles(b):
    a = np.frombuffer(b, dtype=np.uint8)
    return np.stack([a >> 4, a & 15], 1).reshape(-1)


# 1. tables
drv("map", f"{W}/map.f32")
ours_map = np.fromfile(f"{W}/map.f32", dtype=np.float32)
bnb_map = F.create_dynamic_map().numpy()
report["dynamic_map_bitwise_equal"] = bool((ours_map.view(np.uint32) == bnb_map.view(np.uint32)).all())
report["dynamic_map_mismatch_idx"] = np.nonzero(ours_map.view(np.uint32) != bnb_map.view(np.uint32))[0].tolist()[:20]
open(f"{OUT}/bnb_dynamic_map.hex", "w").write("\n".join(f"{x:08x}" for x in bnb_map.view(np.uint32)) + "\n")
for cap in ["default", "avx2", "avx512"]:
    code = ("import sys; sys.path.insert(0,'bnb'); import bitsandbytes.functional as F, torch, numpy as np;"
            "print(torch.backends.cpu.get_cpu_capability(), ''.join(f'{x:08x}' for x in F.create_dynamic_map().numpy().view(np.uint32)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE,
                       env={**os.environ, "ATEN_CPU_CAPABILITY": cap})
    parts = r.stdout.split()
    report[f"dynamic_map_capability_{cap}"] = (parts[0], parts[1] == "".join(f"{x:08x}" for x in bnb_map.view(np.uint32))) if len(parts) == 2 else r.stderr[-300:]
nf4 = F.get_4bit_type("nf4", device="cpu").numpy()
report["nf4_table_hex"] = [f"{x:08x}" for x in nf4.view(np.uint32)]
mid32 = ((nf4[:-1] + nf4[1:]) / np.float32(2)).astype(np.float32)
report["tree_midpoint_literals_equal_float32_midpoints"] = [bool(a == b) for a, b in zip(NF4_MID, mid32)]

try:
    import cupy as cp
    lit = cp.RawKernel(r'''extern "C" __global__ void lit(float* y) {
      y[0] = -0.8480964004993439f; y[1] = 0.1202552504837513f; y[2] = 0.5016634166240692f; y[3] = 0.8614784181118011f; }''', "lit", options=("--use_fast_math",))
    yd = cp.zeros(4, dtype=cp.float32); lit((1,), (1,), (yd,))
    report["nvrtc_literal_bits"] = [f"{x:08x}" for x in cp.asnumpy(yd).view(np.uint32)]
except Exception as e:  # noqa: BLE001
    report["nvrtc_literal_bits"] = repr(e)[:300]
# 2. python repr
rng = np.random.default_rng(7)
vals = np.concatenate([rng.standard_normal(3000).astype(np.float32).astype(np.float64) * 10.0 ** rng.integers(-12, 22, 3000),
                       np.array([0.0, -0.0, 1e-4, 1e-5, 9.999e-5, 1e15, 1e16, 123456789.0, 0.1, 1.5, 2.0, float("nan"), float("inf"), -float("inf"), 5e-324, 1.7976931348623157e308])])
vals.tofile(f"{W}/repr.f64")
drv("repr", f"{W}/repr.f64", f"{W}/repr.txt")
ours = open(f"{W}/repr.txt").read().split("\n")[:-1]
want = [json.dumps(float(v)) for v in vals]
bad = [(w, o) for w, o in zip(want, ours) if w != o]
report["python_repr"] = {"n": len(vals), "mismatches": len(bad), "examples": bad[:5]}

# 3. rcp under --use_fast_math vs IEEE for one binade
try:
    import cupy as cp
    k = cp.RawKernel(r'''extern "C" __global__ void rcp(const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 1.0f / x[i]; }''', "rcp",
                     options=("--use_fast_math",))
    m = np.arange(1 << 23, dtype=np.uint32)
    x = (np.uint32(127 << 23) | m).view(np.float32)
    xd = cp.asarray(x); yd = cp.empty_like(xd)
    k(((x.size + 255) // 256,), (256,), (xd, yd, np.int32(x.size)))
    y = cp.asnumpy(yd)
    ieee = (np.float32(1) / x).astype(np.float32)
    diff = y.view(np.int32).astype(np.int64) - ieee.view(np.int32).astype(np.int64)
    report["fastmath_rcp_vs_ieee_binade_1_2"] = {"n": int(x.size), "differ": int((diff != 0).sum()),
                                                 "max_ulp": int(np.abs(diff).max())}
except Exception as e:  # noqa: BLE001
    report["fastmath_rcp_vs_ieee_binade_1_2"] = repr(e)[:300]

# 4. the cases
g = torch.Generator().manual_seed(1234)


def heavy(shape, dtype):
    n = int(np.prod(shape))
    z = torch.randn(n, generator=g)
    chi = (torch.randn(n, 3, generator=g) ** 2).sum(1) / 3.0
    t = z / chi.sqrt()  # Student-t, 3 degrees of freedom
    idx = torch.randint(0, n, (max(1, n // 500),), generator=g)
    t[idx] *= 100.0
    return (t * 0.02).reshape(shape).to(dtype)


def normal(shape, dtype, s=0.02):
    return (torch.randn(shape, generator=g) * s).to(dtype)


def with_zeros(shape, dtype):
    t = normal(shape, dtype)
    f = t.reshape(-1)
    f[64:128] = 0; f[-(f.numel() % 64 or 64):] = 0
    return t


def thresholds_case():
    # Values on, and one float either side of, bnb's threshold literals and the float32 midpoints;
    # each block starts with 1.0 so its absmax is 1 and x = w exactly.
    tab = F.get_4bit_type("nf4", device="cpu")
    m32 = ((tab[:-1] + tab[1:]) / 2).tolist()
    L = []
    for a, b in zip(NF4_MID.tolist(), m32):
        for v in (np.float32(a), np.float32(b)):
            L += [float(v), float(np.nextafter(v, np.float32(2))), float(np.nextafter(v, np.float32(-2)))]
    blk1 = [1.0] + L[:63]
    blk2 = ([1.0] + L[63:] + [0.5] * 64)[:64]
    return torch.tensor(blk1 + blk2 + [0.5] * 64, dtype=torch.float32).reshape(3, 64)


cases = [
    ("thresholds_f32_3x64", thresholds_case()),
    ("tiny_f32_3x5", normal((3, 5), torch.float32, 1.0)),
    ("normal_f32_37x91", normal((37, 91), torch.float32)),
    ("normal_bf16_129x67", normal((129, 67), torch.bfloat16)),
    ("heavy_f32_7x4729", heavy((7, 4729), torch.float32)),
    ("heavy_bf16_257x513", heavy((257, 513), torch.bfloat16)),
    ("zeros_f32_5x193", with_zeros((5, 193), torch.float32)),
    ("exact_bf16_64x256", normal((64, 256), torch.bfloat16)),
    ("fp16_33x77", normal((33, 77), torch.float16)),
    ("big_bf16_4096x4096", normal((4096, 4096), torch.bfloat16)),
    ("big_heavy_f32_2048x5503", heavy((2048, 5503), torch.float32)),
]
results = {}
for name, A in cases:
    t0 = time.time()
    d = f"{W}/{name}"
    os.makedirs(d, exist_ok=True)
    res = {"shape": list(A.shape), "dtype": str(A.dtype)}
    # The driver quantizes f32 and bf16; fp16 goes through the read-back of bnb's output only.
    open(f"{d}/in.bin", "wb").write(A.contiguous().view(-1).view(torch.int16 if A.element_size() == 2 else torch.int32).numpy().tobytes())
    for nested in (True, False):
        tag = "nested" if nested else "plain"
        qw, qs = F.quantize_4bit(A.cuda(), blocksize=64, compress_statistics=nested, quant_type="nf4")
        sd = {"weight": qw}
        sd.update(qs.as_dict(packed=True))
        keys = [k for k in sd]
        bdir = f"{d}/bnb_{tag}"
        save_sd(bdir, sd)
        deq = F.dequantize_4bit(qw, qs).cpu()
        r = {"keys": keys}
        if A.dtype != torch.float16:
            odir = f"{d}/ours_{tag}"; os.makedirs(odir, exist_ok=True)
            drv("quant", f"{d}/in.bin", "f32" if A.dtype == torch.float32 else "bf16", odir, int(nested), *A.shape)
            for k in keys:
                a, b = rd(f"{bdir}/{k}.bin"), rd(f"{odir}/{k}.bin")
                ma, mb = open(f"{bdir}/{k}.meta").read(), open(f"{odir}/{k}.meta").read()
                if k == "weight":
                    na, nb = nibbles(a), nibbles(b)
                    diff = np.nonzero(na != nb)[0]
                    r["codes_nibbles_differ"] = int(diff.size)
                    r["codes_total"] = int(na.size)
                    if diff.size:
                        x = A.reshape(-1).float().numpy()
                        am = np.abs(np.pad(x, (0, (-x.size) % 64)).reshape(-1, 64)).max(1)
                        ex = []
                        for i in diff[:5]:
                            if i >= x.size:
                                ex.append({"i": int(i), "pad": True}); continue
                            xn = np.float32(x[i]) * (np.float32(1) / am[i // 64])
                            ex.append({"i": int(i), "bnb": int(na[i]), "ours": int(nb[i]), "xn": float(xn),
                                       "ulps_to_nearest_mid": int(np.abs(NF4_MID.view(np.int32).astype(np.int64) - np.float32(xn).view(np.int32)).min())})
                        r["codes_examples"] = ex
                else:
                    r[f"{k}_bytes_equal"] = a == b
                if ma != mb:
                    r[f"{k}_meta"] = (ma.strip(), mb.strip())
            if not nested:
                r["absmax_raw_bnb_vs_ours_equal"] = rd(f"{bdir}/absmax.bin") == rd(f"{odir}/absmax.bin")
            else:
                js = json.loads(rd(f"{bdir}/quant_state.bitsandbytes__nf4.bin").decode())
                off = np.float32(js["nested_offset"])
                ours_js = json.loads(rd(f"{odir}/quant_state.bitsandbytes__nf4.bin").decode())
                r["offset_bnb"] = float(off); r["offset_ours"] = ours_js["nested_offset"]
                r["offset_ulp_diff"] = int(np.float32(ours_js["nested_offset"]).view(np.int32)) - int(off.view(np.int32))
                ndir = f"{d}/nest_{tag}"; os.makedirs(ndir, exist_ok=True)
                # nest with bnb's offset, from bnb's own raw absmax
                _, qs0 = F.quantize_4bit(A.cuda(), blocksize=64, compress_statistics=False, quant_type="nf4")
                qs0.absmax.cpu().numpy().tofile(f"{ndir}/absmax_raw_bnb.f32")
                r["absmax_raw_equal"] = rd(f"{ndir}/absmax_raw_bnb.f32") == rd(f"{odir}/absmax_raw.f32")
                drv("nest", f"{ndir}/absmax_raw_bnb.f32", f"{off.view(np.uint32):08x}", ndir)
                ca, cb = np.frombuffer(rd(f"{bdir}/absmax.bin"), np.uint8), np.frombuffer(rd(f"{ndir}/absmax.bin"), np.uint8)
                r["nested_codes_with_bnb_offset_differ"] = int((ca != cb).sum())
                r["nested_absmax_with_bnb_offset_equal"] = rd(f"{bdir}/nested_absmax.bin") == rd(f"{ndir}/nested_absmax.bin")
                r["nested_codes_with_our_offset_differ"] = int((ca != np.frombuffer(rd(f"{odir}/absmax.bin"), np.uint8)).sum())
        # bnb's files through our loader, re-serialized and dequantized
        rdir = f"{d}/reload_{tag}"; os.makedirs(rdir, exist_ok=True)
        drv("load", bdir, rdir, *keys)
        r["reserialized_equal"] = {k: rd(f"{bdir}/{k}.bin") == rd(f"{rdir}/{k}.bin") for k in keys}
        ours_deq = np.fromfile(f"{rdir}/deq.f32", dtype=np.float32)
        if A.dtype == torch.float32:
            r["dequant_bitwise_equal"] = bool((deq.numpy().reshape(-1).view(np.uint32) == ours_deq.view(np.uint32)).all())
        elif A.dtype == torch.bfloat16:
            ob = np.fromfile(f"{rdir}/deq.bf16", dtype=np.uint16)
            r["dequant_bitwise_equal"] = bool((deq.reshape(-1).view(torch.int16).numpy().view(np.uint16) == ob).all())
        else:
            r["dequant_fp16_vs_ours_f32_max_abs"] = float(np.abs(deq.float().numpy().reshape(-1) - ours_deq).max())
        if nested:
            r["json"] = rd(f"{bdir}/quant_state.bitsandbytes__nf4.bin").decode()[:240]
        res[tag] = r
    # bnb's CPU path (default backend), for the record
    try:
        qwc, qsc = F.quantize_4bit(A, blocksize=64, compress_statistics=False, quant_type="nf4")
        qwg, qsg = F.quantize_4bit(A.cuda(), blocksize=64, compress_statistics=False, quant_type="nf4")
        res["bnb_cpu_vs_cuda_nibbles_differ"] = int((nibbles(qwc.numpy().tobytes()) != nibbles(qwg.cpu().numpy().tobytes())).sum())
    except Exception as e:  # noqa: BLE001
        res["bnb_cpu_vs_cuda"] = repr(e)[:200]
    res["seconds"] = round(time.time() - t0, 1)
    results[name] = res
    print(name, json.dumps(res)[:1500], flush=True)
report["cases"] = results
json.dump(report, open(f"{OUT}/report.json", "w"), indent=1)
print(json.dumps({k: v for k, v in report.items() if k != "cases"}, indent=1))
