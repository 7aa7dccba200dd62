#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, checks the C++ layout (scripts/check-format.sh), builds, and
# runs every test (unit, store, coordinator, trainer and multi-process integration tests), checks
# the locking of every file that uses a Mutex with clang (scripts/thread-safety.sh), then
# the control plane without LibTorch and its tests (build-notorch/), then a short fuzz run with
# clang's -Wthread-safety over the threaded libraries (scripts/fuzz.sh). GPU tests (label gpu)
# skip without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
# The layout first: a file clang-format would change fails the run before the build.
bash scripts/check-format.sh
start=$(date +%s)
bash scripts/build.sh
echo "build: $(( $(date +%s) - start )) s"
# Tests in parallel, one per core: most wait on processes and sockets (RUN_SERIAL marks the ones
# that must be alone).
# A test that fails there is run again alone: one that then passes is named as FLAKY at the end
# of the output (a race to fix, not a pass to forget); one that fails alone fails the script.
flaky=()
run_tests() {  # build-dir [ctest args]
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@") && return 0
  local failed
  failed=$(cut -d: -f2- "$dir/Testing/Temporary/LastTestsFailed.log" | tr '\n' ' ')
  echo "== $dir: again, alone: $failed"
  (cd "$dir" && ctest --rerun-failed --output-on-failure --timeout 600 -j 1) || return 1
  flaky+=("$failed")
}
run_tests build "$@"
# Clang's -Wthread-safety over every product file that uses Mutex, LibTorch rooms included, with
# build/'s flags (compile_commands.json), and no bare std::mutex in product code: GCC ignores the
# annotations and the fuzz build's clang compiles only the control-plane libraries. Where clang++
# is missing (deploy/install-deps.sh installs it) it is skipped, said so.
if command -v clang++ >/dev/null; then
  bash scripts/thread-safety.sh build
else
  echo "thread-safety: skipped, no clang++"
fi
# The control plane without LibTorch (-DSTRATA_WITH_TORCH=OFF, build-notorch/): strata,
# strata-coordinator and every test that needs no strata-worker build and pass without it, and
# no binary of that build loads LibTorch. STRATA_NO_TORCH_CHECK=0 skips it.
if [ "${STRATA_NO_TORCH_CHECK:-1}" != 0 ]; then
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
  start=$(date +%s)
  cmake -S . -B build-notorch -G Ninja -DSTRATA_WITH_TORCH=OFF -DSTRATA_WERROR="${STRATA_WERROR:-ON}" >/dev/null
  cmake --build build-notorch -j "$(nproc)"
  echo "build without LibTorch: $(( $(date +%s) - start )) s"
  for bin in build-notorch/bin/*; do
    if ldd "$bin" 2>/dev/null | grep -q 'libtorch\|libc10'; then
      echo "$bin links LibTorch in a build without it" >&2
      exit 1
    fi
  done
  [ ! -e build-notorch/bin/strata-worker ] || { echo "build-notorch made a strata-worker" >&2; exit 1; }
  run_tests build-notorch
fi
# A short run of every fuzzer under ASan/UBSan (fuzz/; about a minute with its build).
# STRATA_FUZZ_RUNS=0 skips it.
fuzz_runs=${STRATA_FUZZ_RUNS:-200000}
if [ "$fuzz_runs" -gt 0 ]; then
  bash scripts/fuzz.sh "$fuzz_runs"
fi
if [ "${#flaky[@]}" -gt 0 ]; then
  echo "FLAKY: failed beside other tests, passed alone: ${flaky[*]}"
fi
