#!/usr/bin/env bash
# GPU check of every capture site and of zero-ablation patch runs (ctest label gpu; exit 77 =
# skipped without a GPU or transformers). For each variant of tests/gpu/family_reference.py (a
# tiny random transformers model of every family, saved with save_pretrained): an extract run of
# every site (docs/extract.md) equals transformers' hooks (tests/gpu/sites_reference.py) in fp32
# within 1e-5 relative at every layer, and patch runs zero-ablating attn_out, mlp_out and
# resid_post at a layer, and mean-ablating attn_out (transformers' mean over the rows), store the
# per-row loss transformers gives with the same hook. One JSON
# line per check (and to $SITES_PARITY_OUT if set). One line to run it on the node:
#   STRATA_BIN_DIR=build/bin bash tests/gpu/sites_gpu_test.sh
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
python3 -c 'import transformers, numpy' 2>/dev/null || { echo "no transformers: skipped"; exit 77; }
work=$(mktemp -d /tmp/strata-sites-gpu-XXXXXX)
export STRATA_STATE_DIR=$work/state
trap '"$bin/strata" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$bin/strata" up --gpus 1 >/dev/null
seq=64
layers=3  # family_reference.py's models
sites="resid_pre resid_mid resid_post attn_out mlp_out q k v attn_pattern mlp_hidden"
failed=0
report() {  # NAME STATUS RESULT_JSON
  local line="{\"check\": \"$1\", \"status\": \"$2\", \"result\": ${3:-null}}"
  echo "$line"
  [ -n "${SITES_PARITY_OUT:-}" ] && echo "$line" >> "$SITES_PARITY_OUT"
  return 0
}
submit() {  # SPEC_FILE -> prints the run id of a finished run
  local out
  out=$("$bin/strata" submit "$1" --follow) || { echo "submit $1 failed: $out" >&2; return 1; }
  printf '%s\n' "$out" | head -1
}
for variant in ${SITES_VARIANTS:-llama3 llama_tied mistral qwen2 qwen3 olmo2 gemma pythia gpt2}; do
  d=$work/$variant
  mkdir -p "$d/ours"
  python3 "$here/family_reference.py" make "$d" "$variant" 8 $seq
  cat > "$d/spec.toml" <<SPEC
name = "sites-$variant"
kind = "extract"
[model]
init_from = "$d"
sequence = $seq
[data]
path = "$d/tokens.u16"
format = "u16"
[extract]
sites = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "attn_pattern", "mlp_hidden", "final_norm", "logits"]
precision = "fp32"
dtype = "fp32"
batch = 4
SPEC
  if ! id=$(submit "$d/spec.toml"); then report "$variant sites" FAILED; failed=1; continue; fi
  for ((l = 0; l < layers; l++)); do
    for site in $sites; do
      "$bin/strata" activations get "$id" --layer $l --site $site --out "$d/ours/l${l}_${site}.npy" >/dev/null
    done
  done
  for site in final_norm logits; do
    "$bin/strata" activations get "$id" --layer $((layers - 1)) --site $site --out "$d/ours/l$((layers - 1))_${site}.npy" >/dev/null
  done
  if result=$(python3 "$here/sites_reference.py" compare "$d" "$d/ours" 0,1,2 $seq); then status=ok; else status=FAILED; failed=1; fi
  report "$variant sites" $status "$result"

  python3 "$here/sites_reference.py" mean "$d" "$d/mean.npy" attn_out 0 $seq
  for ablation in "attn_out 1 zero" "mlp_out 0 zero" "resid_post 1 zero" "attn_out 0 mean"; do
    set -- $ablation
    source=""; mean_arg=""
    if [ "$3" = mean ]; then source="source = \"$d/mean.npy\""; mean_arg="$d/mean.npy"; fi
    cat > "$d/patch-$1-$3.toml" <<SPEC
name = "patch-$variant-$1-$3"
kind = "patch"
[model]
init_from = "$d"
sequence = $seq
[data]
path = "$d/tokens.u16"
format = "u16"
[extract]
precision = "fp32"
dtype = "fp32"
batch = 4
[patch]
layers = [$2]
sites = ["$1"]
ablation = "$3"
$source
SPEC
    if ! id=$(submit "$d/patch-$1-$3.toml"); then report "$variant patch $1 $3" FAILED; failed=1; continue; fi
    "$bin/strata" activations get "$id" --layer $((layers - 1)) --site loss --out "$d/ours/loss-$1-$3.npy" >/dev/null
    if result=$(python3 "$here/sites_reference.py" patch "$d" "$d/ours/loss-$1-$3.npy" "$1" "$2" $seq $mean_arg); then status=ok; else status=FAILED; failed=1; fi
    report "$variant patch $1 at layer $2 ($3)" $status "$result"
  done
done
exit $failed
