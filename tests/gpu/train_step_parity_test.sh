#!/usr/bin/env bash
# Train-step check of the model families (ctest label gpu, as it needs the GPU node's PyTorch and
# transformers; exit 77 = skipped without them): for each variant of tests/gpu/family_reference.py,
# a run on one CPU worker from init_from alone (fp32, 4 steps) gives every step's loss of the same
# steps taken in PyTorch (tests/gpu/train_step_reference.py) within 1e-5 relative: the forward,
# the gradients (steps 2-4 follow from them) and AdamW. Prints one JSON line per variant (and to
# $TRAIN_STEP_PARITY_OUT if set).
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)
python3 -c 'import transformers, numpy, torch' 2>/dev/null || { echo "no PyTorch / transformers: skipped"; exit 77; }
work=$(mktemp -d /tmp/strata-train-step-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$bin/strata" up --workers 1 >/dev/null
seq=32 batch=4 lr=0.003 seed=7
failed=0
for variant in ${TRAIN_STEP_VARIANTS:-llama3 qwen3 olmo2}; do
  d=$work/$variant
  mkdir -p "$d"
  python3 "$here/family_reference.py" make "$d" "$variant" 16 $seq
  cat > "$d/spec.toml" <<SPEC
name = "step-$variant"
[model]
init_from = "$d"
sequence = $seq
[data]
path = "$d/tokens.u16"
format = "u16"
[train]
steps = 4
global_batch = $batch
lr = $lr
lr_schedule = "constant"
warmup_steps = 0
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.999
eps = 1e-8
grad_clip = 0.0
seed = $seed
precision = "fp32"
checkpoint_every = 0
[parallel]
dp = 1
SPEC
  out=$("$bin/strata" submit "$d/spec.toml" --follow) || { echo "$variant: submit failed: $out"; failed=1; continue; }
  id=$(printf '%s\n' "$out" | head -1)
  "$bin/strata" status "$id" --json >"$d/status.json"
  if result=$(python3 "$here/train_step_reference.py" compare "$d" "$d/status.json" $seq $batch $lr $seed); then
    status=ok
  else
    status=FAILED
    failed=1
  fi
  line="{\"variant\": \"$variant\", \"status\": \"$status\", \"result\": ${result:-null}}"
  echo "$line"
  [ -n "${TRAIN_STEP_PARITY_OUT:-}" ] && echo "$line" >> "$TRAIN_STEP_PARITY_OUT"
done
exit $failed
