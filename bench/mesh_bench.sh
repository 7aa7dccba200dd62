#!/usr/bin/env bash
# Sharded training throughput through the real path (strata up --gpus N, submit, NCCL between
# worker processes): GPT-2 124M, sequence 1024, bf16. The 1-GPU run takes 8 sequences a step;
# data parallelism 8 per GPU; pp=2 eight micro-batches of 8 (m = 8); tp=2 the 1-GPU batch. Prints one JSON line per run:
# tokens_per_s is the last step's, median_tokens_per_s the median of every step after the third
# (warm-up and the CUDA graph's capture are the first steps).
#
# usage: STRATA_BIN_DIR=build/bin bash bench/mesh_bench.sh [STEPS]
#   STRATA_BENCH_MODEL=llama-wide: a Llama of 8 layers x 4096 (32 heads, 8 kv heads, ffn 14336,
#   vocab 32000), the width tensor parallelism is for, in place of GPT-2 124M
#   STRATA_BENCH_RUNS="one-gpu tp2": the runs to make (default: the six above); also one-gpu-eager
#   (cuda_graphs = false), one-gpu-zero3 and one-gpu-zero3-eager (ZeRO-3's gathering path on one
#   GPU, with and without CUDA graphs), one-gpu-zero3-keep and dp2-zero3-keep (parallel.keep_gathered
#   = "auto": the planner keeps what fits gathered for the backward; the other runs keep none), pp2-m16 (16 micro-batches of 8), pp2-m8-stages (STRATA_BENCH_STAGES="[7, 5]"),
#   tp2-no-overlap and tp2-no-sp (tp = 2 with parallel.tp_comm_overlap or sequence_parallel off)
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
steps=${1:-15}
precision=${STRATA_BENCH_PRECISION:-bf16}
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
up="--gpus $n"
if [ "$n" -eq 0 ]; then n=${STRATA_BENCH_CPU_WORKERS:-2}; up="--workers $n"; fi  # a CPU smoke run of the script
layers=${STRATA_BENCH_LAYERS:-12} hidden=${STRATA_BENCH_HIDDEN:-768} sequence=${STRATA_BENCH_SEQUENCE:-1024}
vocab=50257
model_body="family = \"gpt2\"
heads = 12"
if [ "${STRATA_BENCH_MODEL:-gpt2}" = llama-wide ]; then
  layers=${STRATA_BENCH_LAYERS:-8} hidden=${STRATA_BENCH_HIDDEN:-4096} vocab=32000
  model_body="family = \"llama\"
