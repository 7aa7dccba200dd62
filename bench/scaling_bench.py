#!/usr/bin/env python3
"""Scaling over the GPUs of one host (issue #7): tokens/s of a model on 1, 2, 4, 8 GPUs with the
planner's automatic plan and with fixed meshes, through the real path (strata up --gpus N,
submit, NCCL between worker processes). Weak scaling: 8 sequences of 1024 tokens per GPU per
step, bf16, AdamW. tokens/s is the median of the steps after the third (warm-up and the CUDA
graph's capture). Efficiency = tokens/s on N GPUs / (N x the 1-GPU figure of the same mesh kind,
or of the 1-GPU auto plan).

Models: gpt2 = GPT-2 124M; llama1b = a Llama-style model of 886.1M parameters (16 layers, hidden
2048, 16 heads, 8 kv heads, ffn 5632, vocab 32000; issue #19 calls it 1.1B).

usage: STRATA_BIN_DIR=build/bin python3 bench/scaling_bench.py --model gpt2 --gpus 1,2,4 \
           --meshes auto,dp,pp,tp [--steps 12]
meshes: auto (the planner's plan), dp (dp = N, ZeRO-1), z0 / z2 / z3 (dp = N at that ZeRO stage;
z3's keep_gathered left to the planner), z3again (ZeRO-3, keep_gathered = 0),
pp (dp = N/2 x pp = 2), tp (dp = N/2 x tp = 2).
"""
import argparse
import array
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

BIN = os.environ["STRATA_BIN_DIR"]
MODELS = {
    "gpt2": ('family = "gpt2"\nlayers = 12\nhidden = 768\nheads = 12\nvocab = 50257\nsequence = 1024\n', 50257),
    "llama1b": ('family = "llama"\nlayers = 16\nhidden = 2048\nheads = 16\nkv_heads = 8\nffn = 5632\nvocab = 32000\nsequence = 1024\n', 32000),
}


