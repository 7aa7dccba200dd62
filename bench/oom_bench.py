#!/usr/bin/env python3
"""Out of memory on a GPU mid-plan (issue #5): one worker capped at CAP_GIB (default 8) with
`strata up --memory-limit`, a GPT-2 124M run (sequence 1024, bf16) whose fixed micro-batch is far
too big for it, submitted with --skip-estimate. The run must re-plan on each OOM and finish; its
losses are compared with the same spec on an uncapped GPU, and the time from each OOM to the first
step trained after it is measured (the coordinator's "oom" event -> the run's step moving on).

OOM_GPUS=N (default 1): N workers, each capped, on a dp=N run of the same global batch (micro-batch
= its share of the batch): the out-of-memory path of several ranks at once over NCCL.
OOM_LOGS=DIR: the cluster's logs are copied to DIR/<capped|uncapped> at the end.

usage: STRATA_BIN_DIR=build/bin python3 bench/oom_bench.py [STEPS]
"""
import array
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.environ["STRATA_BIN_DIR"]
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
CAP = os.environ.get("CAP_GIB", "8")
GPUS = int(os.environ.get("OOM_GPUS", "1"))


def strata(state, *args, check=True):
    r = subprocess.run([f"{BIN}/strata", *args], capture_output=True, text=True, env=dict(os.environ, STRATA_STATE_DIR=state))
    if check and r.returncode != 0:
        raise RuntimeError(f"strata {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def run_once(work, name, spec, up_args):
    state = f"{work}/state-{name}"
    strata(state, "up", *up_args)
    try:
        with open(f"{work}/{name}.toml", "w") as f:
            f.write(f'name = "{name}"\n' + spec)
        run = strata(state, "submit", f"{work}/{name}.toml", "--skip-estimate").splitlines()[0]
        # Poll the step: the first time it passes each value, with a wall-clock time.
        first_seen, deadline = {}, time.time() + 540
        while True:
            s = json.loads(strata(state, "status", run, "--json"))
            first_seen.setdefault(s["step"], time.time())
            if s["state"] in ("finished", "failed", "cancelled") or time.time() > deadline:
                break
            time.sleep(0.02)
        events = json.loads(strata(state, "events", run, "--json"))
        return s, events, first_seen
    finally:
        if os.environ.get("OOM_LOGS"):  # the cluster's logs, kept whatever happened
            shutil.copytree(f"{state}/logs", f"{os.environ['OOM_LOGS']}/{name}", dirs_exist_ok=True)
        strata(state, "down", check=False)


def main():
    work = tempfile.mkdtemp(prefix="strata-oom-")
    try:
        raw = array.array("H", os.urandom(2 * (8 << 20)))
        array.array("H", (t % 50257 for t in raw)).tofile(open(f"{work}/tokens.u16", "wb"))
        spec = ('[model]\nfamily = "gpt2"\nlayers = 12\nhidden = 768\nheads = 12\nvocab = 50257\nsequence = 1024\n'
                f'[data]\npath = "{work}/tokens.u16"\nformat = "u16"\n'
                f'[train]\nsteps = {STEPS}\nglobal_batch = 32\nlr = 0.0003\nprecision = "bf16"\ncheckpoint_every = 0\n'
                f'[parallel]\ndp = {GPUS}\npp = 1\ntp = 1\nzero = 0\nrecompute = false\nmicro_batch = {32 // GPUS}\n')
        capped, events, seen = run_once(work, "capped", spec, ["--gpus", str(GPUS), "--memory-limit", f"{CAP}GiB"])
        clean, _, _ = run_once(work, "uncapped", spec, ["--gpus", str(GPUS)])
        ooms = [e for e in events if e["kind"] == "oom"]
        # Training again: the first step after the last OOM was seen (every OOM here is in step 1).
        last_oom = ooms[-1]["unix_ms"] / 1000.0 if ooms else None
        after = sorted(t for step, t in seen.items() if step >= 1 and last_oom and t > last_oom)
        worst = max((abs(a - b) / a for a, b in zip(clean["losses"], capped["losses"])), default=None)
        print(json.dumps({
            "gpus": GPUS, "cap_gib": float(CAP), "state": capped["state"], "steps": len(capped["losses"]), "ooms": len(ooms),
            "plan_after": capped.get("plan"), "handled": capped.get("handled"),
            "first_oom_to_training_s": round(after[0] - ooms[0]["unix_ms"] / 1000.0, 2) if after and ooms else None,
            "last_oom_to_training_s": round(after[0] - last_oom, 2) if after else None,
            "max_rel_loss_diff_vs_uncapped": worst, "uncapped_state": clean["state"],
            "capped_tokens_per_s": round(capped["tokens_per_second"]), "uncapped_tokens_per_s": round(clean["tokens_per_second"])}))
        t0 = events[0]["unix_ms"] / 1000.0
        for e in events:
            print(f"  {e['unix_ms'] / 1000.0 - t0:+7.2f} s  {e['kind']}: {e['message'][:160]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
