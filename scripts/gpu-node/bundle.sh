#!/usr/bin/env bash
# bundle.sh OUTDIR
# Prepares, on a Debian 12 machine with apt, everything a GPU node WITHOUT network access needs to
# build the project beside its own CUDA toolkit and pip PyTorch (LibTorch): the .deb files (runtime +
# -dev) of the libraries that such a node lacks, plus unpack.sh and env.sh. Nothing is installed here.
# On the GPU node:   source OUTDIR/env.sh   then configure and build as usual (cmake -G Ninja ...).
# That node already has: g++ 13, cmake 4, ninja, nvcc 13, NCCL (/usr/include/nccl.h), cuDNN,
# spdlog 1.12, fmt 9, GoogleTest/GMock 1.14, Google Benchmark, and PyTorch 2.11 (CUDA 13) in python3.
set -euo pipefail
OUT=${1:?usage: bundle.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PKGS=(
  # ZeroMQ + cppzmq and libzmq5's runtime deps
  libzmq3-dev cppzmq-dev libzmq5 libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  # Cap'n Proto compiler + library (its CMake config hard-codes /usr: cmake/Dependencies.cmake finds it by hand)
  capnproto libcapnp-dev libcapnp-0.9.2
  # RocksDB 7.8 and its runtime deps
  librocksdb-dev librocksdb7.8 libgflags2.2 libsnappy1v5 zlib1g libbz2-1.0 liblz4-1 libzstd1
  # small helpers: JSON, CLI, TOML, YAML, HTTP
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libtomlplusplus3 libyaml-cpp-dev libyaml-cpp0.7
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli1
)
if ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then apt-get update -qq; fi
(cd "$OUT" && apt-get download -q "${PKGS[@]}" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' || true)
cp "$HERE/unpack.sh" "$HERE/env.sh" "$OUT/"
n=$(ls "$OUT"/*.deb | wc -l)
echo "bundle: $n .debs, $(du -cb "$OUT"/*.deb | tail -1 | awk '{printf "%.1f MB", $1/1e6}') in $OUT"
[ "$n" -eq "${#PKGS[@]}" ] || { echo "bundle: expected ${#PKGS[@]} .debs" >&2; exit 1; }
