#!/usr/bin/env bash
# Sharded training throughput through the real path (strata up --gpus N, submit, NCCL between
# worker processes): GPT-2 124M, sequence 1024, bf16, 8 sequences per GPU per step for data
# parallelism, the 1-GPU batch for pp / tp. Prints one JSON line per run: tokens/s is the last
# step's (steps take the same time after the first few).
#
# usage: STRATA_BIN_DIR=build/bin bash bench/mesh_bench.sh [STEPS]
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
steps=${1:-15}
n=$(nvidia-smi -L | grep -c '^GPU ')
work=$(mktemp -d /tmp/strata-mesh-bench-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
python3 -c "import numpy as np; np.random.default_rng(1).integers(0, 50257, 16 << 20, dtype=np.uint16).tofile('$work/tokens.u16')"
"$bin/strata" up --gpus "$n" >/dev/null

bench() {  # NAME GLOBAL_BATCH PARALLEL_BODY
  cat > "$work/$1.toml" <<SPEC
name = "$1"
[model]
family = "gpt2"
layers = 12
hidden = 768
heads = 12
vocab = 50257
sequence = 1024
[data]
path = "$work/tokens.u16"
format = "u16"
[train]
steps = $steps
global_batch = $2
lr = 0.0003
weight_decay = 0.1
precision = "bf16"
[parallel]
$3
SPEC
  local id
  id=$("$bin/strata" submit "$work/$1.toml" --follow | head -1)
  "$bin/strata" status "$id" --json | python3 -c "
import json, sys
s = json.load(sys.stdin)
assert s['state'] == 'finished', s
print(json.dumps({'run': '$1', 'gpus': s.get('world_size'), 'global_batch': $2, 'tokens_per_s': round(s['tokens_per_second']),
                  'loss': round(s['losses'][-1], 4)}))"
}

bench one-gpu 8 ""
if [ "$n" -ge 2 ]; then
  bench dp2-zero1 16 "dp = 2
zero = 1"
  bench dp2-zero2 16 "dp = 2
zero = 2"
  bench dp2-zero3 16 "dp = 2
zero = 3"
  bench pp2-m8 8 "pp = 2
micro_batch = 1"
  bench tp2 8 "tp = 2"
fi
