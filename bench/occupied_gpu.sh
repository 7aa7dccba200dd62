#!/usr/bin/env bash
# The planner against a GPU another process already uses (issue #4): hold OCCUPY_GIB (default 40)
# on cuda:0 from a separate PyTorch process, start one Strata worker there, and check that
# `strata plan` sees the reduced free memory, refuses the naive fixed plan, picks one that fits,
# and that the run then trains without running out of memory. GPT-2 774M, bf16, global batch 16.
#
# usage: STRATA_BIN_DIR=build/bin bash bench/occupied_gpu.sh [OUT_DIR]
set -euo pipefail
bin=${STRATA_BIN_DIR:?}
out=${1:-.}
occupy=${OCCUPY_GIB:-40}
work=$(mktemp -d /tmp/strata-occupied-XXXXXX)
export STRATA_STATE_DIR=$work/state
python3 - "$work" "$occupy" <<'PY' &
import sys, time, torch
x = torch.empty(int(sys.argv[2]) << 30, dtype=torch.uint8, device="cuda:0")
open(sys.argv[1] + "/ready", "w").close()
time.sleep(900)
PY
holder=$!
trap '"$bin/strata" down >/dev/null 2>&1 || true; kill $holder 2>/dev/null || true; rm -rf "$work"' EXIT
while [ ! -f "$work/ready" ]; do sleep 0.5; done
python3 -c "
import array, os
raw = array.array('H', os.urandom(2 * (4 << 20)))
array.array('H', (t % 50257 for t in raw)).tofile(open('$work/tokens.u16', 'wb'))"
"$bin/strata" up --gpus 1 >/dev/null
sleep 3  # the first heartbeats carry the worker's free memory
spec() {  # NAME PARALLEL_LINES
  printf '%s\n' "name = \"$1\"" "[model]" "family = \"gpt2\"" "layers = 36" "hidden = 1280" "heads = 20" "vocab = 50257" \
    "sequence = 1024" "[data]" "path = \"$work/tokens.u16\"" "format = \"u16\"" "[train]" "steps = 1000" "global_batch = 16" \
    "lr = 0.0003" "precision = \"bf16\"" "[parallel]" "$2" "[worker]" "threads = 8" > "$work/$1.toml"
  echo "$work/$1.toml"
}
"$bin/strata" workers --json > "$out/occupied-workers.json"
echo "== worker as the coordinator sees it (another process holds ${occupy} GiB):"
python3 -c "import json; w = json.load(open('$out/occupied-workers.json'))[0]; m = w['memory']; print('free', round(m['free_bytes'] / 2**30, 1), 'GiB of', round(m['total_bytes'] / 2**30, 1))"
naive=$(spec naive "micro_batch = 16
recompute = false")
echo "== naive plan (micro_batch 16, no recompute):"
"$bin/strata" plan "$naive" 2>&1 | tail -4 || true
"$bin/strata" submit "$naive" > "$out/naive-submit.txt" 2>&1 && echo "naive: SUBMITTED (unexpected)" || echo "naive: refused: $(tail -1 "$out/naive-submit.txt" | cut -c1-300)"
auto=$(spec auto "")
echo "== auto plan:"
"$bin/strata" plan "$auto" --json > "$out/auto-plan.json"
python3 -c "
import json; p = json.load(open('$out/auto-plan.json')); w = p['workers'][0]
print(p['why']); print('estimate', round(w['estimate']['total'] / 2**30, 2), 'GiB, budget', round(w['budget'] / 2**30, 2), 'GiB')"
id=$("$bin/strata" submit "$auto" | head -1)
for _ in $(seq 1 240); do
  s=$("$bin/strata" status "$id" --json)
  state=$(printf '%s' "$s" | python3 -c "import json, sys; s = json.load(sys.stdin); print(s['state'] if s['state'] != 'running' or s['step'] < 5 else 'done')")
  [ "$state" = pending ] || [ "$state" = running ] || break
  sleep 1
done
"$bin/strata" cancel "$id" >/dev/null 2>&1 || true
sleep 1
"$bin/strata" status "$id" --json > "$out/auto-status.json"
"$bin/strata" events "$id" > "$out/auto-events.txt" || true
python3 -c "
import json; s = json.load(open('$out/auto-status.json')); m = s['memory'][0] if s['memory'] else {}
print('auto run:', s['state'], 'after', s['step'], 'steps;', s.get('message', ''))
if m: print('estimate', round(m['estimate_bytes'] / 2**30, 2), 'GiB + workspace', round(m['workspace_bytes'] / 2**30, 2), '; measured peak', round(m['measured_peak_bytes'] / 2**30, 2), 'GiB')"
grep -i "oom\|out of memory" "$out/auto-events.txt" && echo "OOM seen" || echo "no OOM"
