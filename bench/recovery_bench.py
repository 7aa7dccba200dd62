#!/usr/bin/env python3
"""Losing a GPU mid-run: kill -9 one of 2 GPU workers of a dp=2 run and measure how long the
coordinator takes to notice (kill -> "worker-lost" event) and to train again (kill -> the first
step past the checkpoint it resumed from), and check that the losses match a fault-free run.

GPT-2 124M (or RECOVERY_MODEL=llama1b: a Llama-style 1.1B), sequence 1024, bf16, global batch
16, a checkpoint every 20 steps. The cluster uses
`--heartbeat-timeout-ms 1000` and `--replace-grace-ms 0` (no replacement is coming: re-plan at
once onto the survivor, dp 2 -> 1 with the same global batch).

usage: STRATA_BIN_DIR=build/bin python3 bench/recovery_bench.py [STEPS]
"""
import array
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ["STRATA_BIN_DIR"]
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 120


def strata(state, *args, check=True):
    r = subprocess.run([f"{BIN}/strata", *args], capture_output=True, text=True,
                       env=dict(os.environ, STRATA_STATE_DIR=state))
    if check and r.returncode != 0:
        raise RuntimeError(f"strata {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def main():
    work = tempfile.mkdtemp(prefix="strata-recovery-")
    state = f"{work}/state"
    cpu = os.environ.get("STRATA_BENCH_CPU") == "1"  # a smoke run of this script on CPU workers, tiny model
    llama = os.environ.get("RECOVERY_MODEL") == "llama1b"  # the ~1B target of issue #5
    vocab = 256 if cpu else 32000 if llama else 50257
    raw = array.array("H", os.urandom(2 * (8 << 20)))
    array.array("H", (t % vocab for t in raw)).tofile(open(f"{work}/tokens.u16", "wb"))
    model = ("layers = 2\nhidden = 64\nheads = 4\nsequence = 64\n" if cpu else
             "layers = 16\nhidden = 2048\nheads = 16\nkv_heads = 8\nffn = 5632\nsequence = 1024\n" if llama else
             "layers = 12\nhidden = 768\nheads = 12\nsequence = 1024\n")
    spec = (f'[model]\nfamily = "{"llama" if llama else "gpt2"}"\n{model}vocab = {vocab}\n'
            f'[data]\npath = "{work}/tokens.u16"\nformat = "u16"\n'
            f'[train]\nsteps = {STEPS}\nglobal_batch = 16\nlr = 0.0003\nprecision = "{"fp32" if cpu else "bf16"}"\ncheckpoint_every = 20\n'
            f'[parallel]\ndp = 2\n')
    try:
        strata(state, "up", *(["--workers", "2"] if cpu else ["--gpus", "2"]), "--heartbeat-timeout-ms", "1000",
               "--replace-grace-ms", "0")
        for name in ("clean", "crash"):
            with open(f"{work}/{name}.toml", "w") as f:
                f.write(f'name = "{name}"\n' + spec)
        clean = strata(state, "submit", f"{work}/clean.toml", "--follow").splitlines()[0]
        print(f"fault-free run {clean} finished", file=sys.stderr, flush=True)
        run = strata(state, "submit", f"{work}/crash.toml").splitlines()[0]
        while True:
            s = json.loads(strata(state, "status", run, "--json"))
            if s["step"] >= 50:
                break
            time.sleep(0.05)
        victim = s["workers"][1]
        cluster = json.load(open(f"{state}/cluster.json"))
        pid = next(p["pid"] for p in cluster["processes"] if p["name"] == victim)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        # Poll for the first step past the checkpoint the run resumed from: the step drops back to
        # that checkpoint when the run recovers (grace 0 can make "pending" too short to see),
        # then grows again once the re-planned mesh trains.
        print(f"killed {victim} (pid {pid}) at step {s['step']}", file=sys.stderr, flush=True)
        resumed_step, trained_again, deadline = None, None, time.time() + 90
        while trained_again is None:
            if time.time() > deadline:
                logs = ""
                for name in sorted(os.listdir(f"{state}/logs")):
                    with open(f"{state}/logs/{name}") as f:
                        logs += f"== {name}\n" + "".join(f.readlines()[-12:])
                raise RuntimeError(f"run {run} did not train again within 90 s of the kill:\n" + strata(state, "events", run) + logs)
            s = json.loads(strata(state, "status", run, "--json"))
            if s["state"] in ("failed", "cancelled"):
                raise RuntimeError(f"run {run} {s['state']}: {s['message']}")
            if s["world_size"] == 1 and (resumed_step is None or s["step"] < resumed_step):
                resumed_step = s["step"]
            if resumed_step is not None and s["step"] > resumed_step:
                trained_again = time.time()
            time.sleep(0.02)
        strata(state, "status", run, "--watch")
        events = json.loads(strata(state, "events", run, "--json"))
        lost = next(e["unix_ms"] for e in events if e["kind"] == "worker-lost") / 1000.0
        a = json.loads(strata(state, "status", clean, "--json"))["losses"]
        b = json.loads(strata(state, "status", run, "--json"))
        worst = max(abs(x - y) / x for x, y in zip(a, b["losses"]))
        print(json.dumps({"detect_s": round(lost - killed_at, 2), "train_again_s": round(trained_again - killed_at, 2),
                          "resumed_from_step": resumed_step, "final_state": b["state"], "world_size_after": b["world_size"],
                          "steps": len(b["losses"]), "max_rel_loss_diff_vs_fault_free": worst}))
        for e in events:
            if e["unix_ms"] / 1000.0 - killed_at > -3 and e["kind"] != "step":
                print(f"  {e['unix_ms'] / 1000.0 - killed_at:+7.2f} s  {e['kind']}: {e['message'][:140]}")
    finally:
        strata(state, "down", check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
