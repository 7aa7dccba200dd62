#!/usr/bin/env bash
# deploy/slurm/strata.sbatch against a real Slurm (Debian's slurm-wlm 22.05): this test starts its
# own munged, slurmctld and slurmd (never the system's units), configured in a temporary directory
# (its own slurm.conf, munge key and socket, spool, state and logs, ports away from the defaults),
# with one node of CPU workers. Then:
#   A. `sbatch strata.sbatch SPEC`: the cluster comes up in the job, trains the spec to the end,
#      and the job completes with exit code 0.
#   B. `sbatch strata.sbatch` (no spec) serves; the test, as the login node, sources the job's
#      cluster.env and `strata submit`s a longer run; once it has committed checkpoints, `scancel`.
#      The job ends CANCELLED, with no Strata process of it left.
#   C. A new job over B's directory (STRATA_JOB_DIR) serves the same stores and metadata: the CLI
#      reads B's checkpoints back, every one committed before the cancel complete, and exports one;
#      the cancelled run resumes from the last of them.
# Exit 77 (ctest: skipped) with the reason only where slurmd cannot run here (not root, slurm-wlm
# or munge missing, slurmd or slurmctld failing to start). Environment: STRATA_BUILD_DIR (default
# build/), STRATA_KEEP_TEST_DIRS=1 keeps the temp dir.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${STRATA_BUILD_DIR:-$repo/build}
bin=$build/bin
py=/usr/bin/python3
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd (it starts jobs as their users)"
for t in slurmctld slurmd sbatch srun scancel scontrol sinfo munged mungekey; do
  command -v "$t" >/dev/null || skip "$t is missing: apt-get install slurm-wlm munge (deploy/install-deps.sh installs them)"
done
for b in strata strata-coordinator strata-worker; do [ -x "$bin/$b" ] || skip "$bin/$b is not built; build first"; done
[ -x "$py" ] || skip "$py is missing (python3-numpy in deploy/install-deps.sh brings it)"

