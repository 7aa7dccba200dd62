#!/usr/bin/env python3
"""A 7B-shaped Llama 3.1 from init_from alone on one node (issue #18): load time, host memory per
worker, and the runs it must support.

What it does, on the GPU node (transformers and torch installed, N GPUs):
  1. make: a Llama 3.1 8B-shaped model (32 layers, hidden 4096, 32 heads, 8 kv heads, ffn 14336,
     vocab 128,256, rope_scaling llama3) with random bf16 weights, written by transformers'
     save_pretrained as several safetensors files with an index (as published), and random u32
     token ids below the vocabulary.
  2. transformers: from_pretrained(dir, dtype=bfloat16, device_map="auto") and one forward of one
     1024-token sequence, in a process of its own: seconds to loaded, to the first forward, peak RSS.
  3. strata extract: `strata up --gpus N`, an extract run of all 32 layers (resid_post, bf16)
     whose spec names only model.init_from (and the window); checks every layer was stored.
  4. strata train: a training run from init_from alone with the planner's mesh; seconds from
     submit to the first finished step, the plan, tokens/s.
During 3 and 4, every worker process's resident set (VmRSS) is sampled every 20 ms from /proc:
its peak, its idle baseline before the run, and the rank's share of the weights (bf16 bytes of
the model / the ways the plan splits them) are reported.

usage: STRATA_BIN_DIR=build/bin python3 bench/large_model_bench.py --work /tmp/strata-7b --gpus 4 --out OUT
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

BIN = os.environ.get("STRATA_BIN_DIR", "build/bin")

CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
    max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192),
    bos_token_id=128000, eos_token_id=128001, hidden_act="silu", attention_bias=False, mlp_bias=False)


def log(*a):
    print(*a, flush=True)


def make(work, tokens):
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    model_dir = f"{work}/llama3-8b-shaped"
    if not os.path.exists(f"{model_dir}/model.safetensors.index.json"):
        t0 = time.time()
        config = LlamaConfig(**CONFIG)
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
        model.save_pretrained(model_dir, max_shard_size="5GB")
        del model
        torch.cuda.empty_cache()
        log(f"made {model_dir} in {time.time() - t0:.1f} s")
    rng = np.random.default_rng(0)
    rng.integers(0, CONFIG["vocab_size"], size=tokens, dtype=np.uint32).tofile(f"{work}/tokens.u32")
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    size = sum(os.path.getsize(f"{model_dir}/{f}") for f in files)
    return model_dir, files, size


def transformers_load(model_dir):
    """Runs in its own process: from_pretrained + first forward; prints one JSON line."""
    import resource
    import torch
    from transformers import AutoModelForCausalLM
    t0 = time.time()
    method = "transformers from_pretrained(dtype=bfloat16, device_map='auto')"
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="auto")
    except (ImportError, ValueError) as e:  # device_map needs accelerate where transformers does not carry it
        method = f"transformers from_pretrained(dtype=bfloat16).to('cuda') (device_map: {str(e)[:120]})"
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda")
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    loaded = time.time() - t0
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 1024), device="cuda:0")
    with torch.no_grad():
        model(ids)
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    first = time.time() - t0
    print(json.dumps({"method": method, "loaded_s": round(loaded, 1),
                      "first_forward_s": round(first, 1),
                      "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}), flush=True)


class RssSampler:
    """Peak VmRSS of every strata-worker process, sampled from /proc."""

    def __init__(self):
        self.peak, self.baseline, self.stop = {}, {}, False
        self.thread = threading.Thread(target=self.loop, daemon=True)

    @staticmethod
    def workers():
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                if cmd and os.path.basename(cmd[0]) == b"strata-worker":
                    for line in open(f"/proc/{pid}/status"):
                        if line.startswith("VmRSS:"):
                            out[int(pid)] = int(line.split()[1]) * 1024
            except OSError:
                pass
        return out

    def start(self):
        self.baseline = self.workers()
        self.thread.start()
        return self

    def loop(self):
        while not self.stop:
            for pid, rss in self.workers().items():
                self.peak[pid] = max(self.peak.get(pid, 0), rss)
            time.sleep(0.02)

    def mark(self):
        """The peaks so far (e.g. up to the first step: the loading window)."""
        self.marked = dict(self.peak)

    def finish(self):
        self.stop = True
        self.thread.join()
        marked = getattr(self, "marked", {})
        return [{"pid": pid, "idle_gib": round(self.baseline.get(pid, 0) / 2**30, 2),
                 "peak_to_first_step_gib": round(marked.get(pid, 0) / 2**30, 2), "peak_gib": round(peak / 2**30, 2)}
                for pid, peak in sorted(self.peak.items())]


def strata(state, *args, check=True):
    r = subprocess.run([f"{BIN}/strata", *args], capture_output=True, text=True, env=dict(os.environ, STRATA_STATE_DIR=state))
    if check and r.returncode != 0:
        raise RuntimeError(f"strata {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def cluster_up(state, gpus):
    strata(state, "up", "--gpus", str(gpus))
    for _ in range(600):  # the planner needs every worker's free memory
        workers = json.loads(strata(state, "workers", "--json"))
        if len(workers) == gpus and all(w["memory"]["total_bytes"] > 0 for w in workers):
            return
        time.sleep(0.1)
    raise RuntimeError("workers did not report memory")


def run(state, spec_path, wait_first_step):
    sampler = RssSampler().start()
    t0 = time.time()
    run_id = strata(state, "submit", spec_path).splitlines()[0]
    first_step = None
    while True:
        s = json.loads(strata(state, "status", run_id, "--json"))
        if first_step is None and wait_first_step and s.get("step", 0) >= 1:
            first_step = time.time() - t0
            sampler.mark()
        if s["state"] not in ("pending", "running", "recovering"):
            break
        time.sleep(0.1)
    wall = time.time() - t0
    rss = sampler.finish()
    events = json.loads(strata(state, "events", run_id, "--json"))
    return run_id, s, wall, first_step, rss, events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/strata-7b")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--out", default=".")
    ap.add_argument("--train-steps", type=int, default=2)
    ap.add_argument("--transformers-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.transformers_only:
        transformers_load(f"{args.work}/llama3-8b-shaped")
        return
    os.makedirs(args.work, exist_ok=True)
    model_dir, files, size = make(args.work, tokens=1 << 23)
    results = {"model": {"dir": model_dir, "files": files, "bytes": size, "config": CONFIG}}
    log(f"model: {len(files)} files, {size / 2**30:.2f} GiB")

    r = subprocess.run([sys.executable, __file__, "--work", args.work, "--transformers-only"], capture_output=True, text=True)
    results["transformers"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-2000:]}
    log("transformers:", json.dumps(results["transformers"]))

    common = f'[model]\ninit_from = "{model_dir}"\nsequence = 1024\n[data]\npath = "{args.work}/tokens.u32"\nformat = "u32"\n'
    with open(f"{args.work}/extract.toml", "w") as f:
        f.write(f'name = "llama3-8b-extract"\nkind = "extract"\n{common}'
                f'[parallel]\ndp = {args.gpus}\n[extract]\nsites = ["resid_post"]\nprecision = "bf16"\ndtype = "bf16"\nbatch = 4\ntokens = {16 * 1024 * args.gpus}\n')
    with open(f"{args.work}/train.toml", "w") as f:
        f.write(f'name = "llama3-8b-train"\n{common}[train]\nsteps = {args.train_steps}\nglobal_batch = {4 * args.gpus}\n'
                f'lr = 0.00003\nprecision = "bf16"\ncheckpoint_every = 0\n')

    for kind in ("extract", "train"):
        state = f"{args.work}/state-{kind}"
        cluster_up(state, args.gpus)
        try:
            run_id, s, wall, first_step, rss, events = run(state, f"{args.work}/{kind}.toml", kind == "train")
            t_submit = next(e["unix_ms"] for e in events if e["kind"] == "submitted")
            res = {"run": run_id, "state": s["state"], "message": s.get("message", ""), "wall_s": round(wall, 1),
                   "workers_rss": rss, "events": [(e["kind"], round((e["unix_ms"] - t_submit) / 1000, 2), e["message"][:300]) for e in events],
                   "worker_log": [line.strip() for n in range(args.gpus) if os.path.exists(f"{state}/logs/worker-{n}.log")
                                  for line in open(f"{state}/logs/worker-{n}.log")
                                  if "placed its part" in line or "extract plan" in line]}
            if kind == "train":
                plan = s.get("plan") or {}
                ways = plan.get("pp", 1) * plan.get("tp", 1) * (plan.get("dp", 1) if plan.get("zero", 0) == 3 else 1)
                res.update(plan=plan, first_step_s=round(first_step, 1) if first_step else None,
                           tokens_per_s=round(s.get("tokens_per_second", 0)), rank_share_gib=round(size / ways / 2**30, 2),
                           memory=s.get("memory"))
            else:
                index = json.loads(strata(state, "activations", run_id, "--json"))
                res.update(activations=index, rank_share_gib=round(size / 2**30, 2))
            results[kind] = res
            log(kind + ":", json.dumps({k: v for k, v in res.items() if k not in ("events", "activations", "worker_log")}))
            for k, at, m in res["events"]:
                log(f"  {at:7.2f} s {k}: {m}")
            for line in res["worker_log"]:
                log("  log:", line)
        finally:
            strata(state, "down", check=False)
    with open(f"{args.out}/large_model_bench.json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
