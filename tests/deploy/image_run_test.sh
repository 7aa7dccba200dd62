#!/usr/bin/env bash
# The container image, built and run with no registry (issue #24 item 10; docs/deploy-docker.md):
#   1. a local base image: the cached debootstrap of Debian 12 (tests/deploy/debian_base.sh),
#      `podman import`ed once (kept in this test's own podman storage between runs);
#   2. deploy/bundle.sh packs this build (build/bin: Debian 12, CPU LibTorch);
#   3. `podman build` of deploy/docker/Dockerfile itself, with RUNTIME_BASE = that local base and
#      BUNDLE_FROM=context (the bundle from step 2 instead of the CUDA build stage), --pull=never;
#   4. the services of deploy/docker/compose.yaml (rendered by `docker-compose config`, turned into
#      `podman run` by compose_to_podman.py): the coordinator and worker-0/1 with compose's command
#      lines, CURVE keys secret, named volumes, data mount, published port and fixed addresses on
#      their own network; CPU workers (`--device=cpu`, no GPU reservation);
#   5. a 6-step dp=2 run submitted as the docs say (`exec coordinator strata ... submit /data/...
#      --follow`), followed to `finished`, its 2 checkpoints, and `strata status` from the host CLI
#      through the published port with the same keys.
# Exit 77 (ctest: skipped) with the reason when this machine cannot: not root, podman /
# debootstrap / docker-compose missing, no binaries, or podman cannot run a container here (the
# probe's error is printed). Prints each phase's time.
# Environment: STRATA_BUILD_DIR (default build/), STRATA_IMAGE_TEST_CACHE (podman storage and
# network config of this test; default /var/cache/strata-image-test), STRATA_DEBOOTSTRAP_CACHE,
# STRATA_KEEP_TEST_DIRS=1 keeps the temp dir and the containers.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${STRATA_BUILD_DIR:-$repo/build}
cache=${STRATA_IMAGE_TEST_CACHE:-/var/cache/strata-image-test}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman; deploy/install-deps.sh installs podman)"
for t in podman debootstrap docker-compose; do command -v "$t" >/dev/null || skip "$t is missing (deploy/install-deps.sh installs it)"; done
[ -x "$build/bin/strata-worker" ] || skip "$build/bin has no binaries; build first"
# docker-compose is Python with PyYAML: its interpreter runs the translator.
py=$(head -n1 "$(command -v docker-compose)" | sed -n 's/^#! *//p' | cut -d' ' -f1)
[ -x "${py:-}" ] || py=python3

now() { date +%s.%N; }
phase_start=$(now)
phase() {
  local t; t=$(now)
  printf 'PHASE %-34s %6.1f s\n' "$1" "$(awk -v a="$phase_start" -v b="$t" 'BEGIN{print b - a}')"
  phase_start=$t
}

# Podman of this test only: its own storage, run root and network config (nothing of the
# machine's other containers is seen or touched); cgroupfs and file events (no systemd here).
# Storage driver: overlay where the kernel mounts it, else vfs (full copies: slower, works anywhere).
# The OCI runtime and the containers' ulimits are chosen by a probe below.
mkdir -p "$cache"
runtime=${STRATA_IMAGE_TEST_RUNTIME:-crun}
run_opts=()
pm_global() { echo --root "$cache/storage-$driver" --runroot "/run/strata-image-test-$driver" --storage-driver "$driver" \
                   --cgroup-manager cgroupfs --events-backend file --network-config-dir "$cache/networks" --runtime "$runtime"; }
pm() { podman $(pm_global) "$@"; }
pm_run() { pm run "${run_opts[@]}" "$@"; }
driver=${STRATA_IMAGE_TEST_DRIVER:-overlay}
if ! pm info > "$cache/info.log" 2>&1; then
  echo "podman cannot use the $driver storage driver here ($(tail -n1 "$cache/info.log")); trying vfs"
  driver=vfs
  pm info > "$cache/info.log" 2>&1 || skip "podman does not start here: $(tail -n 3 "$cache/info.log")"
fi
echo "podman $(podman --version | awk '{print $3}'), storage driver $driver, root $cache/storage-$driver"

