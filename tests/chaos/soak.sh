#!/usr/bin/env bash
# The long chaos soak (not in CI): one run through 50 kill -9 of workers and 5 of the coordinator,
# in a random order from the seed; it must finish with the fault-free losses and readable
# checkpoints (tests/integration/chaos_test.cc is the same test at CI size: 10 and 2).
#
# usage: bash tests/chaos/soak.sh [BUILD_DIR] [SEED]
set -euo pipefail
build=${1:-build}
export STRATA_CHAOS_WORKER_KILLS=${STRATA_CHAOS_WORKER_KILLS:-50}
export STRATA_CHAOS_COORDINATOR_KILLS=${STRATA_CHAOS_COORDINATOR_KILLS:-5}
export STRATA_CHAOS_SEED=${2:-$RANDOM}
start=$(date +%s)
"$build/bin/chaos_test" --gtest_filter='ChaosTest.*'
echo "soak passed: $STRATA_CHAOS_WORKER_KILLS worker kills, $STRATA_CHAOS_COORDINATOR_KILLS coordinator kills, seed $STRATA_CHAOS_SEED, $(( $(date +%s) - start )) s"
