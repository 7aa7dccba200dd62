#!/usr/bin/env python3
"""The planner's predicted ranking of fixed meshes against measured tokens/s (issue #19): for each
measured run in a JSON file, the same model, batch and [parallel] fields are planned by
`strata plan --cluster-spec` on GPUs of the measured kind, and the two orders are printed side by
side. Runs of one model and GPU count form one ranking.

usage: STRATA_BIN_DIR=build/bin python3 bench/planner_ranking.py bench/results/mesh-ranking-h200.json

Each measured run: {"model": "gpt2" | "llama-wide" | "llama1b", "gpus": N, "mesh": NAME,
"global_batch": B, "parallel": {dp, pp, tp, zero, micro_batch}, "tokens_per_s": [lo, hi] or x}.
"""
import json
import os
import subprocess
import sys
import tempfile

BIN = os.environ.get("STRATA_BIN_DIR", "build/bin")
MODELS = {
    "gpt2": 'family = "gpt2"\nlayers = 12\nhidden = 768\nheads = 12\nvocab = 50257\nsequence = 1024\n',
    "llama-wide": 'family = "llama"\nlayers = 8\nhidden = 4096\nheads = 32\nkv_heads = 8\nffn = 14336\nvocab = 32000\nsequence = 1024\n',
    "llama1b": 'family = "llama"\nlayers = 16\nhidden = 2048\nheads = 16\nkv_heads = 8\nffn = 5632\nvocab = 32000\nsequence = 1024\n',
}


def predict(work, run):
    # Every field fixed as bench/mesh_bench.sh fixes it (keep_gathered 0 unless the run says "auto").
    fields = {"dp": 1, "pp": 1, "tp": 1, "zero": 0, "recompute": "false", "micro_batch": 0, "keep_gathered": 0}
    fields.update(run["parallel"])

    def toml(v):
        return str(v).lower() if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) and v != "false" else str(v)
    parallel = "".join(f"{k} = {toml(v)}\n" for k, v in fields.items())
    spec = f"{work}/{run['model']}-{run['gpus']}-{run['mesh']}.toml"
    with open(spec, "w") as f:
        f.write(f'name = "{run["mesh"]}"\n[model]\n{MODELS[run["model"]]}[data]\npath = "{work}/tokens.u16"\nformat = "u16"\n'
                f'[train]\nsteps = 10\nglobal_batch = {run["global_batch"]}\nprecision = "bf16"\ncheckpoint_every = 0\n[parallel]\n{parallel}')
    cluster = f"{work}/cluster-{run['gpus']}.toml"
    with open(cluster, "w") as f:
        f.write(f'[[nodes]]\ngpus = {run["gpus"]}\nmemory = "141GiB"\n')
    out = subprocess.run([f"{BIN}/strata", "plan", spec, "--cluster-spec", cluster, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    plan = json.loads(out.stdout)
    step = plan["step_time_s"]["total"]
    return run["global_batch"] * 1024 / step


def main():
    runs = json.load(open(sys.argv[1]))
    work = tempfile.mkdtemp(prefix="strata-ranking-")
    open(f"{work}/tokens.u16", "wb").write(bytes(1 << 20))
    groups = {}
    for run in runs:
        groups.setdefault((run["model"], run["gpus"]), []).append(run)
    agree_all = True
    for (model, gpus), group in groups.items():
        for run in group:
            run["predicted"] = predict(work, run)
            m = run["tokens_per_s"]
            run["measured"] = (m[0] + m[1]) / 2 if isinstance(m, list) else m
        measured = sorted(group, key=lambda r: -r["measured"])
        predicted = sorted(group, key=lambda r: -r["predicted"])
        print(f"\n{model}, {gpus} GPUs\n| mesh | measured tok/s | predicted tok/s | measured rank | predicted rank |\n|---|---|---|---|---|")
        for run in group:
            m = run["tokens_per_s"]
            shown = f"{m[0]:,} - {m[1]:,}" if isinstance(m, list) else f"{m:,}"
            print(f"| {run['mesh']} | {shown} | {run['predicted']:,.0f} | {measured.index(run) + 1} | {predicted.index(run) + 1} |")
        # Meshes predicted alike (the same step time: the estimator does not model the option they
        # differ by, e.g. tp_comm_overlap) are a tie: any measured order between them agrees.
        def tie(a, b):
            return abs(a["predicted"] - b["predicted"]) <= 1e-9 * max(a["predicted"], b["predicted"])
        swapped = [(a["mesh"], b["mesh"]) for i, a in enumerate(measured) for b in measured[i + 1:]
                   if a["measured"] > b["measured"] and a["predicted"] < b["predicted"] and not tie(a, b)]
        ties = [(a["mesh"], b["mesh"]) for i, a in enumerate(group) for b in group[i + 1:] if tie(a, b)]
        agree = not swapped
        agree_all &= agree
        shown_predicted = ""
        for i, r in enumerate(predicted):
            shown_predicted += ("" if i == 0 else " = " if tie(predicted[i - 1], r) else " > ") + r["mesh"]
        print(f"measured:  {' > '.join(r['mesh'] for r in measured)}\npredicted: {shown_predicted}")
        for a, b in ties:
            print(f"tie: {a} and {b} are predicted alike")
        print("same order" if agree else "orders differ: " + ", ".join(f"{a} measured over {b}" for a, b in swapped))
    return 0 if agree_all else 1


if __name__ == "__main__":
    sys.exit(main())
