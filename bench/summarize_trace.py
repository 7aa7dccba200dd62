"""Groups the GPU kernels of a chrome trace (Kineto: bench/train_step_bench --profile, or
torch.profiler's export_chrome_trace) into what they do, so two implementations compare by
where their GPU time goes.

usage: python3 summarize_trace.py TRACE.json [LABEL]
"""
import collections
import json
import sys

GROUPS = [  # first match wins
    ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas", "ampere_", "sm80_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("softmax / loss", ("softmax", "nll", "cross_entropy", "log_softmax")),
    ("norm", ("layer_norm", "layernorm", "rms", "norm_")),
    ("nccl", ("nccl",)),
    ("copy / cast", ("copy", "memcpy", "memset", "cast", "convert")),
    ("fused (compiled)", ("triton",)),
]


def group(name):
    lower = name.lower()
    for label, keys in GROUPS:
        if any(k in lower for k in keys):
            return label
    return "other elementwise / reduce"


trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
kernels = [e for e in events if e.get("cat") in ("kernel", "Kernel") and "dur" in e]
total = sum(e["dur"] for e in kernels)
by_group = collections.Counter()
by_name = collections.Counter()
count = collections.Counter()
for e in kernels:
    by_group[group(e["name"])] += e["dur"]
    by_name[e["name"][:150]] += e["dur"]
    count[group(e["name"])] += 1
start = min(e["ts"] for e in kernels)
end = max(e["ts"] + e["dur"] for e in kernels)
label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
print(f"== {label}: {len(kernels)} kernels, {total / 1e3:.1f} ms of GPU time in a {(end - start) / 1e3:.1f} ms window "
      f"({100 * total / (end - start):.0f}% busy)")
for name, dur in by_group.most_common():
    print(f"  {name:28s} {dur / 1e3:8.1f} ms  {100 * dur / total:5.1f}%  ({count[name]} kernels)")
print("  top kernels:")
for name, dur in by_name.most_common(8):
    print(f"    {dur / 1e3:7.1f} ms  {name}")
# The largest kernels of the unfused groups: where the next fusion would pay.
for label in ("other elementwise / reduce", "copy / cast"):
    named = collections.Counter({n: d for n, d in by_name.items() if group(n) == label})
    if named:
        print(f"  top {label}:")
        for name, dur in named.most_common(6):
            print(f"    {dur / 1e3:7.1f} ms  {name}")
