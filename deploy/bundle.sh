#!/usr/bin/env bash
# deploy/bundle.sh OUT.tar.gz: packs the built Strata binaries, every shared library they load
# except glibc's (found with ldd, so the archive matches the machine it was built on: Debian 12
# here, the CUDA image's Ubuntu in deploy/docker/), the example run spec and an installer into ONE
# archive. On a node of the same distribution, with no network and no package manager:
#   tar xzf strata-bundle.tar.gz && sudo strata-bundle/install.sh [--prefix /opt/strata]
# Environment: STRATA_BUILD_DIR (default build/), STRATA_BUNDLE_GZIP (gzip level, default 6),
# STRATA_VERSION (recorded in BUILD_INFO; default: git describe).
set -euo pipefail
usage() { echo "usage: $0 OUT.tar.gz" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in -h|--help) usage ;; esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${STRATA_BUILD_DIR:-$repo/build}
out=$(realpath -m "$1")
bins=(strata strata-coordinator strata-worker)

for b in "${bins[@]}"; do
  if [ ! -x "$build/bin/$b" ]; then
    echo "bundle: $build/bin/$b is missing; build first (scripts/build.sh)" >&2
    exit 1
  fi
done

# glibc's own objects must come from the target node: they are tied to its ld.so and kernel ABI.
# The NVIDIA driver's user-space libraries come from the host driver (or the NVIDIA container
# toolkit) and must match the kernel module, so they are never bundled either.
is_system_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|\
    librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*|libnsl.so.*|libnss_*|libBrokenLocale.so.*|\
    libthread_db.so.*|libc_malloc_debug.so.*) return 0 ;;
    libcuda.so*|libnvidia-*|libnvcuvid.so*|libnvoptix.so*) return 0 ;;
  esac
  return 1
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
top=$stage/strata-bundle
mkdir -p "$top/bin" "$top/lib" "$top/share/strata/examples"

missing=()
declare -A seen=()
for b in "${bins[@]}"; do
  install -m 0755 "$build/bin/$b" "$top/bin/$b"
  # ldd prints the whole transitive closure: "libfoo.so.1 => /path/libfoo.so.1 (0x...)".
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system_lib "$name" && continue
    if [ "$path" = "not" ]; then missing+=("$b: $name"); continue; fi
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    # Copy under the soname the binary asks for, following symlinks (Debian's alternatives, e.g.
    # libblas.so.3 -> OpenBLAS, are resolved to the implementation this machine uses).
    cp -L "$path" "$top/lib/$name"
  done < <(ldd "$build/bin/$b")
done
# ldd cannot see what is dlopen()ed. A LibTorch distribution outside the system directories (the
# CUDA LibTorch archive, pip PyTorch and its nvidia-* wheels) loads parts of itself that way:
# cuDNN's engine libraries, NVRTC's builtins. So a directory the closure reached outside
# /lib, /usr/lib and the CUDA toolkit comes whole. (Debian's CPU LibTorch in /usr/lib dlopens none of that.)
declare -A extra_dirs=()
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] && [ -f "$path" ] || continue
  dir=$(dirname "$(readlink -f "$path")")
  # The CUDA toolkit's own directory is not taken whole: only what ldd names (e.g. libcudart);
  # LibTorch's distributions carry the CUDA libraries they dlopen themselves.
  case "$dir" in
    /lib|/lib/*|/lib64|/lib64/*|/usr/lib|/usr/lib/*|/usr/lib64|/usr/lib64/*|/usr/local/cuda*) ;;
    *) extra_dirs[$dir]=1 ;;
  esac
done < <(for b in "${bins[@]}"; do ldd "$build/bin/$b"; done)
for dir in "${!extra_dirs[@]}"; do
  for f in "$dir"/*.so*; do
    [ -f "$f" ] || continue
    name=$(basename "$f")
    is_system_lib "$name" && continue
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    cp -L "$f" "$top/lib/$name"
  done
  echo "bundle: all of $dir (a library directory outside /lib, /usr/lib: dlopen()ed parts)"
done
if [ ${#missing[@]} -gt 0 ]; then
  printf 'bundle: unresolved library: %s\n' "${missing[@]}" >&2
  echo "bundle: the binaries do not run on this machine; fix LD_LIBRARY_PATH or the build first" >&2
  exit 1
fi

cp "$repo/examples/gpt2-tiny.toml" "$top/share/strata/examples/"
install -m 0755 "$repo/deploy/bundle/install.sh" "$top/install.sh"
cp "$repo/deploy/bundle/README" "$top/README"

# What the archive was built against; install.sh refuses a node with an older glibc, which would
# fail later with "version GLIBC_2.xx not found".
. /etc/os-release
{
  echo "strata_version=${STRATA_VERSION:-$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)}"
  echo "built_on=${PRETTY_NAME:-unknown}"
  echo "arch=$(uname -m)"
  echo "glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
  echo "libraries=${#seen[@]}"
} > "$top/BUILD_INFO"
(cd "$top" && find bin lib share install.sh README BUILD_INFO -type f -print0 | sort -z | xargs -0 sha256sum) > "$stage/SHA256SUMS"
mv "$stage/SHA256SUMS" "$top/SHA256SUMS"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - strata-bundle | gzip -"${STRATA_BUNDLE_GZIP:-6}" > "$out.tmp"
mv "$out.tmp" "$out"
echo "bundle: $out ($(du -m "$out" | cut -f1) MB; ${#bins[@]} binaries, ${#seen[@]} libraries, $(du -sm "$top" | cut -f1) MB unpacked)"
