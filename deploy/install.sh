#!/usr/bin/env bash
# Installs Strata as systemd services: the built binaries, the unit files, an example
# /etc/strata/strata.env (never overwriting an edited one) and the `strata` system user, then
# reloads systemd when it is running. Safe to run again (e.g. after a rebuild).
#
#   deploy/install.sh [--prefix /usr/local] [--build-dir build] [--dest-root /]
#
# --dest-root DIR installs into DIR as if it were / (packaging, tests): no user is created and
# systemd is not reloaded there. Then enable: see docs/deploy-systemd.md.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix=/usr/local
build_dir="$repo/build"
dest_root=/

usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --build-dir) build_dir="${2:?--build-dir needs a directory}"; shift 2 ;;
    --build-dir=*) build_dir="${1#*=}"; shift ;;
    --dest-root) dest_root="${2:?--dest-root needs a directory}"; shift 2 ;;
    --dest-root=*) dest_root="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$prefix" == /* ]] || { echo "install.sh: --prefix must be absolute (got $prefix)" >&2; exit 2; }
prefix="${prefix%/}"
dest_root="$(realpath -m "$dest_root")"
root="${dest_root%/}"  # "" for the live system, so "$root/etc" is /etc
live=0
[[ -z "$root" ]] && live=1

bins=(strata strata-coordinator strata-worker)
for b in "${bins[@]}"; do
  if [[ ! -x "$build_dir/bin/$b" ]]; then
    echo "install.sh: $build_dir/bin/$b is missing; build first: cmake --build $build_dir" >&2
    exit 1
  fi
done
if [[ $live == 1 && $EUID -ne 0 ]]; then
  echo "install.sh: installing into / needs root; run it with sudo (or use --dest-root DIR)" >&2
  exit 1
fi

echo "installing binaries to $root$prefix/bin"
install -d -m 0755 "$root$prefix/bin"
for b in "${bins[@]}"; do
  # Replace through a temporary name: a running daemon keeps its old inode (no "text file busy").
  install -m 0755 "$build_dir/bin/$b" "$root$prefix/bin/.$b.new"
  mv -f "$root$prefix/bin/.$b.new" "$root$prefix/bin/$b"
done

# Units go where the administrator's units live (they have precedence over packaged ones); their
# paths say /usr/local, rewritten here for another prefix.
unit_dir="$root/etc/systemd/system"
echo "installing units to $unit_dir"
install -d -m 0755 "$unit_dir"
for u in strata-coordinator.service strata-worker@.service; do
  sed "s|/usr/local/|$prefix/|g" "$repo/deploy/systemd/$u" >"$unit_dir/.$u.new"
  chmod 0644 "$unit_dir/.$u.new"
  mv -f "$unit_dir/.$u.new" "$unit_dir/$u"
done

install -d -m 0755 "$root$prefix/share/doc/strata"
install -m 0644 "$repo/docs/deploy-systemd.md" "$root$prefix/share/doc/strata/deploy-systemd.md"

install -d -m 0755 "$root/etc/strata"
if [[ -e "$root/etc/strata/strata.env" ]]; then
  echo "keeping $root/etc/strata/strata.env (the example is $repo/deploy/systemd/strata.env)"
else
  install -m 0644 "$repo/deploy/systemd/strata.env" "$root/etc/strata/strata.env"
  echo "installed $root/etc/strata/strata.env; edit it, then (re)start the services"
fi

if [[ $live == 0 ]]; then
  echo "--dest-root $dest_root: not creating the strata user nor reloading systemd there"
  exit 0
fi

if ! getent passwd strata >/dev/null; then
  # A system account that cannot log in; systemd creates and chowns its state directories.
  useradd --system --user-group --home-dir /var/lib/strata --no-create-home \
    --shell /usr/sbin/nologin --comment "Strata cluster daemons" strata
  echo "created system user strata"
fi

if [[ -d /run/systemd/system ]]; then  # systemd is PID 1 (sd_booted)
  systemctl daemon-reload
  echo "systemd reloaded; start with: systemctl enable --now strata-coordinator strata-worker@0"
else
  echo "systemd is not running here; the units take effect at the next boot under systemd"
fi
