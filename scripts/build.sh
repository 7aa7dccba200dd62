#!/usr/bin/env bash
# Configures and builds Strata into build/ (Release-with-debug-info, Ninja, ccache when present).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja ${STRATA_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)"
