#!/usr/bin/env bash
# `strata status --json` (the listing of all runs) against a real coordinator holding RUNS runs
# (issue #20, item 10: 611 ms p50 with 450 runs before). The runs are real submissions through
# the CLI to a coordinator without workers: they stay pending; every other one is cancelled, so
# the listing mixes live and terminal runs. Pending and cancelled runs have no loss history, so
# this measures the listing's request count and per-run work, not shipping losses (item 10 also
# leaves those out).
#
# Usage: bench/status_bench.sh [BUILD_DIR] [RUNS] [REPEATS]
#   OLD_STRATA=/path/to/strata  also time that CLI (e.g. one built before the change) on the same runs
# Prints p50/p95/max in ms for each CLI.
set -euo pipefail
BUILD=${1:-build}
RUNS=${2:-1000}
REPEATS=${3:-50}
BIN=$(cd "$BUILD/bin" && pwd)
dir=$(mktemp -d /tmp/strata-status-bench-XXXXXX)
coordinator_pid=
cleanup() {
  [ -n "$coordinator_pid" ] && kill "$coordinator_pid" 2>/dev/null && wait "$coordinator_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

endpoint="ipc://$dir/coordinator.sock"
"$BIN/strata-coordinator" --listen "$endpoint" --state-dir "$dir/coordinator" >"$dir/coordinator.log" 2>&1 &
coordinator_pid=$!
strata() { "$BIN/strata" --cluster "$endpoint" "$@"; }
for _ in $(seq 100); do strata --timeout-ms 300 workers --json >/dev/null 2>&1 && break; sleep 0.1; done

head -c 20000 /dev/urandom | base64 >"$dir/corpus.txt"
cat >"$dir/spec.toml" <<TOML
name = "bench"
[model]
layers = 1
hidden = 32
heads = 2
vocab = 256
sequence = 16
[data]
path = "$dir/corpus.txt"
[train]
steps = 1000
global_batch = 4
checkpoint_every = 100
TOML
start=$(date +%s)
for i in $(seq "$RUNS"); do
  id=$(strata submit "$dir/spec.toml" --skip-estimate 2>/dev/null | head -1)
  if [ $((i % 2)) -eq 0 ]; then strata cancel "$id" >/dev/null; fi
done
echo "submitted $RUNS runs (half cancelled) in $(( $(date +%s) - start )) s"

time_listing() {  # CLI label
  local cli=$1 label=$2 t0 t1 n
  n=$("$cli" --cluster "$endpoint" status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  for _ in $(seq "$REPEATS"); do
    t0=$(date +%s%N)
    "$cli" --cluster "$endpoint" status --json >/dev/null
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000 ))
  done | sort -n | awk -v label="$label" -v runs="$n" '{ v[NR] = $1 } END {
    p50 = v[int((NR + 1) * 0.50)]; p95 = v[int((NR * 0.95) + 0.5)];
    printf "%s: %d runs listed, %d calls: p50 %.1f ms, p95 %.1f ms, max %.1f ms\n", label, runs, NR, p50 / 1000, p95 / 1000, v[NR] / 1000 }'
}
time_listing "$BIN/strata" "strata status --json"
if [ -n "${OLD_STRATA:-}" ]; then time_listing "$OLD_STRATA" "before (OLD_STRATA) status --json"; fi
# One run's detail keeps its whole history and checkpoint steps.
one=$(strata status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["run_id"])')
t0=$(date +%s%N); strata status "$one" --json --losses >/dev/null; t1=$(date +%s%N)
echo "strata status RUN --json --losses: $(( (t1 - t0) / 1000000 )) ms"
