#!/usr/bin/env bash
# Capture throughput on one GPU (docs/benchmarks.md): GPT-2 124M (transformers' default config,
# random weights) in bf16, residual stream of all 12 blocks stored as bf16, the same tokens for
#   - the users' method (bench/hf_capture_baseline.py: output_hidden_states + torch.save),
#   - the disk's own sequential write bandwidth (dd with fdatasync),
#   - Strata into a store on that disk, and into a store on a RAM disk (/dev/shm),
#   - reading a ~1 GB slice of one layer back (`strata activations get`).
# usage: bench/extract_bench.sh BUILD_DIR OUT_DIR [TOKENS]     (on the GPU node)
set -euo pipefail
bin=$1/bin
out=$2
tokens=${3:-1048576}
here=$(cd "$(dirname "$0")" && pwd)
work=$(pwd)/.extract-bench
rm -rf "$work" && mkdir -p "$work" "$out"
trap 'for s in "$work/state" /dev/shm/strata-bench-state; do STRATA_STATE_DIR=$s "$bin/strata" down >/dev/null 2>&1 || true; done; rm -rf "$work" /dev/shm/strata-bench-state /dev/shm/slice.safetensors' EXIT
mkdir -p "$work/model"
python3 "$here/../tests/gpu/extract_reference.py" make "$work/model" gpt2-124m $((tokens / 1024)) 1024
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
df -h "$work" | tail -1 | tee "$out/disk.txt"

echo "== dd (sequential write, fdatasync) on the disk holding the stores"
dd if=/dev/zero of="$work/dd.bin" bs=1M count=8192 conv=fdatasync 2>&1 | tail -1 | tee "$out/dd.txt"
rm -f "$work/dd.bin"

echo "== users' method"
python3 "$here/hf_capture_baseline.py" "$work/model" "$work/model/tokens.u16" 1024 16 "$work/hf-out" | tee "$out/hf_baseline.json"
rm -rf "$work/hf-out"

spec="name = \"gpt2-124m-capture\"
kind = \"extract\"
[model]
family = \"gpt2\"
layers = 12
hidden = 768
heads = 12
vocab = 50257
sequence = 1024
init_from = \"$work/model\"
[data]
path = \"$work/model/tokens.u16\"
format = \"u16\"
[extract]
sites = [\"resid_post\"]
precision = \"bf16\"
dtype = \"bf16\"
batch = 16"
printf '%s\n' "$spec" > "$work/capture.toml"

source "$here/capture_lib.sh"
capture() {  # STATE_DIR LABEL
  strata_capture "$1" "$work/capture.toml" "$2"
}

echo "== strata into a store on the disk"
id=$(capture "$work/state" disk | tail -1)
echo "== read a ~1 GB slice of layer 5 (bf16 safetensors to /dev/shm)"
STRATA_STATE_DIR=$work/state "$bin/strata" activations get "$id" --layer 5 --rows 0:699051 --out /dev/shm/slice.safetensors 2>&1 | tee "$out/read.txt"
STRATA_STATE_DIR=$work/state "$bin/strata" down >/dev/null
rm -rf "$work/state"
echo "== strata into a store on a RAM disk"
capture /dev/shm/strata-bench-state ramdisk >/dev/null
