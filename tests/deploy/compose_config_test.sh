#!/usr/bin/env bash
# deploy/docker/compose.yaml is valid for Debian 12's docker-compose (v1, validates offline: no
# engine needed), and its .env drives what the user sets: image tag, GPU ids, data address.
# Exit 77 (ctest: skipped) without docker-compose.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
compose_file=$repo/deploy/docker/compose.yaml
command -v docker-compose >/dev/null || { echo "SKIP: docker-compose is missing (deploy/install-deps.sh installs it)"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Defaults (no .env): must validate as is.
docker-compose -f "$compose_file" --project-directory "$work" config > "$work/default.yaml" \
  || fail "docker-compose config rejected compose.yaml"
grep -q 'image: strata:latest' "$work/default.yaml" || fail "default image is not strata:latest"

# With an .env like the documented example, but other values: every one must reach the config.
sed -e 's/^STRATA_TAG=.*/STRATA_TAG=9.8.7-test/' -e 's/^WORKER1_GPU=.*/WORKER1_GPU=5/' \
    -e 's/^STRATA_SUBNET_PREFIX=.*/STRATA_SUBNET_PREFIX=10.77.3/' "$repo/deploy/docker/.env.example" > "$work/.env"
docker-compose -f "$compose_file" --env-file "$work/.env" config > "$work/env.yaml" \
  || fail "docker-compose config rejected compose.yaml with .env.example's variables"
cat "$work/env.yaml"
[ "$(grep -c 'image: strata:9.8.7-test' "$work/env.yaml")" -eq 3 ] || fail "STRATA_TAG does not set the image of all 3 services"
grep -Eq "^ +- '5'$" "$work/env.yaml" || fail "WORKER1_GPU does not pick worker-1's GPU"
grep -q -- '--data-address=tcp://10.77.3.21:5600' "$work/env.yaml" || fail "worker-1's data address does not follow STRATA_SUBNET_PREFIX"
grep -q 'subnet: 10.77.3.0/24' "$work/env.yaml" || fail "the network does not follow STRATA_SUBNET_PREFIX"

# What the deployment relies on, whatever the values: workers reach the coordinator by name over
# TCP, both daemons get the CURVE keys from the secret, each worker reserves one NVIDIA GPU.
# docker-compose is Python with PyYAML: use its interpreter, which surely has yaml.
py=$(head -n1 "$(command -v docker-compose)" | sed -n 's/^#! *//p' | cut -d' ' -f1)
[ -x "${py:-}" ] || py=python3
"$py" - "$work/env.yaml" <<'PY' || fail "compose.yaml lost a property the deployment relies on (above)"
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
s = c["services"]
workers = [n for n in s if n.startswith("worker-")]
problems = []
if len(workers) < 2: problems.append("fewer than 2 worker services")
for name, svc in s.items():
    cmd = svc["command"]
    if "--keys=/run/secrets/strata_keys" not in cmd: problems.append(f"{name}: no --keys=/run/secrets/strata_keys")
    if [x["source"] for x in svc.get("secrets", [])] != ["strata_keys"]: problems.append(f"{name}: strata_keys secret not mounted")
    if not any(":/var/lib/strata/" in v for v in svc.get("volumes", [])): problems.append(f"{name}: no volume for its store")
for name in workers:
    cmd = s[name]["command"]
    if "--coordinator=tcp://coordinator:5555" not in cmd: problems.append(f"{name}: not pointed at tcp://coordinator:5555")
    devs = s[name]["deploy"]["resources"]["reservations"]["devices"]
    if len(devs) != 1 or devs[0]["driver"] != "nvidia" or len(devs[0]["device_ids"]) != 1: problems.append(f"{name}: does not reserve exactly one NVIDIA GPU")
stores = [v.split(":")[0] for n in workers for v in s[n]["volumes"] if ":/var/lib/strata/" in v]
if len(set(stores)) != len(stores): problems.append("workers share a store volume")
# The coordinator tells stores apart by their --store path (checkpoint copies, resumes), so each
# worker needs its own even in containers of its own (tests/deploy/image_run_test.sh saw copies
# read from the wrong store when both were /var/lib/strata/worker).
paths = [a for n in workers for a in s[n]["command"] if a.startswith("--store=")]
if len(paths) != len(workers) or len(set(paths)) != len(paths): problems.append(f"workers' --store paths are not distinct: {paths}")
if "--listen=tcp://0.0.0.0:5555" not in s["coordinator"]["command"]: problems.append("coordinator does not listen on tcp port 5555")
print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
echo PASS
