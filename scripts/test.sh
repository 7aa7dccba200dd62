#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and runs every test (unit, store, coordinator,
# trainer and multi-process integration tests). GPU tests (label gpu) skip without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
start=$(date +%s)
bash scripts/build.sh
echo "build: $(( $(date +%s) - start )) s"
cd build
ctest --output-on-failure --timeout 600 "$@"
