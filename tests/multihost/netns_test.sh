#!/usr/bin/env bash
# Multi-host for real, on one machine: four network namespaces joined by veth pairs to a bridge
# (which sits in a fifth namespace, so the machine's own network is left alone) stand for a
# coordinator host (10.77.0.1) and three worker hosts (10.77.0.11-13), each with its own address,
# its own store directory and its own copy of the CURVE keys. Every Strata socket is tcp:// with
# CURVE, as across real hosts; the workers reach each other's stores only through their store
# servers (each reports its own --host).
#
# 1. A short run of examples/gpt2-tiny.toml (dp=2, CPU workers, ZeroMQ data plane) trains across
#    two of the hosts: the reference losses, and each checkpoint shard copied to another host.
# 2. The same run again; once it has a committed checkpoint, one of its hosts goes down whole:
#    every process in that namespace is killed (SIGKILL), its link is deleted and its store
#    directory removed. The run re-plans onto the surviving hosts, resumes from the copies and
#    must finish with the reference losses; its checkpoints read back through the CLI.
# Also: a worker given a --net-interface that its host does not have refuses to start, naming it.
#
# Exit 77 (ctest: skipped) with the reason where namespaces cannot be made (not root, no
# `ip netns`) or the binaries are not built. Everything it makes is named strata-t<PID>-* and
# removed on exit (STRATA_KEEP_TEST_DIRS=1 keeps the temp dir). Environment: STRATA_BUILD_DIR
# (default build/).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${STRATA_BUILD_DIR:-$repo/build}
bin=$build/bin
py=/usr/bin/python3  # Debian's python3 (tests/ read JSON with it; PATH may hold another)
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (ip netns add)"
command -v ip >/dev/null || skip "ip (iproute2) is missing; deploy/install-deps.sh installs it"
for b in strata strata-coordinator strata-worker; do [ -x "$bin/$b" ] || skip "$bin/$b is not built; build first"; done
[ -x "$py" ] || skip "$py is missing (python3-numpy in deploy/install-deps.sh brings it)"

prefix=strata-t$$
subnet=10.77.0
ns_sw=$prefix-sw
hosts=(c w1 w2 w3)            # c: the coordinator host
declare -A addr=([c]=$subnet.1 [w1]=$subnet.11 [w2]=$subnet.12 [w3]=$subnet.13)
work=$(mktemp -d "/tmp/$prefix.XXXXXX")
made_ns=()
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "[$(elapsed) s] $*"; }

