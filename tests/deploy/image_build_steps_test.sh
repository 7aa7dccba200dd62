#!/usr/bin/env bash
# The container image is built by deploy/docker/build-image-steps.sh (no engine here to build the
# image itself): this runs its --check mode, the steps that do not need the CUDA base image, and
# checks that the Dockerfile really runs that script and installs through the bundle installer.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
dockerfile=$repo/deploy/docker/Dockerfile
grep -Eq '^RUN bash deploy/docker/build-image-steps\.sh$' "$dockerfile" \
  || fail "the Dockerfile no longer RUNs deploy/docker/build-image-steps.sh, so CI does not test the image's build"
grep -q 'strata-bundle/install.sh' "$dockerfile" || fail "the Dockerfile's runtime stage does not install with the bundle's install.sh"
[ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null || { echo "SKIP: install-deps needs root or passwordless sudo"; exit 77; }
out=$(bash "$repo/deploy/docker/build-image-steps.sh" --check 2>&1) || { echo "$out"; fail "build-image-steps.sh --check failed"; }
echo "$out"
for b in strata strata-coordinator strata-worker; do
  grep -q "^$b: " <<< "$out" || fail "$b was not checked"
done
grep -q '^strata-worker --version: .' <<< "$out" || fail "strata-worker --version printed nothing"
echo PASS
