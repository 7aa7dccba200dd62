"""The largest Llama-style model each optimizer option trains on this machine's GPUs, as `strata
plan` finds it (shard/capacity.h), confirmed by a run: issue #23's table. For each option
(adamw, adamw8bit, offload = "optimizer") it asks the live cluster's plan for the most layers of
one width, submits that model with the option, lets it train --steps steps, and records the run's
measured peak per rank next to the planner's estimate.

usage: STRATA_BIN_DIR=build/bin python3 bench/largest_model.py OUT.jsonl [--steps 20] [--smoke]
  --smoke: a tiny width on two CPU workers (checks the script, not the numbers)
Each line of OUT is one rank of one option's run: the option, layers, parameters, the plan, the
estimate (tensor bytes, without the workspace allowance) and the measured peak (CUDA: the
allocator's max allocated bytes), the host memory the plan counts for offload, and the run's
state (an OOM fails the run and says so). The cluster goes down on any exit.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import time

from memory_calibration import cli, wait  # the same `strata` calls (STRATA_BIN_DIR) and wait-then-cancel

# Llama 3 8B's width at sequence 1024; the layer count is what the planner varies.
WIDTH = dict(family="llama", hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, sequence=1024)
SMOKE_WIDTH = dict(family="llama", hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, sequence=32)


def spec_text(name, width, layers, data, precision, optimizer="adamw", offload="none", steps=1000):
    lines = [f'name = "{name}"', "[model]", f"layers = {layers}"] + [f"{k} = {json.dumps(v)}" for k, v in width.items()]
    lines += ["[data]", f'path = "{data}"', 'format = "u16"',
              "[train]", f"steps = {steps}", "global_batch = 8", "lr = 0.0003", "weight_decay = 0.1",
              f'precision = "{precision}"', f'optimizer = "{optimizer}"', "[parallel]", f'offload = "{offload}"',
              "[worker]", f"threads = {os.cpu_count() or 1}"]  # the model is drawn on the host: one thread takes minutes
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run, model building included")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--options", default="", help="comma-separated optimizers/offloads to run, e.g. adamw8bit,optimizer (default: all)")
    args = ap.parse_args()
    width = SMOKE_WIDTH if args.smoke else WIDTH
    work = tempfile.mkdtemp(prefix="strata-largest-")
    os.environ["STRATA_STATE_DIR"] = os.path.join(work, "state")
    data = os.path.join(work, "tokens.u16")
    with open(data, "wb") as f:  # random ids below the vocabulary: throughput and memory do not depend on the text
        import random
        rng = random.Random(0)
        f.write(bytes(b for _ in range(1 << 20) for b in rng.randrange(width["vocab"]).to_bytes(2, "little")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` takes the cluster down
    cli("up", *(["--workers", "1"] if args.smoke else ["--gpus", "1"]))
    try:
        time.sleep(2)  # the workers' first memory reports, which the plan reads
        precision = "fp32" if args.smoke else "bf16"
        probe = os.path.join(work, "probe.toml")
        with open(probe, "w") as f:
            f.write(spec_text("probe", width, 1, data, precision))
        plan = json.loads(cli("plan", probe, "--json").stdout)
        with open(args.out, "w") as out:
            for option in plan["largest_trainable"]:
                if option.get("lora"):
                    continue  # the fine-tuning rows (LoRA / QLoRA): bench/lora_bench.sh measures those
                if option["layers"] == 0:
                    print(json.dumps({"option": option["option"], "layers": 0, "why": option["plan"]}), flush=True)
                    continue
                wanted = [w for w in args.options.split(",") if w]
                if wanted and option["optimizer"] not in wanted and option["offload"] not in wanted:
                    continue
                path = os.path.join(work, f"{option['optimizer']}-{option['offload']}.toml")
                with open(path, "w") as f:
                    f.write(spec_text("largest", width, option["layers"], data, precision, option["optimizer"], option["offload"]))
                # The worker frees the last run's GPU memory when that run's task ends, a moment
                # after the cancel: until then the plan sees it taken.
                for _ in range(120):
                    planned = cli("plan", path, "--json", check=False)
                    if planned.returncode == 0:
                        break
                    time.sleep(1)
                estimate = json.loads(cli("plan", path, "--json").stdout)
                started = time.time()
                run_id = cli("submit", path).stdout.strip().splitlines()[0]
                s = wait(run_id, timeout=args.timeout, steps=args.steps)
                for rank, m in enumerate(s.get("memory", [])):
                    row = dict(option=option["option"], layers=option["layers"], parameters=option["parameters"], plan=option["plan"],
                               state=s["state"], steps=s["step"], message=s.get("message", ""),
                               estimate_bytes=m["estimate_bytes"], measured_peak_bytes=m["measured_peak_bytes"],
                               host_bytes=estimate["workers"][rank]["estimate"]["host"], seconds=round(time.time() - started, 1))
                    if m["measured_peak_bytes"]:
                        row["error"] = round(m["estimate_bytes"] / m["measured_peak_bytes"] - 1, 4)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row), flush=True)
        return 0
    finally:
        cli("down", check=False)


if __name__ == "__main__":
    sys.exit(main())