work=$(mktemp -d /tmp/strata-image-test.XXXXXX)
project=strata-ci-$$
cleanup() {
  if [ -n "${STRATA_KEEP_TEST_DIRS:-}" ]; then echo "kept $work and the $project-* containers"; return; fi
  local c
  for c in $(pm ps -a --format '{{.Names}}' 2>/dev/null | grep "^$project-" || true); do pm rm -f -t 2 "$c" >/dev/null 2>&1 || true; done
  pm network rm -f "$project-strata" >/dev/null 2>&1 || true
  for c in $(pm volume ls --format '{{.Name}}' 2>/dev/null | grep "^$project-" || true); do pm volume rm -f "$c" >/dev/null 2>&1 || true; done
  pm image prune -f >/dev/null 2>&1 || true   # the previous run's image, now untagged
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The base image, from the cached debootstrap tarball (imported again only when it changed).
tarball=$(bash "$repo/tests/deploy/debian_base.sh")
base=localhost/strata-ci-base:bookworm
stamp=$(stat -c %Y-%s "$tarball")
if [ "$(pm image inspect --format '{{index .Labels "strata.base"}}' "$base" 2>/dev/null || true)" != "$stamp" ]; then
  pm import --change "LABEL strata.base=$stamp" --change 'CMD ["/bin/sh"]' "$tarball" "$base" > /dev/null
  phase "podman import Debian 12 base"
fi
# Can podman run a container here, and how? Known obstacles, each worked around and said:
# - crun refuses a hybrid cgroup v1/v2 host ("cgroups in hybrid mode not supported"): runc
#   runs there (deploy/install-deps.sh installs both);
# - without CAP_SYS_RESOURCE (a container or VM as the CI machine) the runtime cannot raise
#   RLIMIT_NOFILE / RLIMIT_NPROC to podman's defaults: the containers get explicit limits at or
#   below this shell's hard limits instead.
probe() { pm_run --rm --network none "$base" /bin/true > "$work/probe.log" 2>&1; }
why_not=""
for candidate in "$runtime" runc; do
  command -v "$candidate" > /dev/null || { why_not+="$candidate is not installed; "; continue; }
  runtime=$candidate
  run_opts=()
  probe && break
  if grep -q rlimit "$work/probe.log"; then
    nofile=$(ulimit -Hn)
    run_opts=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=4096:4096")
    echo "podman's default ulimits are above what this machine lets the runtime set ($(grep -o 'setrlimit[^:]*\|rlimit type [0-9]*' "$work/probe.log" | head -n1)); using ${run_opts[*]}"
    probe && break
  fi
  why_not+="$candidate: $(tail -n 1 "$work/probe.log"); "
  echo "podman with $candidate cannot run a container here: $(tail -n 1 "$work/probe.log")"
  runtime=""
done
[ -n "$runtime" ] || skip "podman cannot run a container on this machine (storage $driver, cgroupfs): $why_not"
echo "OCI runtime $runtime${run_opts[*]:+, ${run_opts[*]}}"
phase "base image + run probe"

# 2. The bundle of this build, alone in the build context.
mkdir -p "$work/context"
STRATA_BUNDLE_GZIP=1 bash "$repo/deploy/bundle.sh" "$work/context/strata-bundle.tar.gz" > "$work/bundle.log" 2>&1 \
  || { cat "$work/bundle.log"; fail "deploy/bundle.sh failed"; }
phase "bundle.sh ($(du -m "$work/context/strata-bundle.tar.gz" | cut -f1) MB)"

# 3. The Dockerfile, as is, from the local base and the bundle. --no-cache: buildah (podman 4.3)
# keys a RUN layer on its command, not on what a --mount binds, so a new bundle would otherwise
# reuse the last run's install layer.
image=localhost/strata:ci-test
pm build --pull=never --no-cache "${run_opts[@]}" -f "$repo/deploy/docker/Dockerfile" --build-arg RUNTIME_BASE="$base" --build-arg BUNDLE_FROM=context \
  -t "$image" "$work/context" > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; fail "podman build of deploy/docker/Dockerfile failed"; }
grep -q 'nvidia/cuda' "$work/build.log" && { cat "$work/build.log"; fail "the build touched the CUDA base (an unused stage was built)"; }
pm_run --rm "$image" strata --version | head -n 2
[ "$(pm image inspect --format '{{.Config.User}}' "$image")" = strata ] || fail "the image does not run as user strata"
phase "podman build (image $(pm image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}'))"

