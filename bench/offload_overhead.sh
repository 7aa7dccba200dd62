#!/usr/bin/env bash
# Issue #23's offload overhead on one GPU: Llama 886M (the llama1b shape of train_compare.sh,
# 1024 tokens a sequence) trained with the on-GPU AdamW and with [parallel] offload =
# "optimizer", at global batches of 8, 32 and 64 sequences (micro-batches of 8, so 1, 4 and 8 of
# them a step). Prints each pair's step time, their ratio, the GPU peaks and where the
# offloaded update's time went (train_step_bench: the update thread's time, its waits for
# gradients, the next forward's waits for units).
# usage: bench/offload_overhead.sh BUILD_DIR OUT_DIR [BATCH...]   (on the GPU node)
# STRATA_OFFLOADS="none optimizer optimizer+params" adds the host-streamed parameters (ZeRO-3 path).
set -euo pipefail
bin=$1/bin
out=$2
shift 2
batches=("$@")
[ ${#batches[@]} -gt 0 ] || batches=(8 32 64)
mkdir -p "$out"
model=(--family llama --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32000 --sequence 1024
       --precision bf16 --micro-batch 8 --steps 8)
for b in "${batches[@]}"; do
  for where in ${STRATA_OFFLOADS:-none optimizer}; do
    echo "== llama 886M, batch $b, offload $where"
    "$bin/train_step_bench" "${model[@]}" --batch "$b" --offload "$where" 2>&1 | grep -v '^\[W' | tee "$out/offload-$b-$where.txt"
  done
done
python3 - "$out" "${batches[@]}" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
row = lambda name: json.loads([l for l in (out / name).read_text().splitlines() if l.startswith("{")][-1])
print("| batch | on-GPU step | offload step | ratio | GPU peak | update thread | its gradient waits | forward's waits |")
print("|---|---|---|---|---|---|---|---|")
for b in sys.argv[2:]:
    g = row(f"offload-{b}-none.txt")
    for where in ("optimizer", "optimizer+params"):
        if not (out / f"offload-{b}-{where}.txt").exists():
            continue
        o = row(f"offload-{b}-{where}.txt")
        print(f"| {b} ({where}) | {g['step_ms']:.1f} ms | {o['step_ms']:.1f} ms | {o['step_ms'] / g['step_ms']:.2f}x | "
              f"{g['peak_gib']:.2f} -> {o['peak_gib']:.2f} GiB | {o['offload_update_ms']:.1f} ms | "
              f"{o['offload_gradient_wait_ms']:.1f} ms | {o['offload_forward_wait_ms']:.1f} ms |")
PY
