#!/usr/bin/env bash
# Interpretability capture and reading on one GPU (docs/history/benchmarks-sessions.md, "Every site and shuffled
# batches"). Parts, each run on its own so one command stays under the node's time limit:
#   all-gpt2, all-llama  every capture site (docs/extract.md) of GPT-2 124M (32 x 1024 tokens) or of a
#                        1.1B Llama (TinyLlama's shape, 8 x 1024 tokens), stored as bf16, against the
#                        users' method on the same tokens (bench/hf_sites_baseline.py: transformers
#                        hooks on every site + torch.save per batch), and the disk's write bandwidth;
#   batches              a ~19 GB capture (GPT-2 124M, resid_post of all 12 blocks, 1M tokens), then
#                        shuffled 4096-row batches of one layer into numpy through the Python package
#                        from the stores alone (bench/batches_bench.py): from the disk and from the
#                        page cache, against the disk's sequential read bandwidth.
# usage: bench/activations_bench.sh BUILD_DIR OUT_DIR PART...     (on the GPU node)
set -euo pipefail
bin=$1/bin
python_dir=$1/python
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
work=$(pwd)/.activations-bench
mkdir -p "$out"
cleanup() {
  STRATA_STATE_DIR=$work/state "$bin/strata" down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
source "$here/capture_lib.sh"
export STRATA_STATE_DIR=$work/state  # strata_capture runs in a subshell where its id is taken
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"

all_sites='["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "attn_pattern", "mlp_hidden", "final_norm", "logits"]'

dd_write() {  # LABEL
  dd if=/dev/zero of="$work/dd.bin" bs=1M count=8192 conv=fdatasync 2>&1 | tail -1 | tee "$out/dd-$1.txt"
  rm -f "$work/dd.bin"
}

# capture_spec NAME SITES BATCH: an extract run of the model in $work/model on its tokens, bf16.
capture_spec() {
  cat > "$work/capture.toml" <<TOML
name = "$1"
kind = "extract"
[model]
sequence = 1024
init_from = "$work/model"
[data]
path = "$work/model/tokens.u16"
format = "u16"
[extract]
sites = $2
precision = "bf16"
dtype = "bf16"
batch = $3
TOML
}

# all_sites_part LABEL MODEL SEQUENCES BATCH (the model's shape comes from its config.json)
all_sites_part() {
  cleanup; mkdir -p "$work/model"
  python3 "$here/../tests/gpu/extract_reference.py" make "$work/model" "$2" "$3" 1024
  df -h "$work" | tail -1 | tee "$out/disk.txt"
  echo "== $1: dd (sequential write, fdatasync)"
  dd_write "$1"
  echo "== $1: users' method (transformers hooks on every site + torch.save)"
  python3 "$here/hf_sites_baseline.py" "$work/model" "$work/model/tokens.u16" 1024 "$4" "$work/hf-out" | tee "$out/hf-$1.json"
  rm -rf "$work/hf-out"
  capture_spec "$1" "$all_sites" "$4"
  echo "== $1: strata, every site into a store on the disk"
  strata_capture "$work/state" "$work/capture.toml" "$1" >/dev/null
  "$bin/strata" activations latest > "$out/listing-$1.txt"
  "$bin/strata" down >/dev/null
}

batches_part() {
  cleanup; mkdir -p "$work/model"
  python3 "$here/../tests/gpu/extract_reference.py" make "$work/model" gpt2-124m 1024 1024
  capture_spec resid-1m '["resid_post"]' 16
  echo "== batches: capture resid_post of 12 blocks, 1M tokens"
  local id
  id=$(strata_capture "$work/state" "$work/capture.toml" batches | tail -1)
  "$bin/strata" down >/dev/null
  echo "== batches: shuffled 4096-row batches of layer 6 from the stores"
  PYTHONPATH=$python_dir STRATA_BIN_DIR=$bin python3 "$here/batches_bench.py" "$id" 6 resid_post "$work"/state/workers/* | tee "$out/batches.jsonl"
}

for part in "$@"; do
  case $part in
    all-gpt2) all_sites_part all-gpt2 gpt2-124m 32 2 ;;
    all-llama) all_sites_part all-llama llama-1b 8 1 ;;
    batches) batches_part ;;
    *) echo "unknown part $part (all-gpt2, all-llama, batches)" >&2; exit 2 ;;
  esac
done