# 4. compose.yaml's services. Keys and data as the docs set them up; the containers run as 10001.
mkdir -p "$work/data"
"$build/bin/strata" keygen "$work/keys" > /dev/null
chown -R 10001:10001 "$work/keys"
cp /usr/share/common-licenses/GPL-3 "$work/data/corpus.txt"
cat > "$work/data/run.toml" <<'SPEC'
name = "image-tiny"
[model]
layers = 2
hidden = 64
heads = 4
vocab = 256
sequence = 32
[data]
path = "corpus.txt"
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
port=$(( 20000 + RANDOM % 20000 ))
subnet_prefix=10.$(( 100 + RANDOM % 100 )).$(( RANDOM % 250 ))
cat > "$work/.env" <<ENV
STRATA_IMAGE=localhost/strata
STRATA_TAG=ci-test
STRATA_PORT=$port
STRATA_PUBLISH_ADDR=127.0.0.1
STRATA_KEYS_DIR=$work/keys
STRATA_DATA_DIR=$work/data
STRATA_SUBNET_PREFIX=$subnet_prefix
ENV
docker-compose -f "$repo/deploy/docker/compose.yaml" --env-file "$work/.env" --project-directory "$work" config > "$work/compose.yaml" \
  || fail "docker-compose config rejected compose.yaml"
# Its own network if podman can make one here (netavark bridge), else the host's.
network=own
if ! "$py" "$repo/tests/deploy/compose_to_podman.py" "$work/compose.yaml" "$project" --cpu > "$work/services" \
   || ! pm network create --subnet "$(awk -F'\t' '$1 == "network" {print $2}' "$work/services")" "$project-strata" > "$work/network.log" 2>&1 \
   || ! pm_run --rm --network "$project-strata" --ip "$subnet_prefix.99" "$base" /bin/true >> "$work/network.log" 2>&1; then
  echo "podman cannot give the containers a network of their own here ($(tail -n 2 "$work/network.log" | tr '\n' ' ')); using the host's"
  network=host
  "$py" "$repo/tests/deploy/compose_to_podman.py" "$work/compose.yaml" "$project" --cpu --host-network "$port" > "$work/services"
fi
while IFS=$'\t' read -r name args; do
  [ "$name" = network ] && continue
  mapfile -t argv < <("$py" -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])))' "$args")
  echo "podman run -d ${argv[*]}"
  pm_run -d "${argv[@]}" > /dev/null || fail "podman run of service $name failed"
done < "$work/services"
coordinator=$project-coordinator
# Inside the coordinator's container the CLI reaches it on its listen port: 5555 on its own
# network, the host port under host networking.
inner_port=$([ "$network" = own ] && echo 5555 || echo "$port")
cli() { pm exec "$coordinator" strata --cluster "tcp://127.0.0.1:$inner_port" --keys /run/secrets/strata_keys "$@"; }
logs() {
  local c
  for c in $(pm ps -a --format '{{.Names}}' | grep "^$project-"); do echo "== $c"; pm logs --tail 30 "$c" 2>&1 || true; done
}
deadline=$(( $(date +%s) + 90 ))
until [ "$(cli workers --json 2>/dev/null | grep -o '"state": *"idle"' | wc -l)" -ge 2 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { logs; cli workers || true; fail "2 workers did not register with the coordinator within 90 s"; }
  sleep 1
done
cli workers
phase "compose services up ($network network)"

# 5. A run, as docs/deploy-docker.md submits it.
cli submit /data/run.toml --follow > "$work/follow.log" 2> "$work/follow.err" || { cat "$work/follow.log" "$work/follow.err"; logs; fail "submit --follow failed"; }
cat "$work/follow.log"
grep -q 'checkpoint-incomplete\|checkpoint-not-copied' "$work/follow.log" && { logs; fail "a checkpoint was not committed whole (above)"; }
run=$(head -n1 "$work/follow.log")
status=$(cli status "$run" --json)
grep -Eq '"state": *"finished"' <<< "$status" || { cli events "$run" || true; fail "run $run did not finish: $status"; }
grep -Eq '"step": *6[,}]' <<< "$status" || fail "run $run did not reach step 6: $status"
n=$(cli checkpoints "$run" --json | grep -o '"step"' | wc -l)
[ "$n" -eq 2 ] || fail "expected 2 checkpoints (steps 3, 6), got $n"
# The host's CLI through the published port (CURVE, the same key directory).
host_status=$("$build/bin/strata" --cluster "tcp://127.0.0.1:$port" --keys "$work/keys" status "$run" --json) \
  || fail "the host CLI cannot reach the coordinator on 127.0.0.1:$port"
grep -Eq '"state": *"finished"' <<< "$host_status" || fail "the host CLI sees $run as: $host_status"
phase "6-step dp=2 run in the containers"
echo "PASS: image built from deploy/docker/Dockerfile with no registry; coordinator + 2 CPU workers trained $run to the end"
