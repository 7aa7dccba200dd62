#!/usr/bin/env bash
# Prints the path of a minimal Debian 12 root as a tarball (debootstrap --variant=minbase
# bookworm), made once per machine and cached: the base of the offline-bundle test's chroot and of
# the container image test's local base image (no registry). ~30 s cold with a nearby mirror.
# Needs root and debootstrap. Progress goes to stderr; only the path to stdout.
# Environment: STRATA_DEBOOTSTRAP_CACHE (default /var/cache/strata-test-debootstrap),
# STRATA_DEBIAN_MIRROR (default: this machine's apt source, else deb.debian.org).
set -euo pipefail
cache=${STRATA_DEBOOTSTRAP_CACHE:-/var/cache/strata-test-debootstrap}
tarball=$cache/bookworm-minbase.tar
if [ ! -f "$tarball" ]; then
  mirror=${STRATA_DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then
    mirror=$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
               | grep -oE 'https?://[^ ]+' | head -n1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
  fi
  echo "debootstrap: bookworm minbase from $mirror into the cache $tarball" >&2
  mkdir -p "$cache"
  work=$(mktemp -d /tmp/strata-debootstrap.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase bookworm "$work/fresh" "$mirror" > "$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; echo "FAIL: debootstrap from $mirror failed (set STRATA_DEBIAN_MIRROR?)" >&2; exit 1; }
  # Written under a temporary name and renamed: concurrent tests never see half a tarball.
  tar -C "$work/fresh" -cf "$tarball.tmp.$$" . && mv "$tarball.tmp.$$" "$tarball"
fi
echo "$tarball"
