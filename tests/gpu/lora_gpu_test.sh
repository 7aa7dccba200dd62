#!/usr/bin/env bash
# GPU check of LoRA (ctest label gpu; exit 77 = skipped without a GPU, transformers or peft):
# a bf16 LoRA run on a GPU worker fine-tunes a transformers-made Llama (all-linear, r = 8), its
# adapters are exported with `strata export --adapter` and the merged model with `--merge`; PEFT
# loads the adapters onto the base, and its logits equal the logits Strata computes for the merged
# model (an extract run), while the base's own differ. Then QLoRA (lora.base = "nf4") on the GPU:
# step 1 within 2% of the dense base's, the adapters train, the export holds the same tensors.
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
python3 -c 'import transformers, peft, numpy' 2>/dev/null || { echo "no transformers or peft: skipped"; exit 77; }
work=$(mktemp -d /tmp/strata-lora-gpu-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

run() {  # NAME SPEC_BODY -> prints the run id once finished
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
d=$work/base
mkdir -p "$d"
python3 "$here/extract_reference.py" make "$d" llama 64 $seq
model="family = \"llama\"
heads = 8
kv_heads = 2
ffn = 704
layers = 4
hidden = 256
vocab = 1000
sequence = $seq
init_from = \"$d\""
train=$(run lora "name = \"lora\"
[model]
$model
[data]
path = \"$d/tokens.u16\"
format = \"u16\"
[train]
steps = 30
global_batch = 8
lr = 0.003
precision = \"bf16\"
checkpoint_every = 30
[lora]
rank = 8
alpha = 16
target_modules = \"all-linear\"")
"$bin/strata" status "$train" --json | python3 -c 'import json,sys; l = json.load(sys.stdin)["losses"]; print("losses", l[0], "->", l[-1]); assert l[-1] < l[0]'
"$bin/strata" export "$train" --adapter --out "$work/adapter"
"$bin/strata" export "$train" --merge --out "$work/merged"
merged_model=${model//$d/$work/merged}
logits=$(run logits "name = \"merged-logits\"
kind = \"extract\"
[model]
$merged_model
[data]
path = \"$d/tokens.u16\"
format = \"u16\"
[extract]
sites = [\"logits\"]
layers = [3]
precision = \"fp32\"
dtype = \"fp32\"
batch = 4
tokens = $((4 * seq))")
"$bin/strata" activations get "$logits" --layer 3 --site logits --out "$work/ours.npy" >/dev/null
python3 "$here/lora_reference.py" compare "$d" "$work/adapter" "$work/ours.npy" $seq

# QLoRA: the same run over an NF4 base (quantized on the GPU as it loads). Step 1's loss is the NF4
# base model's (B = 0), within the quantization's reach of the dense base's; the adapters train;
# the export has the dense run's tensors; and the worker's measured peak is within the planner's
# estimate.
qlora=$(run qlora "name = \"qlora\"
[model]
$model
[data]
path = \"$d/tokens.u16\"
format = \"u16\"
[train]
steps = 30
global_batch = 8
lr = 0.003
precision = \"bf16\"
checkpoint_every = 30
[lora]
rank = 8
alpha = 16
target_modules = \"all-linear\"
base = \"nf4\"")
"$bin/strata" export "$qlora" --adapter --out "$work/qlora-adapter"
"$bin/strata" status "$train" --json >"$work/dense.json"
"$bin/strata" status "$qlora" --json >"$work/qlora.json"
python3 - "$work" <<'PY'
import json, sys
from safetensors import safe_open
work = sys.argv[1]
dense, qlora = (json.load(open(f"{work}/{n}.json")) for n in ("dense", "qlora"))
ld, lq = dense["losses"], qlora["losses"]
print("qlora losses", lq[0], "->", lq[-1], "; dense step 1", ld[0])
assert lq[-1] < lq[0], "the QLoRA adapters did not train"
assert abs(lq[0] - ld[0]) / ld[0] < 0.02, "step 1 of the NF4 base is not within 2% of the dense base's"
keys = lambda p: set(safe_open(p, "np").keys())
assert keys(f"{work}/qlora-adapter/adapter_model.safetensors") == keys(f"{work}/adapter/adapter_model.safetensors")
for name, run in (("dense", dense), ("qlora", qlora)):
    for m in run["memory"]:
        print(name, "estimate", m["estimate_bytes"], "measured peak", m["measured_peak_bytes"])
PY
