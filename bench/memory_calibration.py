"""Measures peak memory per rank over a grid of models and plans, through the real path
(strata up, submit, workers reporting their allocator peaks), next to the planner's estimate the
coordinator recorded for each rank. The rows feed the estimator's constants (shard/estimator.cc)
and the calibration table in docs/benchmarks.md.

usage: STRATA_BIN_DIR=build/bin python3 bench/memory_calibration.py OUT.jsonl [--grid one|two|smoke] [--fresh]
  one:   every model x micro-batch {1, 2, 4, 8} x recompute {off, on} on 1 GPU
  two:   every model x {dp=2 ZeRO 0-3, pp=2, tp=2} x micro-batch 2 x recompute {off, on}
         (--mesh dp2-zero3: that mesh's runs only)
  smoke: a tiny model on CPU workers (checks the script)
Runs go as many at once as there are workers for them. --fresh: a new cluster (`strata down`,
`strata up`) for every batch of runs, so no run's peak holds what a worker process kept from an
earlier one (the one-GPU grid of 2026-11-28 drifted about 48 MiB a run without it).
The cluster is taken down on any exit, a timeout's SIGTERM included: a cluster left running its
last run would slow whatever the GPU runs next.
Each line of OUT is one rank of one run: the plan, the estimate (tensor bytes, without the
workspace allowance), the measured peak (CUDA: max allocated bytes over the run's steps) and the
run's state (an OOM fails the run and says so).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MODELS = {
    "gpt2-124m": dict(family="gpt2", layers=12, hidden=768, heads=12, vocab=50257, sequence=1024),
    "gpt2-355m": dict(family="gpt2", layers=24, hidden=1024, heads=16, vocab=50257, sequence=1024),
    "gpt2-774m": dict(family="gpt2", layers=36, hidden=1280, heads=20, vocab=50257, sequence=1024),
    "llama-886m": dict(family="llama", layers=16, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32000, sequence=1024),
    # Llama 3 8B's width (bench/largest_model.py's), 4 and 8 layers: their difference is one layer's share.
    "llama-4096x4": dict(family="llama", layers=4, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, sequence=1024),
    "llama-4096x8": dict(family="llama", layers=8, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, sequence=1024),
    "tiny": dict(family="gpt2", layers=2, hidden=64, heads=4, vocab=256, sequence=32),
}

bin_dir = os.environ["STRATA_BIN_DIR"]
THREADS = max(1, (os.cpu_count() or 2) // 4)
MODEL_FILTER, MICRO_BATCHES, MESH_FILTER = [], [1, 2, 4, 8], ""
strata = os.path.join(bin_dir, "strata")


def cli(*args, check=True):
    out = subprocess.run([strata, *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"strata {' '.join(args)}: {out.stderr.strip()}")
    return out


def spec_text(name, model, parallel, data, precision, steps=1000):
    m = MODELS[model]
    lines = [f'name = "{name}"', "[model]"] + [f"{k} = {json.dumps(v)}" for k, v in m.items()]
    lines += ["[data]", f'path = "{data}"', 'format = "u16"',
              "[train]", f"steps = {steps}", f"global_batch = {parallel['global_batch']}", "lr = 0.0003",
              "weight_decay = 0.1", f'precision = "{precision}"', "[parallel]"]
    fixed = dict(dp=1, pp=1, tp=1, zero=0, recompute=False)  # every field fixed: nothing left to the planner
    fixed.update({k: v for k, v in parallel.items() if k != "global_batch"})
    lines += [f"{k} = {json.dumps(v)}" for k, v in fixed.items()]
    lines += ["[worker]", f"threads = {THREADS}"]  # host-side model init is slow on one thread
    return "\n".join(lines) + "\n"


def grid(kind):
    if kind == "smoke":
        for mb in (1, 2):
            yield "tiny", dict(global_batch=4, dp=1, micro_batch=mb, recompute=False)
        yield "tiny", dict(global_batch=4, dp=2, zero=1, micro_batch=1, recompute=False)
        return
    models = MODEL_FILTER or [m for m in MODELS if m != "tiny"]
    if kind == "one":
        for model in models:
            for mb in MICRO_BATCHES:
                for rc in (False, True):
                    yield model, dict(global_batch=8, dp=1, micro_batch=mb, recompute=rc)
        return
    for model in models:
        for mb in (2,):
            for rc in (False, True):
                for zero in (0, 1, 2, 3):
                    if MESH_FILTER in ("", f"dp2-zero{zero}"):
                        yield model, dict(global_batch=8, dp=2, zero=zero, micro_batch=mb, recompute=rc)
                if MESH_FILTER in ("", "pp2"):
                    yield model, dict(global_batch=8, pp=2, micro_batch=mb, recompute=rc)
                if MESH_FILTER in ("", "tp2"):
                    yield model, dict(global_batch=8, tp=2, micro_batch=mb, recompute=rc)


def wait(run_id, timeout=600, steps=3):
    """Until the run has done `steps` steps (then cancels it: a run's last step writes a
    checkpoint, which only costs time here) or has ended."""
    start = time.time()
    while time.time() - start < timeout:
        s = json.loads(cli("status", run_id, "--json").stdout)
        if s["state"] in ("failed", "cancelled"):
            return s
        if s["step"] >= steps:
            cli("cancel", run_id, check=False)
            time.sleep(1)  # the cancel persists the record with the ranks' peaks
            return json.loads(cli("status", run_id, "--json").stdout)
        time.sleep(0.5)
    cli("cancel", run_id, check=False)
    return json.loads(cli("status", run_id, "--json").stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--grid", default="one", choices=["one", "two", "smoke"])
    ap.add_argument("--models", default="", help="comma-separated subset of " + ", ".join(MODELS))
    ap.add_argument("--micro-batches", default="1,2,4,8")
    ap.add_argument("--mesh", default="", choices=["", "dp2-zero0", "dp2-zero1", "dp2-zero2", "dp2-zero3", "pp2", "tp2"],
                    help="the two-GPU grid's runs of one mesh only")
    ap.add_argument("--fresh", action="store_true", help="a new cluster for every batch of runs")
    args = ap.parse_args()
    global MODEL_FILTER, MICRO_BATCHES, MESH_FILTER
    MESH_FILTER = args.mesh
    MODEL_FILTER = [m for m in args.models.split(",") if m]
    MICRO_BATCHES = [int(b) for b in args.micro_batches.split(",")]
    gpus = int(subprocess.run("nvidia-smi -L 2>/dev/null | grep -c '^GPU '", shell=True, capture_output=True, text=True).stdout or 0)
    work = tempfile.mkdtemp(prefix="strata-calibration-")
    os.environ["STRATA_STATE_DIR"] = os.path.join(work, "state")
    data = os.path.join(work, "tokens.u16")
    with open(data, "wb") as f:  # random tokens below every model's vocab
        import random
        rng = random.Random(0)
        f.write(bytes(b for _ in range(1 << 20) for b in rng.randrange(256).to_bytes(2, "little")))
    workers = max(gpus, 2)
    up_args = ["--gpus", str(gpus)] if gpus else ["--workers", "2"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` takes the cluster down
    cli("up", *up_args)
    try:
        return run_grid(args, points_of=grid(args.grid), workers=workers, data=data, work=work,
                        precision="bf16" if gpus else "fp32", up_args=up_args)
    finally:
        cli("down", check=False)


def run_grid(args, points_of, workers, data, work, precision, up_args):
    points = list(points_of)
    # As many runs at once as there are workers for.
    batch = []
    with open(args.out, "w") as out:
        def flush(more_to_come=True):
            for run_id, model, parallel, started in batch:
                s = wait(run_id)
                for rank, m in enumerate(s.get("memory", [])):
                    row = dict(model=model, **parallel, precision=precision, rank=rank, state=s["state"], steps=s["step"],
                               message=s.get("message", ""), estimate_bytes=m["estimate_bytes"],
                               workspace_bytes=m["workspace_bytes"], measured_peak_bytes=m["measured_peak_bytes"],
                               seconds=round(time.time() - started, 1))
                    if m["measured_peak_bytes"]:
                        row["error"] = round(m["estimate_bytes"] / m["measured_peak_bytes"] - 1, 4)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row), flush=True)
            batch.clear()
            if args.fresh and more_to_come:  # the next batch on new worker processes
                cli("down", check=False)
                cli("up", *up_args)
        busy = 0
        for i, (model, parallel) in enumerate(points):
            path = os.path.join(work, f"p{i}.toml")
            with open(path, "w") as f:
                f.write(spec_text(f"cal{i}", model, parallel, data, precision))
            ranks = parallel.get("dp", 1) * parallel.get("pp", 1) * parallel.get("tp", 1)
            if busy + ranks > workers:
                flush()
                busy = 0
            run_id = cli("submit", path).stdout.strip().splitlines()[0]
            batch.append((run_id, model, parallel, time.time()))
            busy += ranks
        flush(more_to_come=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