work=$(mktemp -d "/tmp/strata-slurm-t$$.XXXXXX")
chmod 755 "$work"  # slurmd runs the jobs' steps from here; munged wants its socket's parents searchable
t0=$(date +%s.%N)
log() { echo "[$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s] $*"; }
daemons=()
jobs_submitted=()
cleanup() {
  local rc=$?
  for j in "${jobs_submitted[@]}"; do scancel "$j" 2>/dev/null || true; done
  # Give slurmd the moment it needs to end the jobs' steps, then stop what this test started.
  for _ in $(seq 50); do
    [ -z "$(pgrep -f -- "$work/job" || true)" ] && break
    sleep 0.2
  done
  for pid in $(pgrep -f -- "$work/job" || true); do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for f in "$work"/log/slurm*.log "$work"/*.out "$work"/job*/logs/*.log; do
      [ -f "$f" ] && { echo "--- tail of $f"; tail -n 20 "$f"; }
    done
  fi
  if [ -n "${STRATA_KEEP_TEST_DIRS:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
  log "done (exit $rc)"
}
trap cleanup EXIT

# ---- munge: a fresh key and a private socket, so the machine's munged (if any) is not involved
mkdir -p "$work"/{munge,state,spool,log}
chmod 700 "$work/munge"
mungekey -c -k "$work/munge/munge.key" 2>"$work/log/mungekey.err" || skip "mungekey cannot make a key: $(cat "$work/log/mungekey.err")"
chmod 400 "$work/munge/munge.key"
munge_sock=$work/munge/munge.sock
munged -F --force --socket="$munge_sock" --key-file="$work/munge/munge.key" --log-file="$work/log/munged.log" \
  --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/seed" >"$work/log/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 50); do [ -S "$munge_sock" ] && break; sleep 0.1; done
[ -S "$munge_sock" ] || skip "munged did not start: $(cat "$work/log/munged.out" "$work/log/munged.log" 2>/dev/null)"

# ---- slurm.conf: one node (this machine at 127.0.0.1) with all its CPUs, no cgroups (linuxproc
# tracks the jobs' processes), no accounting; ports picked free near 26800-28800.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 20); do
  ctld_port=$((26800 + (RANDOM % 1000) * 2)); slurmd_port=$((ctld_port + 1))
  port_free "$ctld_port" && port_free "$slurmd_port" && break
done
node=strata-t$$-n1
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=stratat$$
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=15
MinJobAge=600
NodeName=$node NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=strata Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -N "$node" -f "$SLURM_CONF" >"$work/log/slurmd.out" 2>&1 &
daemons+=($!)
for _ in $(seq 100); do
  [ "$(sinfo -h -n "$node" -o %t 2>/dev/null)" = idle ] && break
  sleep 0.2
done
if [ "$(sinfo -h -n "$node" -o %t 2>/dev/null)" != idle ]; then
  skip "slurmd/slurmctld did not bring up the node (state '$(sinfo -h -n "$node" -o %t 2>&1)'): $(tail -n 5 "$work/log/slurmd.out" "$work/log/slurmd.log" "$work/log/slurmctld.log" 2>/dev/null)"
fi
log "slurmctld + slurmd + munged up (ports $ctld_port, $slurmd_port), node $node idle"

spec() {  # spec NAME STEPS: examples/gpt2-tiny.toml, smaller batches, a checkpoint every 4 steps
  sed -e "s/^name = .*/name = \"$1\"/" -e "s/^steps = .*/steps = $2/" -e "s/^checkpoint_every = .*/checkpoint_every = 4/" \
    -e "s/^warmup_steps = .*/warmup_steps = 4/" -e "s/^global_batch = .*/global_batch = 8/" -e "s/^sequence = .*/sequence = 64/" \
    "$repo/examples/gpt2-tiny.toml" >"$work/$1.toml"
  echo "$work/$1.toml"
}
# The job's fields: JobState, ExitCode (MinJobAge keeps ended jobs listed).
job_field() { scontrol show job "$1" -o | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_job_end() {  # wait_job_end ID SECONDS
  for _ in $(seq $(($2 * 5))); do
    case $(job_field "$1" JobState) in PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED) sleep 0.2 ;; *) return 0 ;; esac
  done
  fail "job $1 still $(job_field "$1" JobState) after $2 s"
}
submit_job() {  # submit_job NAME JOB_DIR NET_INTERFACE [SPEC]: sbatch as a user would, from $work (the submit dir)
  local name=$1 dir=$2 iface=$3; shift 3
  local id
  id=$(cd "$work" && STRATA_BIN_DIR=$bin STRATA_JOB_DIR=$dir STRATA_CPU_WORKERS=2 STRATA_HEARTBEAT_TIMEOUT_MS=2000 \
    STRATA_NET_INTERFACE=$iface sbatch --parsable --output="$work/$name.out" "$repo/deploy/slurm/strata.sbatch" "$@")
  jobs_submitted+=("$id")
  echo "$id"
}

# ---- A: a spec trained to the end inside the job
# (addresses from Slurm's NodeAddr)
a=$(submit_job a "$work/jobA" "" "$(spec slurm-a 16)")
wait_job_end "$a" 90
[ "$(job_field "$a" JobState)" = COMPLETED ] && [ "$(job_field "$a" ExitCode)" = 0:0 ] ||
  fail "job A: $(job_field "$a" JobState) exit $(job_field "$a" ExitCode), want COMPLETED 0:0; $(cat "$work/a.out")"
grep -q "^run slurm-a-.* finished: 16 steps" "$work/a.out" || fail "job A's output has no finished run: $(cat "$work/a.out")"
grep -q "cluster up on $node: coordinator tcp://127.0.0.1:.*, 2 worker(s)" "$work/a.out" || fail "job A: $(cat "$work/a.out")"
log "job A: trained to the end (16 steps) and completed"