cleanup() {
  local rc=$?
  # Processes first (each namespace's, found by the kernel, so only what this test started), then
  # the namespaces; deleting a namespace deletes its veth ends and the bridge with it.
  for ns in "${made_ns[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  done
  sleep 0.2
  for ns in "${made_ns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for f in "$work"/*/log/*.log; do [ -f "$f" ] && { echo "--- tail of $f"; tail -n 25 "$f"; }; done
  fi
  if [ -n "${STRATA_KEEP_TEST_DIRS:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
  log "done (exit $rc)"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- the network: one namespace per host, each with eth0 on the bridge br0 in $ns_sw
ip netns add "$ns_sw" 2>"$work/netns.err" || skip "cannot create a network namespace: $(cat "$work/netns.err")"
made_ns+=("$ns_sw")
ip -n "$ns_sw" link add br0 type bridge || skip "cannot create a bridge in a namespace (no bridge module?)"
# STP stays off (the default), so ports forward as soon as they are up, with no listening delay.
ip -n "$ns_sw" link set br0 up
for h in "${hosts[@]}"; do
  ns=$prefix-$h
  ip netns add "$ns"
  made_ns+=("$ns")
  # Both ends are created inside the namespaces, so no interface name can clash with the machine's.
  ip link add eth0 netns "$ns" type veth peer name "$h" netns "$ns_sw" ||
    skip "cannot create veth pairs between namespaces"
  ip -n "$ns_sw" link set "$h" master br0 up
  ip -n "$ns" addr add "${addr[$h]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  mkdir -p "$work/$h/log"
done
log "network: 4 hosts on $subnet.0/24 through a bridge"

# ---- keys: made on the coordinator host; each worker host gets the directory without coordinator.key
"$bin/strata" keygen "$work/c/keys" >/dev/null
for h in w1 w2 w3; do
  mkdir -m 700 "$work/$h/keys"
  cp -p "$work/c/keys"/{coordinator.pub,client.key,client.pub,authorized_keys} "$work/$h/keys/"
done

coord=tcp://${addr[c]}:5555
in_ns() { local h=$1; shift; ip netns exec "$prefix-$h" "$@"; }
# The CLI on the coordinator host, talking to the coordinator over tcp:// with the client keys.
cli() { STRATA_STATE_DIR=$work/c/cli in_ns c "$bin/strata" --cluster "$coord" --keys "$work/c/keys" "$@"; }
json() { "$py" -c "import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d,list) else d; print($1)"; }

in_ns c "$bin/strata-coordinator" --listen "$coord" --state-dir "$work/c/state" --keys "$work/c/keys" \
  --heartbeat-timeout-ms 1000 --replace-grace-ms 0 >"$work/c/log/coordinator.log" 2>&1 &
start_worker() {  # start_worker HOST [extra flags]: one CPU worker on HOST, named worker-HOST
  local h=$1; shift
  in_ns "$h" "$bin/strata-worker" --name "worker-$h" --host "host-$h" --coordinator "$coord" \
    --store "$work/$h/store" --data-address "tcp://${addr[$h]}:5600" --serve-address "tcp://${addr[$h]}:5601" \
    --keys "$work/$h/keys" --net-interface eth0 "$@" >"$work/$h/log/worker.log" 2>&1 &
}
for h in w1 w2 w3; do start_worker "$h"; done

# A worker whose host has no such interface refuses at once, naming the flag and the interface.
set +e
in_ns w1 "$bin/strata-worker" --name bad --coordinator "$coord" --store "$work/w1/bad" \
  --data-address "tcp://${addr[w1]}:5700" --keys "$work/w1/keys" --net-interface "nosuch0" >"$work/bad.out" 2>&1
bad_rc=$?
set -e
[ $bad_rc -eq 2 ] || fail "a worker with --net-interface nosuch0 exited $bad_rc, want 2: $(cat "$work/bad.out")"
grep -q -- "--net-interface nosuch0" "$work/bad.out" || fail "the refusal does not name the interface: $(cat "$work/bad.out")"

for _ in $(seq 150); do
  n=$(cli workers --json 2>/dev/null | "$py" -c "import json,sys; print(sum(w['state'] != 'lost' for w in json.load(sys.stdin)))" 2>/dev/null || echo 0)
  [ "$n" = 3 ] && break
  sleep 0.2
done
[ "$n" = 3 ] || fail "only $n of 3 workers registered over tcp:// with CURVE"
cli workers --json | "$py" -c "
import json, sys
hosts = sorted(w['host'] for w in json.load(sys.stdin))
assert hosts == ['host-w1', 'host-w2', 'host-w3'], hosts" || fail "the workers do not report their own hosts"
grep -q "NCCL_SOCKET_IFNAME=eth0 (--net-interface)" "$work/w1/log/worker.log" || fail "worker-w1 did not take --net-interface eth0"
log "coordinator + 3 workers registered from 3 hosts"

# ---- the run: examples/gpt2-tiny.toml made short, with frequent checkpoints (all kept: step 4 is read back)
# (2 shared cores run both workers: ~0.15 s a step at this size, 2 s at the example's own).
steps=24
spec() {  # spec NAME: the example under another name, $steps steps of 8 x 64 tokens, a checkpoint every 4
  sed -e "s/^name = .*/name = \"$1\"/" -e "s/^steps = .*/steps = $steps/" -e "s/^checkpoint_every = .*/checkpoint_every = 4\nkeep_checkpoints = 0/" \
    -e "s/^warmup_steps = .*/warmup_steps = 4/" -e "s/^global_batch = .*/global_batch = 8/" -e "s/^sequence = .*/sequence = 64/" \
    "$repo/examples/gpt2-tiny.toml" >"$work/$1.toml"
  grep -q "^steps = $steps" "$work/$1.toml" || fail "examples/gpt2-tiny.toml changed shape; update spec() here"
  echo "$work/$1.toml"
}
cli submit "$(spec reference)" --follow >"$work/reference.follow"
run=$(head -n1 "$work/reference.follow")
cli status "$run" --json >"$work/reference.json"
[ "$(json 'd["state"]' <"$work/reference.json")" = finished ] || fail "the reference run did not finish: $(cat "$work/reference.json"); $(cli events "$run")"
cli events "$run" >"$work/reference.events"
grep -q "committed (2 shards, each with a copy on another host)" "$work/reference.events" ||
  fail "checkpoints were not copied across hosts: $(cat "$work/reference.events")"
log "reference run finished ($steps steps across $(json '" and ".join(d["workers"])' <"$work/reference.json"))"

# ---- the same run, and a whole host lost mid-run
cli submit "$(spec lost)" >"$work/lost.submit"
run=$(head -n1 "$work/lost.submit")
for _ in $(seq 1500); do
  cli status "$run" --json >"$work/lost.json"
  [ "$(json 'int(d["state"] == "running" and len(d["checkpoint_steps"]) > 0 and d["step"] >= 5)' <"$work/lost.json")" = 1 ] && break
  [ "$(json 'd["state"]' <"$work/lost.json")" = finished ] && fail "the run finished before a host could be taken down; raise steps"
  sleep 0.02
done
victim_worker=$(json 'd["workers"][-1]' <"$work/lost.json")
victim=${victim_worker#worker-}
at_step=$(json 'd["step"]' <"$work/lost.json")
pids=$(ip netns pids "$prefix-$victim")
[ -n "$pids" ] || fail "no processes in $prefix-$victim"
kill -9 $pids
ip -n "$ns_sw" link del "$victim"  # deletes both ends: the host is off the network
rm -rf "$work/$victim/store"        # and its disk is gone
log "host $victim (${addr[$victim]}) down at step $at_step: processes killed, link deleted, store removed"

cli status "$run" --watch >/dev/null || true
cli status "$run" --json >"$work/lost.json"
cli events "$run" >"$work/lost.events"
"$py" - "$work/reference.json" "$work/lost.json" "$victim_worker" <<'PY' || fail "the run did not recover with the fault-free losses; events: $(cat "$work/lost.events")"
import json, sys
ref, lost = (json.load(open(p)) for p in sys.argv[1:3])
ref, lost = (d[0] if isinstance(d, list) else d for d in (ref, lost))
victim = sys.argv[3]
assert lost["state"] == "finished", f"state {lost['state']}"
assert victim not in lost["workers"], f"{victim} is still in {lost['workers']}"
a, b = ref["losses"], lost["losses"]
assert len(a) == len(b), f"{len(b)} losses, want {len(a)}"
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: loss {y}, fault-free {x}"
print(f"losses equal to the fault-free run at all {len(a)} steps; finished on {' and '.join(lost['workers'])}")
PY
grep -q "worker-lost" "$work/lost.events" || fail "no worker-lost event: $(cat "$work/lost.events")"
# Resumed from a checkpoint (not from step 0, which would give the same losses too), the lost
# host's shard read from its copy on another host through that host's store server.
grep -Eq "loaded the checkpoint of $run at step [0-9]*[1-9]" "$work/lost.events" ||
  fail "the run did not resume from a checkpoint after the loss: $(cat "$work/lost.events")"
grep -Eq "checkpoint of run $run at step .*\([12] of 2 shards through another host's store server\)" "$work"/w*/log/worker.log ||
  fail "no rank read a shard through another host's store server on resuming"
if grep -q "checkpoint-unreadable" "$work/lost.events"; then fail "a checkpoint became unreadable: $(cat "$work/lost.events")"; fi

# Its checkpoints, the ones written before the loss included, are committed and read back whole.
cli checkpoints "$run" --json >"$work/checkpoints.json"
"$py" - "$work/checkpoints.json" "$steps" <<'PY' || fail "checkpoints: $(cat "$work/checkpoints.json")"
import json, sys
manifests = json.load(open(sys.argv[1]))
steps = sorted(m["step"] for m in manifests)
assert steps and steps[-1] == int(sys.argv[2]), f"checkpoint steps {steps}"
assert 4 in steps, f"the step-4 checkpoint from before the loss is gone: {steps}"
bad = [(m["step"], m["state"], m.get("why")) for m in manifests if m["state"] != "complete"]
assert not bad, f"checkpoints not complete: {bad}"
PY
cli export "$run" --step 4 --out "$work/export" >/dev/null || fail "the step-4 checkpoint (written before the loss) does not export"
[ -s "$work/export/model.safetensors" ] || fail "export wrote no model.safetensors"
log "PASS: run finished on the surviving hosts with the fault-free losses; checkpoints read back"
