#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and runs every test (unit, store, coordinator,
# trainer and multi-process integration tests), then a short fuzz run (scripts/fuzz.sh). GPU
# tests (label gpu) skip without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
start=$(date +%s)
bash scripts/build.sh
echo "build: $(( $(date +%s) - start )) s"
# Tests in parallel, one per core: most wait on processes and sockets (RUN_SERIAL marks the ones
# that must be alone).
(cd build && ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@")
# A short run of every fuzzer under ASan/UBSan (fuzz/; about a minute with its build).
# STRATA_FUZZ_RUNS=0 skips it.
fuzz_runs=${STRATA_FUZZ_RUNS:-200000}
if [ "$fuzz_runs" -gt 0 ]; then
  bash scripts/fuzz.sh "$fuzz_runs"
fi
