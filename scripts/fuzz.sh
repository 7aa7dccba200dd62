#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan into build-fuzz/ (with the
# libraries whose threads share state, so clang's -Wthread-safety checks their locking) and runs each
# for RUNS inputs (default 20000: about a minute for all of them), starting from the seeds that
# strata_fuzz_seeds writes plus the corpus earlier runs kept in build-fuzz/corpus/. Fails if a
# fuzzer crashes, leaks, times out or breaks an invariant; the input is kept in
# build-fuzz/crashes/<fuzzer>/ (reproduce: build-fuzz/bin/<fuzzer> FILE).
#   scripts/fuzz.sh [RUNS] [FUZZER...]      e.g. scripts/fuzz.sh 10000000 envelope_fuzz
# JOBS sets the build's parallelism (default: nproc), FUZZ_ARGS adds libFuzzer flags, FUZZ_BUILD_DIR
# picks another build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20000}
[ $# -gt 0 ] && shift
fuzzers=("$@")
if [ ${#fuzzers[@]} -eq 0 ]; then
  fuzzers=(envelope_fuzz store_record_fuzz tensor_record_fuzz manifest_fuzz safetensors_fuzz key_fuzz npy_header_fuzz)
fi
build=${FUZZ_BUILD_DIR:-build-fuzz}

start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_FUZZ=ON -DSTRATA_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target strata_fuzz strata_thread_safety
echo "fuzz: build $(( $(date +%s) - start )) s"
rm -rf "$build/seeds"
"$build/bin/strata_fuzz_seeds" "$build/seeds"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build/logs"
failed=()
for f in "${fuzzers[@]}"; do
  mkdir -p "$build/corpus/$f" "$build/crashes/$f"
  log="$build/logs/$f.log"
  dict=()
  if [ -f "fuzz/$f.dict" ]; then dict=(-dict="fuzz/$f.dict"); fi
  # The first directory is the corpus libFuzzer adds to; the seeds are only read.
  # shellcheck disable=SC2086
  if "$build/bin/$f" -runs="$runs" -timeout=25 -print_final_stats=1 -artifact_prefix="$build/crashes/$f/" \
      "${dict[@]}" ${FUZZ_ARGS:-} "$build/corpus/$f" "$build/seeds/$f" >"$log" 2>&1; then
    summary=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1 | sed -E 's/Done ([0-9]+) runs in ([0-9]+) second.*/\1 runs in \2 s/')
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    echo "fuzz: $f: $summary, $cov"
  else
    echo "fuzz: $f FAILED (log: $log; inputs: $build/crashes/$f/):"
    tail -n 40 "$log"
    failed+=("$f")
  fi
done
echo "fuzz: $(( $(date +%s) - start )) s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
