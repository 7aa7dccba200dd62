#!/usr/bin/env bash
# Issue #48 on one GPU: offload planned when nothing fits without it.
#   A. Llama 886M (the llama1b shape of train_compare.sh: 16 x 2048, 14.2 GB of fp32 weights,
#      gradients and AdamW moments) with every [parallel] field but micro_batch left to the
#      planner, on a worker capped at 14 GiB (--memory-limit: the caching allocator refuses to
#      grow past it, and the worker reports the cap as its memory). The plan must offload the
#      optimizer's state, say why in its planned event, and train without running out of memory.
#   B. The same spec with offload = "none" and recompute = true (A's plan recomputes) on the
#      uncapped GPU: the losses A must equal (the host's AdamW is the device's arithmetic,
#      docs/run-spec.md "offload").
#   C. `strata plan` of a Llama-3.1-8B shape against the live, uncapped GPU: what it says (the
#      node's host memory, ~128 GiB, cannot hold an 8B model's offloaded state).
# usage: bench/offload_auto_check.sh BUILD_DIR OUT_DIR   (on the GPU node)
set -euo pipefail
bin=$(realpath "$1")/bin
out=$2
mkdir -p "$out"
out=$(realpath "$out")
state=$(mktemp -d /tmp/strata-offload-auto-XXXXXX)
trap '"$bin/strata" --state-dir "$state/a" down >/dev/null 2>&1 || true; "$bin/strata" --state-dir "$state/b" down >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 32000, 4_000_000, dtype=np.uint16).tofile('$state/tokens.u16')"

spec() {  # NAME [PARALLEL LINES]
  cat >"$out/$1.toml" <<EOF
name = "$1"
[model]
family = "llama"
layers = 16
hidden = 2048
heads = 16
kv_heads = 8
ffn = 5632
vocab = 32000
sequence = 1024
[data]
path = "$state/tokens.u16"
format = "u16"
[train]
steps = 20
global_batch = 8
lr = 3e-4
precision = "bf16"
checkpoint_every = 0
[parallel]
micro_batch = 4
${2:-}
EOF
  echo "$out/$1.toml"
}

echo "== A: every field but micro_batch to the planner, the GPU capped at 14 GiB"
"$bin/strata" --state-dir "$state/a" up --gpus 1 --memory-limit 14GiB
"$bin/strata" --state-dir "$state/a" plan "$(spec capped)" | tee "$out/capped.plan"
"$bin/strata" --state-dir "$state/a" submit "$out/capped.toml" --follow >"$out/capped.follow"
run_a=$(head -n1 "$out/capped.follow")
"$bin/strata" --state-dir "$state/a" events "$run_a" | tee "$out/capped.events"
"$bin/strata" --state-dir "$state/a" status "$run_a" --json >"$out/capped.json"
"$bin/strata" --state-dir "$state/a" down

echo "== B: offload = \"none\", recompute = true, on the whole GPU"
"$bin/strata" --state-dir "$state/b" up --gpus 1
"$bin/strata" --state-dir "$state/b" submit "$(spec whole "$(printf 'offload = "none"\nrecompute = true')")" --follow >"$out/whole.follow"
run_b=$(head -n1 "$out/whole.follow")
"$bin/strata" --state-dir "$state/b" status "$run_b" --json >"$out/whole.json"

echo "== C: Llama-3.1-8B's shape against the live GPU"
cat >"$out/llama8b.toml" <<EOF
name = "llama31-8b"
[model]
family = "llama"
layers = 32
hidden = 4096
heads = 32
kv_heads = 8
ffn = 14336
vocab = 128256
sequence = 4096
[data]
path = "$state/tokens.u16"
format = "u16"
[train]
steps = 100
global_batch = 8
precision = "bf16"
EOF
"$bin/strata" --state-dir "$state/b" plan "$out/llama8b.toml" >"$out/llama8b.plan" 2>&1 || true
cat "$out/llama8b.plan"
"$bin/strata" --state-dir "$state/b" down

python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
a, b = json.loads((out / "capped.json").read_text()), json.loads((out / "whole.json").read_text())
events = (out / "capped.events").read_text()
la, lb = a["losses"], b["losses"]
diff = max(abs(x - y) / abs(y) for x, y in zip(la, lb)) if la and len(la) == len(lb) else float("nan")
peak = max(m["measured_peak_bytes"] for m in a["memory"]) / 2**30
print(json.dumps({"capped_state": a["state"], "capped_offload": a["plan"].get("offload"), "whole_state": b["state"],
                  "planned_says_why": "Offloads the optimizer's state" in events,
                  "capped_peak_gib": round(peak, 3), "cap_gib": 14, "steps": [len(la), len(lb)],
                  "losses_equal": la == lb, "max_rel_diff": diff,
                  "tokens_per_s": [a["tokens_per_second"], b["tokens_per_second"]]}, indent=1))
PY
