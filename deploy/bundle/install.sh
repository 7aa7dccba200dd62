#!/bin/sh
# Installs the Strata offline bundle this script sits in. Needs no network and no package
# manager: only sh, coreutils and the node's glibc (at least the one the bundle was built with).
#   ./install.sh [--prefix DIR] [--bin-dir DIR | --no-bin-dir]
# Layout: PREFIX/libexec/strata/ the real binaries, PREFIX/lib/ their libraries, PREFIX/bin/
# small wrappers that point LD_LIBRARY_PATH at PREFIX/lib (so nothing is written to
# /etc/ld.so.conf.d and system programs never see the bundled copies), and symlinks to the
# wrappers in BIN_DIR (default /usr/local/bin) so `strata` is on PATH.
# Re-running replaces the previous install under PREFIX; cluster state lives elsewhere
# (~/.local/share/strata or --state-dir) and is not touched.
set -eu
prefix=/opt/strata
bin_dir=/usr/local/bin
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --no-bin-dir) bin_dir=; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be an absolute path, got '$prefix'" >&2; exit 2 ;; esac
src=$(cd "$(dirname "$0")" && pwd)

fail() { echo "install.sh: $*" >&2; exit 1; }

# Refuse what cannot work before touching anything.
want_arch=$(sed -n 's/^arch=//p' "$src/BUILD_INFO")
[ "$(uname -m)" = "$want_arch" ] || fail "this bundle is for $want_arch, this node is $(uname -m)"
want_glibc=$(sed -n 's/^glibc=//p' "$src/BUILD_INFO")
have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
[ -n "$have_glibc" ] || fail "cannot read this node's glibc version (getconf GNU_LIBC_VERSION); the bundle needs glibc >= $want_glibc"
lowest=$(printf '%s\n%s\n' "$want_glibc" "$have_glibc" | sort -V | head -n1)
[ "$lowest" = "$want_glibc" ] || fail "this node has glibc $have_glibc; the bundle was built on $(sed -n 's/^built_on=//p' "$src/BUILD_INFO") and needs glibc >= $want_glibc"
if [ -e "$prefix" ] && [ ! -f "$prefix/share/strata/BUILD_INFO" ]; then
  fail "$prefix exists and is not a Strata bundle install; choose another --prefix"
fi
(cd "$src" && sha256sum -c --quiet SHA256SUMS) || fail "the bundle is damaged (checksum mismatch above); copy the archive again"

# Stage next to the destination and swap, so a failed copy never leaves half an install.
parent=$(dirname "$prefix")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.strata-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/libexec/strata" "$tmp/lib" "$tmp/share"
cp -p "$src"/bin/* "$tmp/libexec/strata/"
cp -p "$src"/lib/* "$tmp/lib/"
cp -pR "$src/share/strata" "$tmp/share/"
cp -p "$src/BUILD_INFO" "$tmp/share/strata/"
for exe in "$src"/bin/*; do
  name=$(basename "$exe")
  # `strata up` starts strata-coordinator and strata-worker from its own directory
  # (libexec/strata), and they inherit LD_LIBRARY_PATH from this wrapper.
  cat > "$tmp/bin/$name" <<WRAP
#!/bin/sh
# Strata offline bundle: runs the bundled $name with the bundled libraries.
LD_LIBRARY_PATH="$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$prefix/libexec/strata/$name" "\$@"
WRAP
  chmod 0755 "$tmp/bin/$name"
done
if [ -e "$prefix" ]; then
  rm -rf "$prefix.old"
  mv "$prefix" "$prefix.old"
fi
mv "$tmp" "$prefix"
trap - EXIT
rm -rf "$prefix.old"
chmod 0755 "$prefix"

if [ -n "$bin_dir" ]; then
  mkdir -p "$bin_dir"
  for exe in "$prefix"/bin/*; do ln -sf "$exe" "$bin_dir/$(basename "$exe")"; done
fi

# Prove every binary loads all its libraries here (a missing one fails now, not at `strata up`).
for exe in "$prefix"/bin/*; do
  "$exe" --help > /dev/null 2>&1 || fail "$exe --help failed on this node: run it to see why"
done
echo "install.sh: Strata $(sed -n 's/^strata_version=//p' "$prefix/share/strata/BUILD_INFO") installed in $prefix${bin_dir:+ (commands linked in $bin_dir)}"
