#!/usr/bin/env bash
# train.optimizer = "adamw" against "adamw8bit" on one GPU, one command: a small Llama trained 500
# steps on learnable tokens (bench/train_step_bench --markov 1: each token followed by one of 4
# fixed successors, floor ln 4 = 1.386 nats) - the mean loss of the last 20 steps of each - and
# the optimizer state's bytes and the step's allocator peak of each on Llama 886M.
# usage: bench/optimizer_compare.sh BUILD_DIR OUT_DIR   (on the GPU node)
set -euo pipefail
bin=$1/bin
out=$2
mkdir -p "$out"
small=(--family llama --layers 4 --hidden 512 --heads 8 --kv-heads 4 --ffn 1408 --vocab 4096 --sequence 512 --batch 16
       --precision bf16 --markov 1 --steps 500)
big=(--family llama --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32000 --sequence 1024 --batch 8
     --precision bf16 --steps 5)
for opt in adamw adamw8bit; do
  echo "== small llama, 500 steps, $opt"
  "$bin/train_step_bench" "${small[@]}" --optimizer "$opt" 2>&1 | grep -v '^\[W' | tee "$out/small-$opt.txt"
done
for opt in adamw adamw8bit; do
  echo "== llama 886M, $opt"
  "$bin/train_step_bench" "${big[@]}" --optimizer "$opt" 2>&1 | grep -v '^\[W' | tee "$out/big-$opt.txt"
done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
row = lambda name: json.loads([l for l in (out / name).read_text().splitlines() if l.startswith("{")][-1])
s32, s8 = row("small-adamw.txt"), row("small-adamw8bit.txt")
b32, b8 = row("big-adamw.txt"), row("big-adamw8bit.txt")
print(f"small llama ({s32['params']:,} params), mean loss of steps 481-500: adamw {s32['last20_loss']:.4f}, "
      f"adamw8bit {s8['last20_loss']:.4f} ({100 * (s8['last20_loss'] / s32['last20_loss'] - 1):+.2f}%)")
print(f"llama 886M ({b32['params']:,} params): optimizer state adamw {b32['optimizer_state_bytes'] / 2**30:.3f} GiB, "
      f"adamw8bit {b8['optimizer_state_bytes'] / 2**30:.3f} GiB ({100 * b8['optimizer_state_bytes'] / b32['optimizer_state_bytes']:.1f}%); "
      f"step peak {b32['peak_gib']:.3f} -> {b8['peak_gib']:.3f} GiB (saved {b32['peak_gib'] - b8['peak_gib']:.3f} GiB; "
      f"state difference {(b32['optimizer_state_bytes'] - b8['optimizer_state_bytes']) / 2**30:.3f} GiB); "
      f"tokens/s {b32['tokens_per_s']:,.0f} -> {b8['tokens_per_s']:,.0f}")
PY
