#!/usr/bin/env bash
# Configures and builds Strata into build/ (Release-with-debug-info, Ninja, ccache when present).
# Warnings are errors here (STRATA_WERROR=OFF in the environment builds anyway); extra CMake
# arguments come from STRATA_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
# LibTorch files share a precompiled header (cmake/Dependencies.cmake); ccache caches them only
# with this sloppiness.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
cmake -S . -B build -G Ninja -DSTRATA_WERROR="${STRATA_WERROR:-ON}" ${STRATA_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)"
