#!/usr/bin/env python3
"""Losing a GPU mid-run: kill -9 one of 2 GPU workers of a dp=2 run and measure how long the
coordinator takes to notice (kill -> "worker-lost" event) and to train again (kill -> the first
step past the checkpoint it resumed from), and check that the losses match a fault-free run.

GPT-2 124M (or RECOVERY_MODEL=llama1b: a Llama-style 1.1B), sequence 1024, bf16, global batch
16, a checkpoint every 20 steps. The cluster uses
`--heartbeat-timeout-ms 1000` and `--replace-grace-ms 0` (no replacement is coming: re-plan at
once onto the survivor, dp 2 -> 1 with the same global batch).

RECOVERY_FAULT=hang: instead of the kill, rank 1 stops before step RECOVERY_KILL_STEP + 1 while its heartbeats go on
(`strata up --inject-fault hang:STEP:1`), so only the hang watchdog can notice: `--peer-timeout-ms`
RECOVERY_PEER_TIMEOUT_MS (default 5000) on the workers; on GPU the NCCL watchdog fires and the
coordinator names the rank that reported no stall of its own. Detect = hang -> "stalled" event.

RECOVERY_KILL_STEP (default 50) and RECOVERY_CHECKPOINT_EVERY (default 20) move the fault.

RECOVERY_LOGS=DIR: the cluster's logs and the run's events are copied there at the end, whatever
happened.

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
    hang = os.environ.get("RECOVERY_FAULT") == "hang"
    logs_to = os.environ.get("RECOVERY_LOGS")
    run = None
    kill_step = int(os.environ.get("RECOVERY_KILL_STEP", "50"))
    every = int(os.environ.get("RECOVERY_CHECKPOINT_EVERY", "20"))
    vocab = 256 if cpu else 32000 if llama else 50257
    raw = array.array("H", os.urandom(2 * (8 << 20)))
    array.array("H", (t % vocab for t in raw)).tofile(open(f"{work}/tokens.u16", "wb"))
    model = ("layers = 2\nhidden = 64\nheads = 4\nsequence = 64\n" if cpu else
             "layers = 16\nhidden = 2048\nheads = 16\nkv_heads = 8\nffn = 5632\nsequence = 1024\n" if llama else
             "layers = 12\nhidden = 768\nheads = 12\nsequence = 1024\n")
    spec = (f'[model]\nfamily = "{"llama" if llama else "gpt2"}"\n{model}vocab = {vocab}\n'
            f'[data]\npath = "{work}/tokens.u16"\nformat = "u16"\n'
            f'[train]\nsteps = {STEPS}\nglobal_batch = 16\nlr = 0.0003\nprecision = "{"fp32" if cpu else "bf16"}"\ncheckpoint_every = {every}\n'
            f'[parallel]\ndp = 2\n')
    try:
        up_env = dict(os.environ, STRATA_STATE_DIR=state)
        hang_args = []
        if hang:
            hang_args = ["--peer-timeout-ms", os.environ.get("RECOVERY_PEER_TIMEOUT_MS", "5000"),
                         "--inject-fault", f"hang:{kill_step + 1}:1"]
        subprocess.run([f"{BIN}/strata", "up", *(["--workers", "2"] if cpu else ["--gpus", "2"]), "--heartbeat-timeout-ms",
                        "1000", "--replace-grace-ms", "0", *hang_args], env=up_env, check=True)
        # A fault-free run must not meet the hang: it then runs on rank 0 alone (same global batch).
        # The fault-free run needs no checkpoint but its last (a ~1B model's is 12 GB of disk).
        clean_spec = spec.replace(f"checkpoint_every = {every}", f"checkpoint_every = {STEPS}")
        for name, body in (("clean", clean_spec.replace("dp = 2", "dp = 1\npp = 1\ntp = 1") if hang else clean_spec), ("crash", spec)):
            with open(f"{work}/{name}.toml", "w") as f:
                f.write(f'name = "{name}"\n' + body)
        clean = strata(state, "submit", f"{work}/clean.toml", "--follow").splitlines()[0]
        print(f"fault-free run {clean} finished", file=sys.stderr, flush=True)
        run = strata(state, "submit", f"{work}/crash.toml").splitlines()[0]
        while True:
            s = json.loads(strata(state, "status", run, "--json"))
            # The fault comes once the run has a complete checkpoint to resume from (a large
            # model's background write can still be going at kill_step).
            if s["step"] >= kill_step and (every > kill_step or json.loads(strata(state, "checkpoints", run, "--json"))):
                break
            time.sleep(0.05)
        victim = s["workers"][1]
        if hang:
            killed_at = time.time()  # rank 1 stops before step kill_step + 1 of its own accord
            print(f"{victim} hangs before step {kill_step + 1} (status saw step {s['step']})", file=sys.stderr, flush=True)
        else:
            cluster = json.load(open(f"{state}/cluster.json"))
            pid = next(p["pid"] for p in cluster["processes"] if p["name"] == victim)
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            print(f"killed {victim} (pid {pid}) at step {s['step']}", file=sys.stderr, flush=True)
        # Poll for the first step past the checkpoint the run resumed from: the step drops back to
        # that checkpoint when the run recovers (grace 0 can make "pending" too short to see),
        # then grows again once the re-planned mesh trains.
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
        lost = next(e["unix_ms"] for e in events if e["kind"] == ("stalled" if hang else "worker-lost")) / 1000.0
        a = json.loads(strata(state, "status", clean, "--json"))["losses"]
        b = json.loads(strata(state, "status", run, "--json"))
        worst = max(abs(x - y) / x for x, y in zip(a, b["losses"]))
        print(json.dumps({"fault": "hang" if hang else "kill -9", "detect_s": round(lost - killed_at, 2), "train_again_s": round(trained_again - killed_at, 2),
                          "resumed_from_step": resumed_step, "final_state": b["state"], "world_size_after": b["world_size"],
                          "steps": len(b["losses"]), "max_rel_loss_diff_vs_fault_free": worst}))
        for e in events:
            if e["unix_ms"] / 1000.0 - killed_at > -3 and e["kind"] != "step":
                print(f"  {e['unix_ms'] / 1000.0 - killed_at:+7.2f} s  {e['kind']}: {e['message'][:140]}")
    finally:
        if logs_to:
            os.makedirs(logs_to, exist_ok=True)
            shutil.copytree(f"{state}/logs", f"{logs_to}/logs", dirs_exist_ok=True)
            if run:
                with open(f"{logs_to}/events.txt", "w") as f:
                    f.write(strata(state, "events", run, check=False))
        strata(state, "down", check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
