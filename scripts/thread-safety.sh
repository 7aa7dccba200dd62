#!/usr/bin/env bash
# Checks the locking of every product file against its annotations (common/thread_annotations.h):
# clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety over each product translation unit
# whose source or own header (foo.cc's foo.h) mentions Mutex or STRATA_GUARDED_BY, with that
# file's include directories, defines and -std of the main GCC build (BUILD/compile_commands.json).
# Why here: GCC, which builds Strata, ignores the annotations, and the clang build of the fuzzers
# (scripts/fuzz.sh, build-fuzz/) compiles only the control-plane libraries, not the LibTorch rooms
# (worker/nn, train, extract, comm, the executor), the tokenizer, activations/ or python/.
# It also fails where product code still uses a bare std::mutex, std::condition_variable,
# std::lock_guard, std::scoped_lock or std::unique_lock<std::mutex>, which the analysis cannot see
# (strata::Mutex, MutexLock and CondVar instead). A line that must keep one (an API that takes a
# real std::mutex) says why in a comment with the word std-mutex-ok. Tests (*_test.cc,
# *_test_*.h, tests/, bench/, fuzz/) may use std::mutex and are not checked.
#   scripts/thread-safety.sh [BUILD_DIR]   (default build: any configured build of this tree, whose
#                                           compile_commands.json the top-level CMakeLists.txt writes)
# JOBS sets how many files clang checks at once (default 2: each takes a few hundred MiB and, with
# LibTorch's headers, several seconds). A file of the build that is no longer in the tree is
# skipped; one added since the build was configured is checked after the next configure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
db="$build/compile_commands.json"
jobs=${JOBS:-2}
start=$(date +%s)
status=0

# Bare std primitives in product code.
pattern='std::(mutex|recursive_mutex|timed_mutex|condition_variable|condition_variable_any|lock_guard|scoped_lock)\b|std::unique_lock<std::mutex>'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t sources < <(git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' '*.cu' | sort -u)
else
  mapfile -t sources < <(find . -path './build*' -prune -o -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) \
    -print | sed 's|^\./||' | sort)
fi
product=()
for f in "${sources[@]}"; do
  [ -f "$f" ] || continue  # deleted, not yet staged
  case "$f" in
    tests/* | bench/* | fuzz/* | *_test.cc | *_test.h | *_test_*.h | *_test_*.cc) continue ;;
    common/thread_annotations.h) continue ;;
  esac
  product+=("$f")
done
if bare=$(grep -nE "$pattern" "${product[@]}" /dev/null | grep -v 'std-mutex-ok'); then
  echo "thread-safety: bare std:: locking in product code (use Mutex, MutexLock, CondVar from common/thread_annotations.h):"
  while IFS= read -r line; do echo "  $line"; done <<<"$bare"
  status=1
fi

# The analysis.
if [ ! -f "$db" ]; then
  echo "thread-safety: no $db (configure the build first: scripts/build.sh)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One work/N.args per file checked: the directory to run in, the source, then clang's arguments,
# one a line. Only the build's include directories, defines and language standard are kept: GCC's
# warning and code-generation flags are of no use to a syntax check (and some clang rejects), and
# the precompiled header (cmake_pch.hxx, -Winvalid-pch) is GCC's own format: its header is included
# as source instead.
python3 - "$db" "$root" "$work" <<'EOF'
import json, os, shlex, sys

db, root, work = sys.argv[1:4]
root = os.path.realpath(root)
with open(db) as f:
    entries = json.load(f)

def mentions(path):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return "Mutex" in text or "STRATA_GUARDED_BY" in text

seen, n, missing = set(), 0, []
for e in entries:
    directory = e.get("directory", ".")
    src = os.path.realpath(os.path.join(directory, e["file"]))
    rel = os.path.relpath(src, root)
    if rel.startswith("..") or src in seen:
        continue
    parts = rel.split(os.sep)
    if parts[0] in ("tests", "bench", "fuzz") or parts[0].startswith("build") or "CMakeFiles" in parts:
        continue
    if rel.endswith("_test.cc") or not rel.endswith(".cc"):  # .cu, generated .c++, CMake's pch.cxx
        continue
    if not os.path.exists(src):
        missing.append(rel)
        continue
    if not (mentions(src) or mentions(os.path.splitext(src)[0] + ".h")):
        continue
    seen.add(src)
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    keep = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
    i = 1
    while i < len(args):
        a = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if a in ("-I", "-isystem", "-iquote", "-idirafter", "-D", "-U"):
            keep += [a, nxt]
            i += 2
            continue
        if a == "-include":
            if "cmake_pch" not in nxt:
                keep += [a, nxt]
            else:
                # The LibTorch rooms' precompiled <torch/torch.h>, as a plain include. IValue first:
                # LibTorch 1.13's autograd headers hold std::vector<IValue> while IValue is
                # incomplete, which C++20's constexpr vector makes an error under clang (GCC
                # instantiates later).
                keep += ["-include", "ATen/core/ivalue.h", "-include", "torch/torch.h"]
            i += 2
            continue
        if a.startswith(("-I", "-D", "-U", "-std=", "-isystem")) and "cmake_pch" not in a:
            keep.append(a)
        elif a == "-pthread":
            keep.append(a)
        i += 1
    keep.append(src)
    with open(os.path.join(work, f"{n:04d}.args"), "w") as f:
        f.write("\n".join([directory, rel] + keep) + "\n")
    n += 1
for rel in missing:
    print(f"thread-safety: skipped {rel}: in {db} but not in the tree (reconfigure the build)")
EOF

# shellcheck disable=SC2317  # run by xargs, through bash -c
check_one() {  # work/N.args -> work/N.out, and work/N.failed when clang fails
  local spec=$1
  local lines
  mapfile -t lines <"$spec"
  if ! (cd "${lines[0]}" && clang++ "${lines[@]:2}") >"${spec%.args}.out" 2>&1; then
    touch "${spec%.args}.failed"
  fi
}
export -f check_one
shopt -s nullglob
specs=("$work"/*.args)
if [ ${#specs[@]} -eq 0 ]; then
  echo "thread-safety: no file in $db uses Mutex" >&2
  exit 1
fi
if ! command -v clang++ >/dev/null; then
  echo "thread-safety: clang++ not found (deploy/install-deps.sh installs clang)" >&2
  exit 1
fi
# shellcheck disable=SC2016  # $1 is the inner shell's
printf '%s\n' "${specs[@]}" | xargs -P "$jobs" -n 1 bash -c 'check_one "$1"' _
failed=0
for spec in "${specs[@]}"; do
  [ -e "${spec%.args}.failed" ] || continue
  failed=$((failed + 1))
  echo "thread-safety: FAILED $(sed -n 2p "$spec"):"
  cat "${spec%.args}.out"
done
if [ "$failed" -gt 0 ]; then
  echo "thread-safety: $failed of ${#specs[@]} files failed clang's -Wthread-safety"
  status=1
else
  echo "thread-safety: ${#specs[@]} files clean under clang's -Wthread-safety in $(($(date +%s) - start)) s"
fi
exit "$status"
