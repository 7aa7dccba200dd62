# Sourced by the capture benchmarks (extract_bench.sh, activations_bench.sh); needs $bin (the
# build's bin/) and $out (the results directory).
#
# strata_capture STATE_DIR SPEC LABEL: starts a one-GPU local cluster in STATE_DIR, submits SPEC
# (an extract run), waits for it to end, writes $out/{events,activations,strata}-LABEL.json (the
# last: tokens, bytes, seconds from the run's `assigned` to its `finished` event - every chunk
# durable - GB/s, tokens/s) and prints the run id on its last line. The cluster stays up.
strata_capture() {
  export STRATA_STATE_DIR=$1
  "$bin/strata" up --gpus 1 >/dev/null
  local submitted id
  submitted=$("$bin/strata" submit "$2")
  id=${submitted%%$'\n'*}
  while "$bin/strata" status "$id" --json | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["state"] in ("running", "pending") else 1)'; do sleep 0.2; done
  "$bin/strata" events "$id" --json > "$out/events-$3.json"
  "$bin/strata" activations "$id" --json > "$out/activations-$3.json"
  python3 - "$out/events-$3.json" "$out/activations-$3.json" "$3" <<'PY' | tee "$out/strata-$3.json"
import json, sys
events = json.load(open(sys.argv[1]))
index = json.load(open(sys.argv[2]))
start = next(e["unix_ms"] for e in events if e["kind"] == "assigned")
end = next(e["unix_ms"] for e in events if e["kind"] == "finished")
seconds = (end - start) / 1000
print(json.dumps({"method": "strata extract (" + sys.argv[3] + ")", "tokens": index["rows_stored"], "bytes": index["bytes"],
                  "seconds": seconds, "GB_per_s": round(index["bytes"] / seconds / 1e9, 3),
                  "tokens_per_s": round(index["rows_stored"] / seconds)}))
PY
  echo "$id"
}
