"""Where a step's compute stream waits, from a chrome trace (Kineto: STRATA_PROFILE_DIR).

summarize_trace.py adds kernel time up by kind; this looks at the timeline instead, which is what
an overlap changes:
  - the compute (every kernel but the collectives, on any stream: a replayed CUDA graph spreads its
    kernels over streams of its own): its busy share of the window, and its gaps, largest first,
    with the kernels on each side and the collectives that ran in them;
  - the collectives (NCCL kernels): their time, and how much of it had no compute beside it
    (exposed);
  - matmul kernels that ran beside a collective against the same kernels alone: what sharing the
    SMs and memory with NCCL costs the compute.

usage: python3 trace_timeline.py TRACE.json [LABEL] [--gaps N]
"""
import bisect
import collections
import json
import sys


def load_kernels(path):
    trace = json.load(open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = []
    for e in events:
        if e.get("cat") not in ("kernel", "Kernel") or "dur" not in e:
            continue
        stream = (e.get("args") or {}).get("stream", e.get("tid"))
        kernels.append((float(e["ts"]), float(e["dur"]), e["name"], stream))
    kernels.sort()
    return kernels


def merged_intervals(spans):
    """Union of (start, end) spans, sorted and disjoint."""
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap_with(intervals, starts, s, e):
    """How much of [s, e) the disjoint sorted `intervals` cover."""
    i = max(0, bisect.bisect_right(starts, s) - 1)
    total = 0.0
    while i < len(intervals) and intervals[i][0] < e:
        total += max(0.0, min(e, intervals[i][1]) - max(s, intervals[i][0]))
        i += 1
    return total


def is_matmul(name):
    lower = name.lower()
    return any(k in lower for k in ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas"))


def short(name, n=70):
    return name if len(name) <= n else name[: n - 3] + "..."


def is_collective(name):
    return "nccl" in name.lower()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    gaps_shown = 15
    if "--gaps" in sys.argv:
        gaps_shown = int(sys.argv[sys.argv.index("--gaps") + 1])
        args = [a for a in args if a != str(gaps_shown)]
    path = args[0]
    label = args[1] if len(args) > 1 else path
    kernels = load_kernels(path)
    if not kernels:
        print(f"== {label}: no kernels in the trace")
        return
    # A replayed CUDA graph runs its kernels on streams of its own, so the compute is every
    # kernel that is not a collective, on whatever stream.
    compute_kernels = [k for k in kernels if not is_collective(k[2])]
    comm_kernels = [k for k in kernels if is_collective(k[2])]
    start = kernels[0][0]
    end = max(k[0] + k[1] for k in kernels)
    window = end - start
    compute_busy = merged_intervals((k[0], k[0] + k[1]) for k in compute_kernels)
    busy_starts = [iv[0] for iv in compute_busy]
    compute_time = sum(e - s for s, e in compute_busy)
    comm = merged_intervals((k[0], k[0] + k[1]) for k in comm_kernels)
    comm_time = sum(e - s for s, e in comm)
    comm_beside = sum(overlap_with(compute_busy, busy_starts, b, e) for b, e in comm)
    print(f"== {label}: {window / 1e3:.2f} ms window; compute kernels {compute_time / 1e3:.2f} ms "
          f"({100 * compute_time / window:.1f}%); collectives {comm_time / 1e3:.2f} ms, {(comm_time - comm_beside) / 1e3:.2f} ms "
          f"of it with no compute beside (exposed); device idle {(window - compute_time - comm_time + comm_beside) / 1e3:.2f} ms")
    names = collections.Counter()
    exposed_by_name = collections.Counter()
    for k in comm_kernels:
        names[short(k[2], 50)] += k[1]
        exposed_by_name[short(k[2], 50)] += k[1] - overlap_with(compute_busy, busy_starts, k[0], k[0] + k[1])
    for n, d in names.most_common(6):
        print(f"  {n:50s} {d / 1e3:7.2f} ms, exposed {exposed_by_name[n] / 1e3:6.2f} ms")

    # Gaps in the compute, largest first, with what ran then.
    gaps = []
    for i in range(1, len(compute_busy)):
        g0, g1 = compute_busy[i - 1][1], compute_busy[i][0]
        if g1 - g0 > 5.0:
            gaps.append((g1 - g0, g0, g1))
    gaps.sort(reverse=True)
    sizes = [g[0] for g in gaps]
    buckets = [(5, 20), (20, 100), (100, 1000), (1000, float("inf"))]
    print("  compute gaps: " + ", ".join(
        f"{lo:g}-{hi:g} us: {sum(1 for x in sizes if lo <= x < hi)} ({sum(x for x in sizes if lo <= x < hi) / 1e3:.2f} ms)"
        for lo, hi in buckets))
    ends = [k[0] + k[1] for k in compute_kernels]
    starts = [k[0] for k in compute_kernels]
    for size, g0, g1 in gaps[:gaps_shown]:
        before = compute_kernels[max(0, bisect.bisect_right(ends, g0 + 1e-3) - 1)][2]
        after = compute_kernels[min(len(compute_kernels) - 1, bisect.bisect_left(starts, g1 - 1e-3))][2]
        during = collections.Counter()
        for k in comm_kernels:
            o = max(0.0, min(g1, k[0] + k[1]) - max(g0, k[0]))
            if o > 0:
                during[short(k[2], 40)] += o
        what = ", ".join(f"{n} {d:.0f} us" for n, d in during.most_common(2)) or "device idle"
        print(f"    {size:8.1f} us at +{(g0 - start) / 1e3:7.2f} ms  after {short(before, 40)}  before {short(after, 40)}  [{what}]")

    # Matmuls beside a collective against the same kernels alone.
    comm_starts = [iv[0] for iv in comm]
    alone, beside = collections.defaultdict(list), collections.defaultdict(list)
    for k in compute_kernels:
        if not is_matmul(k[2]):
            continue
        covered = overlap_with(comm, comm_starts, k[0], k[0] + k[1])
        (beside if covered > 0.5 * k[1] else alone)[k[2]].append(k[1])
    rows = []
    for name in set(alone) & set(beside):
        a = sum(alone[name]) / len(alone[name])
        b = sum(beside[name]) / len(beside[name])
        rows.append((sum(beside[name]) - a * len(beside[name]), name, a, b, len(alone[name]), len(beside[name])))
    rows.sort(reverse=True)
    if rows:
        print(f"  matmuls beside a collective: {sum(r[0] for r in rows) / 1e3:.2f} ms more than the same kernels alone")
        for cost, name, a, b, na, nb in rows[:6]:
            print(f"    {cost / 1e3:6.2f} ms  alone {a:7.1f} us (x{na})  beside {b:7.1f} us (x{nb})  {short(name, 60)}")


if __name__ == "__main__":
    main()
