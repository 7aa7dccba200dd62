#!/usr/bin/env bash
# GPU check of every model family (ctest label gpu; exit 77 = skipped without a GPU or
# transformers): for each variant of tests/gpu/family_reference.py, a tiny random transformers
# model saved as several safetensors files is captured by an extract run whose [model] holds
# only init_from and sequence; every layer and site must equal transformers' module outputs in
# fp32 within 1e-5 relative. Prints one JSON line per variant (and to $FAMILY_PARITY_OUT if set).
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
python3 -c 'import transformers, numpy' 2>/dev/null || { echo "no transformers: skipped"; exit 77; }
work=$(mktemp -d /tmp/strata-family-gpu-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$bin/strata" up --gpus 1 >/dev/null
seq=64
failed=0
for variant in ${FAMILY_VARIANTS:-llama3 llama_tied mistral qwen2 qwen3 olmo2 gemma pythia gpt2}; do
  d=$work/$variant
  mkdir -p "$d/ours"
  python3 "$here/family_reference.py" make "$d" "$variant" 8 $seq
  cat > "$d/spec.toml" <<SPEC
name = "family-$variant"
kind = "extract"
[model]
init_from = "$d"
sequence = $seq
[data]
path = "$d/tokens.u16"
format = "u16"
[extract]
sites = ["resid_post", "attn_out", "mlp_out"]
precision = "fp32"
dtype = "fp32"
batch = 4
SPEC
  out=$("$bin/strata" submit "$d/spec.toml" --follow) || { echo "$variant: submit failed: $out"; failed=1; continue; }
  id=$(printf '%s\n' "$out" | head -1)
  for l in 0 1 2; do
    for site in resid_post attn_out mlp_out; do
      "$bin/strata" activations get "$id" --layer $l --site $site --out "$d/ours/l${l}_${site}.npy" >/dev/null
    done
  done
  if result=$(python3 "$here/family_reference.py" compare "$d" "$d/ours" 0,1,2 $seq); then status=ok; else status=FAILED; failed=1; fi
  line="{\"variant\": \"$variant\", \"status\": \"$status\", \"result\": $result}"
  echo "$line"
  [ -n "${FAMILY_PARITY_OUT:-}" ] && echo "$line" >> "$FAMILY_PARITY_OUT"
done
exit $failed