heads = 32
kv_heads = 8
ffn = 14336"
fi
runs=${STRATA_BENCH_RUNS:-one-gpu dp2-zero1 dp2-zero2 dp2-zero3 pp2-m8 tp2}
work=$(mktemp -d /tmp/strata-mesh-bench-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
python3 -c "
import array, os
raw = array.array('H', os.urandom(2 * (16 << 20)))
array.array('H', (t % $vocab for t in raw)).tofile(open('$work/tokens.u16', 'wb'))"
# Each run gets a cluster of its own, whose state (its stores, with the run's final checkpoint:
# 32 GB for the wide Llama with its optimizer state) is deleted after it: runs kept on one
# cluster filled a 128 GiB disk by the fourth.
bench() {  # NAME GLOBAL_BATCH PARALLEL_BODY [TRAIN_LINES]
  "$bin/strata" up $up >/dev/null
  bench_one "$@"
  "$bin/strata" down >/dev/null 2>&1 || true
  rm -rf "$STRATA_STATE_DIR"
}

bench_one() {
  cat > "$work/$1.toml" <<SPEC
name = "$1"
[model]
$model_body
layers = $layers
hidden = $hidden
vocab = $vocab
sequence = $sequence
[data]
path = "$work/tokens.u16"
format = "u16"
[train]
steps = $steps
global_batch = $2
lr = 0.0003
weight_decay = 0.1
precision = "$precision"
${4:-}
[parallel]
$(printf '%s\n' "dp = 1" "pp = 1" "tp = 1" "zero = 0" "recompute = false" "micro_batch = 0" "keep_gathered = 0" "$3" | python3 -c "
import sys  # every field fixed (later lines win): nothing is left to the planner
fields = dict(l.split(' = ', 1) for l in sys.stdin.read().split(chr(10)) if ' = ' in l)
print(chr(10).join(k + ' = ' + v for k, v in fields.items()))")
SPEC
  local id out
  if ! out=$("$bin/strata" submit "$work/$1.toml" --follow 2>"$work/$1.err"); then
    echo "{\"run\": \"$1\", \"error\": \"submit failed\"}"; tail -5 "$work/$1.err" >&2; return 0
  fi
  id=$(printf '%s\n' "$out" | head -1)
  "$bin/strata" metrics "$id" > "$work/$1.metrics" 2>/dev/null || true
  "$bin/strata" status "$id" --json | python3 -c "
import json, statistics, sys
s = json.load(sys.stdin)
if s['state'] != 'finished':
    print(json.dumps({'run': '$1', 'state': s['state'], 'message': s.get('message')})); sys.exit(0)
steps = [json.loads(l) for l in open('$work/$1.metrics') if l.strip()]
rates = [m['tokens_per_second'] for m in steps[3:] if m.get('tokens_per_second', 0) > 0]  # past the warm-up and the capture
print(json.dumps({'run': '$1', 'gpus': s.get('world_size'), 'global_batch': $2, 'tokens_per_s': round(s['tokens_per_second']),
                  'median_tokens_per_s': round(statistics.median(rates)) if rates else None, 'steps_in_median': len(rates),
                  'loss': round(s['losses'][-1], 4),
                  'peak_gib': [round(m['measured_peak_bytes'] / 2**30, 2) for m in s.get('memory', [])],
                  'estimate_gib': [round(m['estimate_bytes'] / 2**30, 2) for m in s.get('memory', [])]}))"
}

for run in $runs; do
  case $run in one-gpu*) ;; *) if [ "$n" -lt 2 ]; then continue; fi ;; esac
  case $run in
    one-gpu) bench one-gpu 8 "" ;;
    dp2-zero[123]) bench "$run" 16 "dp = 2
zero = ${run#dp2-zero}" ;;
    pp2-m8) bench pp2-m8 64 "pp = 2
micro_batch = 8" ;;
    pp2-m16) bench pp2-m16 128 "pp = 2
micro_batch = 8" ;;
    pp2-m8-stages) bench pp2-m8-stages 64 "pp = 2
micro_batch = 8
stages = ${STRATA_BENCH_STAGES:?set STRATA_BENCH_STAGES, e.g. [7, 5]}" ;;
    one-gpu-eager) bench one-gpu-eager 8 "" "cuda_graphs = false" ;;
    one-gpu-zero3) bench one-gpu-zero3 8 "zero = 3" ;;
    one-gpu-zero3-eager) bench one-gpu-zero3-eager 8 "zero = 3" "cuda_graphs = false" ;;
    one-gpu-zero3-keep) bench one-gpu-zero3-keep 8 "zero = 3
keep_gathered = \"auto\"" ;;
    dp2-zero3-keep) bench dp2-zero3-keep 16 "dp = 2
zero = 3
keep_gathered = \"auto\"" ;;
    tp2) bench tp2 8 "tp = 2" ;;
    tp2-no-overlap) bench tp2-no-overlap 8 "tp = 2
tp_comm_overlap = false" ;;
    tp2-no-sp) bench tp2-no-sp 8 "tp = 2
sequence_parallel = false" ;;
    *) echo "mesh_bench: unknown run '$run' (one-gpu, one-gpu-eager, one-gpu-zero3, one-gpu-zero3-eager, one-gpu-zero3-keep, dp2-zero1..3, dp2-zero3-keep, pp2-m8, pp2-m16, pp2-m8-stages, tp2, tp2-no-overlap, tp2-no-sp)" >&2; exit 2 ;;
  esac
done
