#!/usr/bin/env bash
# Offline bundle, end to end: packs build/bin with deploy/bundle.sh, unpacks a minimal Debian 12
# (debootstrap --variant=minbase, cached) into a temp dir and, inside it with NO network
# (unshare --net, checked), installs from the archive and runs what a user runs: `strata up
# --workers 2`, a short 2-worker run followed to the end, its checkpoints, `strata down`.
# Prints each phase's time. Exit 77 (ctest: skipped) when it cannot run here: not root, or
# debootstrap/unshare missing, or the binaries are not built.
# Environment: STRATA_BUILD_DIR (default build/), STRATA_DEBOOTSTRAP_CACHE and STRATA_DEBIAN_MIRROR
# (tests/deploy/debian_base.sh), STRATA_KEEP_TEST_DIRS=1 keeps the temp dir.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${STRATA_BUILD_DIR:-$repo/build}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, chroot, unshare --net)"
for t in debootstrap unshare chroot mount; do command -v "$t" >/dev/null || skip "$t is missing (deploy/install-deps.sh installs it)"; done
[ -x "$build/bin/strata-worker" ] || skip "$build/bin has no binaries; build first"

now() { date +%s.%N; }
phase_start=$(now)
phase() {  # phase NAME: prints the time since the previous phase ended
  local t; t=$(now)
  printf 'PHASE %-28s %6.1f s\n' "$1" "$(echo "$t - $phase_start" | bc -l 2>/dev/null || awk "BEGIN{print $t - $phase_start}")"
  phase_start=$t
}

work=$(mktemp -d /tmp/strata-bundle-test.XXXXXX)
root=$work/root
cleanup() {
  # The cluster and the mounts live in the unshared namespaces and die with them; only files remain.
  if [ -n "${STRATA_KEEP_TEST_DIRS:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# 1. A minimal Debian 12 root, debootstrapped once per machine and cached as a tarball
# (tests/deploy/debian_base.sh: ~30 s cold with a nearby mirror, ~3 s to unpack afterwards).
tarball=$(bash "$repo/tests/deploy/debian_base.sh")
mkdir -p "$root"
tar -C "$root" -xf "$tarball"
phase "unpack Debian 12 root"

# 2. The bundle, made by the same script the Docker image build uses.
"$repo/deploy/bundle.sh" "$work/strata-bundle.tar.gz"
size_mb=$(du -m "$work/strata-bundle.tar.gz" | cut -f1)
phase "bundle.sh (${size_mb} MB)"

# 3. Into the root: the archive, a corpus the spec points at (not the system's GPL file: the run
# must only need what we put there) and a short spec like the README demo.
mkdir -p "$root/tmp/bundle" "$root/srv/strata"
cp "$work/strata-bundle.tar.gz" "$root/tmp/bundle/"
cp /usr/share/common-licenses/GPL-3 "$root/srv/strata/corpus.txt"
cat > "$root/srv/strata/tiny.toml" <<'SPEC'
name = "offline-tiny"
[model]
layers = 2
hidden = 64
heads = 4
vocab = 256
sequence = 32
[data]
path = "corpus.txt"
format = "bytes"
[train]
steps = 6
global_batch = 8
lr = 3e-3
seed = 7
checkpoint_every = 3
[parallel]
dp = 2
[worker]
threads = 1
SPEC
cat > "$root/tmp/inside.sh" <<'INSIDE'
#!/bin/sh
# Runs inside the chroot, with no network.
set -eu
export HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin LC_ALL=C
t0=$(date +%s.%N)
lap() { t=$(date +%s.%N); awk -v a="$t0" -v b="$t" -v n="$1" 'BEGIN{printf "PHASE %-28s %6.1f s\n", n, b - a}'; t0=$t; }
ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')
[ "$ifaces" = "lo " ] || { echo "FAIL: expected no network but saw interfaces: $ifaces"; exit 1; }
command -v apt-get >/dev/null && mv "$(command -v apt-get)" /usr/bin/apt-get.disabled  # prove no package manager is used
cd /tmp/bundle
tar xzf strata-bundle.tar.gz
./strata-bundle/install.sh
lap "install.sh"
strata up --workers 2
strata workers
lap "strata up --workers 2"
strata submit /srv/strata/tiny.toml --follow > follow.log
cat follow.log
run=$(head -n1 follow.log)
lap "submit --follow (6 steps)"
status=$(strata status "$run" --json)
echo "$status" | grep -Eq '"state": *"finished"' || { echo "FAIL: run $run did not finish: $status"; strata events "$run" || true; exit 1; }
echo "$status" | grep -Eq '"step": *6[,}]' || { echo "FAIL: run $run did not reach step 6: $status"; exit 1; }
strata checkpoints "$run"
n=$(strata checkpoints "$run" --json | grep -o '"step"' | wc -l)
[ "$n" -eq 2 ] || { echo "FAIL: expected 2 checkpoints (steps 3, 6), got $n"; exit 1; }
strata down
lap "status, checkpoints, down"
echo "OK: installed from the bundle and trained offline (run $run)"
INSIDE
chmod +x "$root/tmp/inside.sh"
phase "stage files into the root"

# 4. No network (new net namespace: only a down loopback), own mount and pid namespaces so /proc,
# /dev and every process the cluster starts vanish with the test.
set +e
unshare --net --mount --pid --fork --kill-child --mount-proc=/proc /bin/sh -c '
  set -e
  mount --rbind /dev "$0/dev"
  mount -t proc proc "$0/proc"
  mount -t tmpfs tmpfs "$0/dev/shm" 2>/dev/null || true
  exec chroot "$0" /tmp/inside.sh' "$root"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "--- logs from the cluster inside the root ---"
  for f in "$root"/root/.local/share/strata/logs/*; do [ -f "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done
  echo "FAIL: offline install/run failed (exit $rc)"
  exit 1
fi
phase "offline run in the root (total)"
echo "PASS"
