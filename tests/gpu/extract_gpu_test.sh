#!/usr/bin/env bash
# GPU checks of extract runs (ctest label gpu; exit 77 = skipped without a GPU or transformers):
#  1. For a GPT-2 and a Llama model made by transformers (save_pretrained), the residual stream
#     Strata stores (bf16 compute, bf16 storage) equals transformers' block outputs within bf16
#     tolerance.
#  2. With the GPU capped (strata up --memory-limit) so that the first batch runs out of memory,
#     the run halves its batch (an "oom" event), finishes, and its data equals an uncapped run's.
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
python3 -c 'import transformers, numpy' 2>/dev/null || { echo "no transformers: skipped"; exit 77; }
work=$(mktemp -d /tmp/strata-extract-gpu-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

run_extract() {  # NAME SPEC_BODY -> prints the run id once finished
  printf '%s\n' "$2" > "$work/$1.toml"
  local out id
  out=$("$bin/strata" submit "$work/$1.toml" --follow)
  id=$(printf '%s\n' "$out" | head -1)
  [ "$("$bin/strata" status "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" = finished ] ||
    { "$bin/strata" events "$id" >&2; echo "run $id did not finish" >&2; return 1; }
  echo "$id"
}

"$bin/strata" up --gpus 1 >/dev/null
seq=128
for family in gpt2 llama; do
  d=$work/$family
  mkdir -p "$d"
  python3 "$here/extract_reference.py" make "$d" $family 48 $seq
  if [ $family = gpt2 ]; then model='family = "gpt2"
heads = 4'; else model='family = "llama"
heads = 8
kv_heads = 2
ffn = 704'; fi
  id=$(run_extract "$family" "name = \"$family-hf\"
kind = \"extract\"
[model]
$model
layers = 4
hidden = 256
vocab = 1000
sequence = $seq
init_from = \"$d\"
[data]
path = \"$d/tokens.u16\"
format = \"u16\"
[extract]
precision = \"bf16\"
dtype = \"bf16\"
batch = 16")
  for l in 0 1 2 3; do "$bin/strata" activations get "$id" --layer $l --out "$d/ours$l.npy" 2>/dev/null; done
  python3 "$here/extract_reference.py" compare "$d" "$d/ours" 0,1,2,3 $seq
done

# OOM: GPT-2 124M (transformers' default config), 32 sequences of 1024 per batch.
d=$work/gpt2-124m
mkdir -p "$d"
python3 "$here/extract_reference.py" make "$d" gpt2-124m 64 1024
spec="kind = \"extract\"
[model]
family = \"gpt2\"
layers = 12
hidden = 768
heads = 12
vocab = 50257
sequence = 1024
init_from = \"$d\"
[data]
path = \"$d/tokens.u16\"
format = \"u16\"
[extract]
layers = [3, 11]
precision = \"bf16\"
dtype = \"bf16\"
batch = 32"
free=$(run_extract free "name = \"uncapped\"
$spec")
"$bin/strata" activations get "$free" --layer 11 --out "$d/free.npy" 2>/dev/null
"$bin/strata" down >/dev/null
"$bin/strata" up --gpus 1 --memory-limit ${STRATA_TEST_GPU_CAP:-450MiB} >/dev/null
capped=$(run_extract capped "name = \"capped\"
$spec
mode = \"whole\"")
"$bin/strata" events "$capped" | grep -E "oom" || { echo "the capped run never ran out of memory: lower the cap" >&2; exit 1; }
"$bin/strata" activations get "$capped" --layer 11 --out "$d/capped.npy" 2>/dev/null
python3 "$here/extract_reference.py" same "$d/free.npy" "$d/capped.npy"

# A GPU smaller than the model (GPT-2 124M is 0.24 GiB of bf16 weights): "auto" runs it layer by
# layer and stores the same data.
"$bin/strata" down >/dev/null
"$bin/strata" up --gpus 1 --memory-limit ${STRATA_TEST_SMALL_GPU:-200MiB} >/dev/null
small=$(run_extract small "name = \"smaller-than-model\"
$spec")
"$bin/strata" events "$small" | grep -E "plan|oom"
"$bin/strata" events "$small" | grep -q "layer by layer" || { echo "auto did not choose layer-by-layer execution" >&2; exit 1; }
"$bin/strata" activations get "$small" --layer 11 --out "$d/small.npy" 2>/dev/null
python3 "$here/extract_reference.py" same "$d/free.npy" "$d/small.npy"
echo "extract GPU checks passed"
