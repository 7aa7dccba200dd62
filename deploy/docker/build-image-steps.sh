#!/usr/bin/env bash
# The build steps of Strata's container image. deploy/docker/Dockerfile RUNs this script in its
# build stage, and CI runs it with --check, so the image is built by steps CI exercises.
#
#   build-image-steps.sh            (image: as root in nvidia/cuda:*-devel-ubuntu24.04, network on)
#     1. installs the build packages (Ubuntu 24.04 names of deploy/install-deps.sh's build set)
#     2. unpacks a CUDA LibTorch from $LIBTORCH_URL into /opt/libtorch
#     3. builds with scripts/build.sh (tests off, CUDA archs $CUDA_ARCHS)
#     4. checks that every binary starts (--help; strata-worker --version names its LibTorch)
#     5. packs binaries + library closure with deploy/bundle.sh into $STRATA_BUNDLE_OUT, which the
#        runtime stage installs with the bundle's install.sh
#   build-image-steps.sh --check    (CI / Debian 12 dev machine: what can run without the image base)
#     1. deploy/install-deps.sh (idempotent; nothing happens when all is installed)
#     3. scripts/build.sh, under flock $STRATA_BUILD_LOCK when that is set (shared build dirs)
#     4. the same start check
#     Steps 2 and 5 need the CUDA base; 5's bundle.sh is exercised by tests/deploy/offline_bundle_test.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
mode=image
case "${1:-}" in
  --check) mode=check ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
step() { echo "== build-image-steps ($mode): $*"; }

install_image_packages() {
  # Ubuntu 24.04 (the CUDA images' base) carries the same libraries as Debian 12, newer versions.
  local pkgs=(
    build-essential cmake ninja-build pkg-config libssl-dev ca-certificates curl unzip
    libzmq3-dev cppzmq-dev capnproto libcapnp-dev librocksdb-dev libxxhash-dev
    libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
    libcpp-httplib-dev libbrotli-dev zlib1g-dev libsystemd-dev
    libpcre2-dev libicu-dev libsentencepiece-dev
  )
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
  rm -rf /var/lib/apt/lists/*
}

install_libtorch() {
  # The GPU node builds against pip PyTorch 2.11 (CUDA 13); the same release's LibTorch archive.
  # file:// URLs work too (e.g. an archive copied into the build context for offline builds).
  local url=${LIBTORCH_URL:-https://download.pytorch.org/libtorch/cu130/libtorch-shared-with-deps-2.11.0%2Bcu130.zip}
  if [ -f /opt/libtorch/share/cmake/Torch/TorchConfig.cmake ]; then return; fi
  curl -fsSL --retry 3 -o /tmp/libtorch.zip "$url" \
    || { echo "cannot download LibTorch from $url; pass --build-arg LIBTORCH_URL=..." >&2; exit 1; }
  unzip -q /tmp/libtorch.zip -d /opt
  rm -f /tmp/libtorch.zip
  [ -f /opt/libtorch/share/cmake/Torch/TorchConfig.cmake ] \
    || { echo "$url did not unpack to /opt/libtorch/share/cmake/Torch; is it a LibTorch archive?" >&2; exit 1; }
}

build() {
  if [ -n "${STRATA_BUILD_LOCK:-}" ] && command -v flock >/dev/null; then
    flock "$STRATA_BUILD_LOCK" bash scripts/build.sh
  else
    bash scripts/build.sh
  fi
}

check_binaries_start() {
  local bin=$repo/build/bin   # where scripts/build.sh builds
  # The image builder has the CUDA toolkit but no driver: if LibTorch links the driver library,
  # let the toolkit's stub stand in for this check only (the runtime gets the real one from the
  # NVIDIA container toolkit; bundle.sh never packs it).
  local stubs=""
  if ldd "$bin/strata-worker" | grep -q 'libcuda.so.1 => not found' && [ -f /usr/local/cuda/lib64/stubs/libcuda.so ]; then
    stubs=$(mktemp -d)
    ln -s /usr/local/cuda/lib64/stubs/libcuda.so "$stubs/libcuda.so.1"
  fi
  for b in strata strata-coordinator strata-worker; do
    [ -x "$bin/$b" ] || { echo "FAIL: $bin/$b was not built" >&2; exit 1; }
    LD_LIBRARY_PATH="${stubs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin/$b" --help > /tmp/strata-help.$$ 2>&1 \
      || { cat /tmp/strata-help.$$ >&2; echo "FAIL: $b --help does not run" >&2; exit 1; }
    echo "$b: $(head -n1 /tmp/strata-help.$$)"
  done
  rm -f /tmp/strata-help.$$
  echo "strata-worker --version: $(LD_LIBRARY_PATH="${stubs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin/strata-worker" --version)"
  [ -z "$stubs" ] || rm -rf "$stubs"
}

if [ "$mode" = check ]; then
  step "1/3 Debian packages (deploy/install-deps.sh)"
  bash deploy/install-deps.sh
  step "2/3 build (scripts/build.sh)"
  build
  step "3/3 binaries start"
  check_binaries_start
else
  step "1/5 Ubuntu packages"
  install_image_packages
  step "2/5 LibTorch (CUDA)"
  install_libtorch
  step "3/5 build (scripts/build.sh)"
  export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
  STRATA_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=/opt/libtorch -DSTRATA_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90} ${STRATA_CMAKE_ARGS:-}" build
  step "4/5 binaries start"
  check_binaries_start
  step "5/5 bundle (deploy/bundle.sh)"
  bash deploy/bundle.sh "${STRATA_BUNDLE_OUT:-/out/strata-bundle.tar.gz}"
fi
echo "== build-image-steps ($mode): done"
