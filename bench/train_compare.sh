#!/usr/bin/env bash
# One GPU, one command: Strata's training step (bench/train_step_bench) against PyTorch with fused
# AdamW and torch.compile (bench/pytorch_train_baseline.py --fused --compile) on the same card,
# with Kineto traces of both summarised by kernel group (bench/summarize_trace.py).
# Parts: gpt2 (124M, 8 x 1024), llama886 (16 x 2048, GQA 16/8, ffn 5632, vocab 32000, 8 x 2048),
#        llama1b (bench/scaling_bench.py's llama1b: the same model at 8 x 1024).
# usage: bench/train_compare.sh BUILD_DIR OUT_DIR PART... [--no-baseline] [--eager-too]   (on the GPU node)
# --eager-too: Strata once more with train.cuda_graphs off (every kernel launched every step).
set -euo pipefail
bin=$1/bin
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
baseline=1
eager_too=0
parts=()
for a in "$@"; do
  case $a in
    --no-baseline) baseline=0 ;;
    --eager-too) eager_too=1 ;;
    *) parts+=("$a") ;;
  esac
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
run() {  # NAME STEPS FLAGS...
  local name=$1 steps=$2
  shift 2
  echo "== $name: strata"
  "$bin/train_step_bench" "$@" --steps "$steps" --precision bf16 --profile "$out/$name-strata.json" 2>&1 | grep -v '^\[W' | tee "$out/$name-strata.txt"
  python3 "$here/summarize_trace.py" "$out/$name-strata.json" strata | tee -a "$out/$name-strata.txt"
  if [[ $eager_too == 1 ]]; then
    echo "== $name: strata, train.cuda_graphs off"
    "$bin/train_step_bench" "$@" --steps "$steps" --precision bf16 --cuda-graphs 0 2>&1 | grep -v '^\[W' | tee -a "$out/$name-strata.txt"
  fi
  if [[ $baseline == 1 ]]; then
    echo "== $name: pytorch --fused --compile"
    python3 "$here/pytorch_train_baseline.py" "$@" --steps "$steps" --precision bf16 --fused --compile \
      --profile "$out/$name-torch.json" 2>&1 | grep -v Warning | tail -5 | tee "$out/$name-torch.txt"
    python3 "$here/summarize_trace.py" "$out/$name-torch.json" torch.compile | tee -a "$out/$name-torch.txt"
  fi
  rm -f "$out/$name-strata.json" "$out/$name-torch.json"
}
for part in "${parts[@]}"; do
  case $part in
    gpt2) run gpt2 10 --family gpt2 --layers 12 --hidden 768 --heads 12 --vocab 50257 --sequence 1024 --batch 8 ;;
    llama886) run llama886 5 --family llama --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32000 --sequence 2048 --batch 8 ;;
    llama1b) run llama1b 5 --family llama --layers 16 --hidden 2048 --heads 16 --kv-heads 8 --ffn 5632 --vocab 32000 --sequence 1024 --batch 8 ;;
    *) echo "unknown part $part (gpt2, llama886, llama1b)" >&2; exit 2 ;;
  esac
done
