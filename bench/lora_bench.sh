#!/usr/bin/env bash
# LoRA and QLoRA of a Llama-3.1-8B shape on one GPU, against PEFT on the same card.
#   Strata: a local cluster (`strata up --gpus 1`), one train run per base ("dense": bf16, "nf4":
#   QLoRA), LoRA r = 16, alpha 32, all-linear, sequence 2048, global batch 2, bf16, the base drawn
#   from train.seed; every [parallel] field left to the planner. Reported: the run's tokens/s
#   (its last step), the worker's measured peak and the planner's estimate for it.
#   PEFT: bench/peft_lora_baseline.py with the same shape, rank, alpha, batch and sequence, eager
#   and torch.compile'd (bitsandbytes is not on the GPU node, so PEFT's QLoRA is not measured).
# usage: bench/lora_bench.sh BUILD_DIR OUT_DIR [STEPS]   (on the GPU node)
#   LORA_BASES="dense" and PEFT_MODES="compile" run a subset (defaults: "dense nf4", "eager compile").
set -euo pipefail
bin=$(realpath "$1")/bin
out=$2
steps=${3:-8}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(realpath "$out")
state=$(mktemp -d /tmp/strata-lora-bench-XXXXXX)
trap '"$bin/strata" --state-dir "$state" down >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 128256, 2_000_000, dtype=np.uint32).tofile('$state/tokens.u32')"
shape=(--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --sequence 2048 --batch 2)

"$bin/strata" --state-dir "$state" up --gpus 1 >/dev/null
for base in ${LORA_BASES:-dense nf4}; do
  cat >"$out/lora-$base.toml" <<SPEC
name = "lora8b-$base"
[model]
family = "llama"
layers = 32
hidden = 4096
heads = 32
kv_heads = 8
ffn = 14336
vocab = 128256
sequence = 2048
rope_theta = 500000.0
[data]
path = "$state/tokens.u32"
format = "u32"
[train]
steps = $steps
global_batch = 2
lr = 1e-4
precision = "bf16"
checkpoint_every = 0
keep_checkpoints = 1
[lora]
rank = 16
alpha = 32
target_modules = "all-linear"
base = "$base"
SPEC
  "$bin/strata" --state-dir "$state" plan "$out/lora-$base.toml" >"$out/lora-$base.plan" 2>&1 || true
  echo "== strata $base: $(date +%T)"
  "$bin/strata" --state-dir "$state" submit "$out/lora-$base.toml" --follow >"$out/lora-$base.follow" \
    2>"$out/lora-$base.err" || tail -20 "$out/lora-$base.err"
  id=$(head -n1 "$out/lora-$base.follow")
  "$bin/strata" --state-dir "$state" status "$id" --json >"$out/lora-$base.json"
  "$bin/strata" --state-dir "$state" events "$id" >"$out/lora-$base.events" || true
done
"$bin/strata" --state-dir "$state" down >/dev/null
grep -h "placed its part" "$state"/logs/*.log >"$out/load.txt" || true  # the base's load time per run
cat "$out/load.txt"

for mode in ${PEFT_MODES:-eager compile}; do
  echo "== peft $mode: $(date +%T)"
  flag=$([ $mode = compile ] && echo --compile || true)
  python3 "$here/peft_lora_baseline.py" "${shape[@]}" --rank 16 --alpha 32 --steps 5 $flag 2>"$out/peft-$mode.err" |
    tail -1 >"$out/peft-$mode.json" || true
  cat "$out/peft-$mode.json"; [ -s "$out/peft-$mode.json" ] || tail -20 "$out/peft-$mode.err"
done

python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = {}
for base in ("dense", "nf4"):
    if not (out / f"lora-{base}.json").exists():
        continue
    r = json.loads((out / f"lora-{base}.json").read_text())
    m = r["memory"][0] if r.get("memory") else {}
    peak, est = m.get("measured_peak_bytes", 0), m.get("estimate_bytes", 0)
    rows[f"strata_{base}"] = {"state": r["state"], "tokens_per_s": round(r["tokens_per_second"]),
                             "peak_gib": round(peak / 2**30, 3), "estimate_gib": round(est / 2**30, 3),
                             "estimate_vs_peak": round(est / peak, 3) if peak else None,
                             "plan": r.get("plan"), "losses": r["losses"][:1] + r["losses"][-1:]}
for mode in ("eager", "compile"):
    p = out / f"peft-{mode}.json"
    if p.exists() and p.read_text().strip().startswith("{"):
        rows[f"peft_{mode}"] = json.loads(p.read_text())
print(json.dumps(rows, indent=1))
PY