# ---- B: serve, submit from the "login node", scancel mid-run
# (addresses from STRATA_NET_INTERFACE, here lo, which also reaches each worker as --net-interface)
b=$(submit_job b "$work/jobB" lo)
for _ in $(seq 300); do [ -f "$work/jobB/cluster.env" ] && break; sleep 0.2; done
[ -f "$work/jobB/cluster.env" ] || fail "job B's cluster did not come up: $(cat "$work/b.out")"
# shellcheck disable=SC1091
source "$work/jobB/cluster.env"
export STRATA_STATE_DIR=$work/login  # nothing local to find: the CLI uses STRATA_CLUSTER / STRATA_KEYS
strata() { "$bin/strata" "$@"; }
run=$(strata submit "$(spec slurm-b 400)" | head -n1 || true)
[ -n "$run" ] || fail "submit to job B's cluster from outside the job failed"
for _ in $(seq 600); do
  strata status "$run" --json >"$work/b.json"
  [ "$("$py" -c "import json; d=json.load(open('$work/b.json')); d=d[0] if isinstance(d,list) else d; print(int(len(d['checkpoint_steps']) >= 2))")" = 1 ] && break
  sleep 0.1
done
committed=$("$py" -c "import json; d=json.load(open('$work/b.json')); d=d[0] if isinstance(d,list) else d; print(' '.join(map(str, d['checkpoint_steps'])))")
[ -n "$committed" ] || fail "run $run committed no checkpoint: $(cat "$work/b.json")"
scancel "$b"
wait_job_end "$b" 60
[ "$(job_field "$b" JobState)" = CANCELLED ] || fail "job B: $(job_field "$b" JobState) after scancel"
left=$(pgrep -f -- "$work/jobB" || true)
[ -z "$left" ] || fail "processes of job B outlived it: $(ps -o pid,args -p "$left" | tail -n +2)"
grep -q "NCCL_SOCKET_IFNAME=lo (--net-interface)" "$work"/jobB/logs/worker-*-0.log || fail "job B's workers were not given --net-interface lo"
log "job B: $run cancelled by scancel after checkpoints at steps $committed"

# ---- C: the same directory in a new job; the CLI reads B's checkpoints back
rm -f "$work/jobB/cluster.env"
c=$(submit_job c "$work/jobB" lo)
for _ in $(seq 300); do [ -f "$work/jobB/cluster.env" ] && break; sleep 0.2; done
[ -f "$work/jobB/cluster.env" ] || fail "job C's cluster did not come up: $(cat "$work/c.out")"
source "$work/jobB/cluster.env"
for f in "$work"/jobB/logs/worker-*.log; do  # job C's workers registered anew (the logs are appended)
  [ "$(grep -c "registered with the coordinator" "$f")" -ge 2 ] || fail "job C's cluster was announced before $(basename "$f" .log) registered"
done
strata checkpoints "$run" --json >"$work/checkpoints.json" || fail "strata checkpoints $run failed after the restart"
"$py" - "$work/checkpoints.json" $committed <<'PY' || fail "checkpoints after scancel: $(cat "$work/checkpoints.json")"
import json, sys
manifests = {m["step"]: m for m in json.load(open(sys.argv[1]))}
for step in map(int, sys.argv[2:]):
    assert step in manifests, f"the checkpoint at step {step}, committed before scancel, is gone: {sorted(manifests)}"
    assert manifests[step]["state"] == "complete", f"step {step}: {manifests[step]['state']} {manifests[step].get('why')}"
    assert manifests[step]["tensor_count"] > 0, f"step {step} has no tensors"
PY
last=${committed##* }
strata export "$run" --step "$last" --out "$work/export" >/dev/null || fail "strata export $run --step $last failed"
[ -s "$work/export/model.safetensors" ] || fail "export wrote no model.safetensors"
# And the run itself continues in the new job, from the last checkpoint the cancel left.
for _ in $(seq 150); do
  strata events "$run" >"$work/b.events"
  grep -q "loaded the checkpoint of $run at step $last" "$work/b.events" && break
  sleep 0.2
done
grep -q "loaded the checkpoint of $run at step $last" "$work/b.events" || fail "run $run did not resume from step $last in job C: $(cat "$work/b.events")"
scancel "$c"
wait_job_end "$c" 60
log "PASS: job C read back the checkpoints at steps $committed of the cancelled run, exported step $last and resumed the run there"