def strata(state, *args, check=True):
    r = subprocess.run([f"{BIN}/strata", *args], capture_output=True, text=True, env=dict(os.environ, STRATA_STATE_DIR=state))
    if check and r.returncode != 0:
        raise RuntimeError(f"strata {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def parallel(mesh, n):
    if mesh == "auto":
        return ""
    if mesh == "dp":
        return f"dp = {n}\npp = 1\ntp = 1\nzero = {1 if n > 1 else 0}\nrecompute = false\nmicro_batch = 8\n"
    if mesh in ("z0", "z2", "z3"):  # dp = N at ZeRO stage 0, 2 or 3 (ZeRO-3: keep_gathered left to the planner)
        return f"dp = {n}\npp = 1\ntp = 1\nzero = {mesh[1]}\nrecompute = false\nmicro_batch = 8\n"
    if mesh == "z3again":  # ZeRO-3 with every layer gathered again for its backward (keep_gathered = 0)
        return f"dp = {n}\npp = 1\ntp = 1\nzero = 3\nrecompute = false\nmicro_batch = 8\nkeep_gathered = 0\n"
    if mesh == "pp":  # 2 stages, the rest data parallel; 4 micro-batches of 8 per replica... per stage pair
        return f"dp = {n // 2}\npp = 2\ntp = 1\nzero = {1 if n > 2 else 0}\nrecompute = false\nmicro_batch = 4\n"
    if mesh == "tp":
        return f"dp = {n // 2}\npp = 1\ntp = 2\nzero = {1 if n > 2 else 0}\nrecompute = false\nmicro_batch = 8\n"
    raise ValueError(mesh)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=MODELS)
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--meshes", default="auto,dp,pp,tp")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    body, vocab = MODELS[args.model]
    work = tempfile.mkdtemp(prefix="strata-scaling-")
    results = []
    try:
        raw = array.array("H", os.urandom(2 * (16 << 20)))
        array.array("H", (t % vocab for t in raw)).tofile(open(f"{work}/tokens.u16", "wb"))
        for n in [int(x) for x in args.gpus.split(",")]:
            state = f"{work}/state-{n}"
            strata(state, "up", "--gpus", str(n))
            # The planner needs every worker's free memory: wait for their first memory reports.
            for _ in range(300):
                workers = json.loads(strata(state, "workers", "--json"))
                if len(workers) == n and all(w["memory"]["total_bytes"] > 0 for w in workers):
                    break
                time.sleep(0.1)
            try:
                for mesh in args.meshes.split(","):
                    if mesh in ("pp", "tp", "z2") and n < 2:  # z3 on one GPU: the gathering path's own cost and memory
                        continue
                    name = f"{args.model}-{mesh}-{n}"
                    with open(f"{work}/{name}.toml", "w") as f:
                        f.write(f'name = "{name}"\n[model]\n{body}[data]\npath = "{work}/tokens.u16"\nformat = "u16"\n'
                                f'[train]\nsteps = {args.steps}\nglobal_batch = {8 * n}\nlr = 0.0003\nweight_decay = 0.1\n'
                                f'precision = "bf16"\ncheckpoint_every = 0\n[parallel]\n{parallel(mesh, n)}')
                    started = time.time()
                    r = subprocess.run([f"{BIN}/strata", "submit", f"{work}/{name}.toml", "--follow"], capture_output=True,
                                       text=True, env=dict(os.environ, STRATA_STATE_DIR=state))
                    run = r.stdout.splitlines()[0] if r.stdout else ""
                    s = json.loads(strata(state, "status", run, "--json")) if run else {"state": "not submitted"}
                    # The median of the steps after the third (warm-up and the CUDA graph's capture);
                    # the last step's alone where there are none.
                    metrics = [json.loads(l) for l in strata(state, "metrics", run, check=False).splitlines() if l.strip()] if run else []
                    rates = [m["tokens_per_second"] for m in metrics[3:] if m.get("tokens_per_second", 0) > 0]
                    res = {"model": args.model, "gpus": n, "mesh": mesh, "state": s.get("state"), "plan": s.get("plan"),
                           "tokens_per_s": round(statistics.median(rates) if rates else s.get("tokens_per_second", 0)),
                           "steps_in_median": len(rates),
                           "wall_s": round(time.time() - started, 1),
                           "peak_gib": [round(m["measured_peak_bytes"] / 2**30, 2) for m in s.get("memory", [])],
                           "estimate_gib": [round(m["estimate_bytes"] / 2**30, 2) for m in s.get("memory", [])]}
                    if s.get("state") != "finished":
                        res["message"] = s.get("message") or r.stderr[-300:]
                    results.append(res)
                    print(json.dumps(res), flush=True)
            finally:
                strata(state, "down", check=False)
        base = {r["mesh"]: r["tokens_per_s"] for r in results if r["gpus"] == 1 and r["tokens_per_s"]}
        one = base.get("auto") or base.get("dp")
        print(f"\n| model | GPUs | mesh | plan | tokens/s | efficiency vs 1 GPU | peak GiB (estimate) |\n|---|---|---|---|---|---|---|")
        for r in results:
            p = r["plan"] or {}
            plan = f"dp{p.get('dp')} pp{p.get('pp')} tp{p.get('tp')} z{p.get('zero')} mb{p.get('micro_batch')}x{p.get('gradient_accumulation')}" + (" rc" if p.get("recompute") else "")
            eff = f"{100 * r['tokens_per_s'] / (r['gpus'] * one):.1f}%" if one and r["tokens_per_s"] else "-"
            mem = ", ".join(f"{a} ({b})" for a, b in zip(r["peak_gib"], r["estimate_gib"]))
            print(f"| {r['model']} | {r['gpus']} | {r['mesh']} | {plan} | {r['tokens_per_s']} | {eff} | {mem} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
