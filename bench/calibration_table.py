"""Markdown table of the planner's current estimate against measured peaks (the JSON lines of
bench/memory_calibration.py), recomputing each estimate with `strata plan --cluster-spec`, so
the table shows the estimator as it is now, not as it was when the peaks were measured.

usage: STRATA_BIN_DIR=build/bin python3 bench/calibration_table.py RESULTS.jsonl... > table.md
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from memory_calibration import MODELS  # noqa: E402

strata = os.path.join(os.environ["STRATA_BIN_DIR"], "strata")
work = tempfile.mkdtemp(prefix="strata-caltable-")
open(os.path.join(work, "tokens.u16"), "wb").write(b"\0" * 4096)
rows = [json.loads(l) for path in sys.argv[1:] for l in open(path)]
print("| model | mesh | micro-batch | recompute | rank | measured peak (GiB) | estimate (GiB) | error |")
print("|---|---|---|---|---|---|---|---|")
cache = {}
for r in rows:
    if not r["measured_peak_bytes"] or r["state"] == "failed":
        continue
    dp, pp, tp, zero = r.get("dp", 1), r.get("pp", 1), r.get("tp", 1), r.get("zero", 0)
    if pp == 1 and r["rank"] > 0:
        continue  # the same estimate as rank 0
    stages = r.get("stages")  # layers per stage, where the run fixed them (earlier runs split evenly)
    key = (r["model"], dp, pp, tp, zero, r["micro_batch"], r["recompute"], json.dumps(stages))
    if key not in cache:
        m = MODELS[r["model"]]
        spec = ['name = "cal"', "[model]"] + [f"{k} = {json.dumps(v)}" for k, v in m.items()]
        spec += ["[data]", f'path = "{work}/tokens.u16"', 'format = "u16"', "[train]", "global_batch = 8", 'precision = "bf16"',
                 "[parallel]", f"dp = {dp}", f"pp = {pp}", f"tp = {tp}", f"zero = {zero}", f"micro_batch = {r['micro_batch']}",
                 f"recompute = {'true' if r['recompute'] else 'false'}"] + ([f"stages = {json.dumps(stages)}"] if stages else [])
        open(f"{work}/spec.toml", "w").write("\n".join(spec) + "\n")
        open(f"{work}/cluster.toml", "w").write(f'[[nodes]]\ngpus = {dp * pp * tp}\nmemory = "141GiB"\n')
        out = subprocess.run([strata, "plan", f"{work}/spec.toml", "--cluster-spec", f"{work}/cluster.toml", "--json"],
                             capture_output=True, text=True, check=True)
        cache[key] = json.loads(out.stdout)["workers"]
    w = cache[key][r["rank"]]["estimate"]
    estimate = w["total"] - w["workspace"]
    measured = r["measured_peak_bytes"]
    mesh = f"dp={dp} ZeRO-{zero}" if dp > 1 else f"pp={pp}" if pp > 1 else f"tp={tp}" if tp > 1 else "1 GPU"
    print(f"| {r['model']} | {mesh} | {r['micro_batch']} | {'on' if r['recompute'] else 'off'} | {r['rank']} | "
          f"{measured / 2**30:.2f} | {estimate / 2**30:.2f} | {100 * (estimate / measured - 1):+.1f}% |")
