#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA file is not laid out as .clang-format says (clang-format 14,
# Debian 12's). Fix: scripts/check-format.sh --fix (rewrites them in place).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! out=$(clang-format --dry-run -Werror "${files[@]}" 2>&1); then
  echo "$out" | grep -E '^[^ ].*: (error|warning):' | cut -d: -f1 | sort -u | sed 's/^/not clang-format clean: /'
  echo "run scripts/check-format.sh --fix (clang-format -i on those files)" >&2
  exit 1
fi
echo "format: ${#files[@]} files clang-format clean"
