#!/usr/bin/env bash
# Configures and builds Strata into build/ (Release-with-debug-info, Ninja, ccache when present).
# Warnings are errors here (STRATA_WERROR=OFF in the environment builds anyway); extra CMake
# arguments come from STRATA_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DSTRATA_WERROR="${STRATA_WERROR:-ON}" ${STRATA_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)"
