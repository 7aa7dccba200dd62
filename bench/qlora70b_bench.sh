#!/usr/bin/env bash
# QLoRA of a Llama-3.1-70B shape on one GPU: the guides' claim (a 70B fine-tuned on one 80 GB
# card) and the planner's estimate against the measured peak.
#   The base is drawn from train.seed a parameter at a time on the GPU (no file: the GPU node's
#   disk is 64 GB), each block linear quantized to NF4 there as it is drawn (worker/nn/causal_lm.h
#   ParameterDraw, worker/nn/nf4_linear.cc). LoRA r = 16, alpha 32,
#   all-linear, sequence 1024, global batch 1, bf16; every [parallel] field left to the planner.
#   Reported: load time (submit to first step), tokens/s of the last step, the worker's measured
#   peak and the planner's estimate, and whether the peak is within 80 GB (74.5 GiB).
# usage: bench/qlora70b_bench.sh BUILD_DIR OUT_DIR [STEPS]   (on the GPU node)
set -euo pipefail
bin=$(realpath "$1")/bin
out=$2
steps=${3:-4}
mkdir -p "$out"
out=$(realpath "$out")
state=$(mktemp -d /tmp/strata-qlora70b-XXXXXX)
trap '"$bin/strata" --state-dir "$state" down >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 128256, 1_000_000, dtype=np.uint32).tofile('$state/tokens.u32')"
cat >"$out/qlora70b.toml" <<SPEC
name = "qlora70b"
[model]
family = "llama"
layers = 80
hidden = 8192
heads = 64
kv_heads = 8
ffn = 28672
vocab = 128256
sequence = 1024
rope_theta = 500000.0
[data]
path = "$state/tokens.u32"
format = "u32"
[train]
steps = $steps
global_batch = 1
lr = 1e-4
precision = "bf16"
checkpoint_every = 0
keep_checkpoints = 1
[lora]
rank = 16
alpha = 32
target_modules = "all-linear"
base = "nf4"
SPEC
"$bin/strata" --state-dir "$state" up --gpus 1 >/dev/null
"$bin/strata" --state-dir "$state" plan "$out/qlora70b.toml" >"$out/qlora70b.plan" 2>&1 || true
head -3 "$out/qlora70b.plan"
start=$(date +%s)
"$bin/strata" --state-dir "$state" submit "$out/qlora70b.toml" --follow >"$out/qlora70b.follow" \
  2>"$out/qlora70b.err" || tail -20 "$out/qlora70b.err"
id=$(head -n1 "$out/qlora70b.follow")
"$bin/strata" --state-dir "$state" status "$id" --json >"$out/qlora70b.json"
"$bin/strata" --state-dir "$state" events "$id" >"$out/qlora70b.events" || true
grep -h "placed its part" "$state"/logs/*.log | tee "$out/load.txt" || true
python3 - "$out" "$(( $(date +%s) - start ))" <<'PY'
import json, sys, pathlib
out, seconds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
r = json.loads((out / "qlora70b.json").read_text())
m = r["memory"][0] if r.get("memory") else {}
peak, est = m.get("measured_peak_bytes", 0), m.get("estimate_bytes", 0)
row = {"state": r["state"], "steps": r.get("step"), "seconds": seconds,
       "tokens_per_s": round(r.get("tokens_per_second", 0)), "peak_gib": round(peak / 2**30, 3),
       "estimate_gib": round(est / 2**30, 3), "estimate_error": round(est / peak - 1, 4) if peak else None,
       "within_80gb": bool(peak) and peak <= 80e9, "losses": r.get("losses", []), "gpu": (out / "gpu.txt").read_text().strip()}
(out / "qlora70b-summary.json").write_text(json.dumps(row, indent=1) + "\n")
print(json.dumps(row))
PY
