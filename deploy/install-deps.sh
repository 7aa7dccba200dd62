#!/usr/bin/env bash
# Installs the Debian 12 packages Strata builds and runs with, and every package its tests use
# (with them, only the GPU tests skip on a machine without a GPU). Idempotent: installs only what is
# missing, and does nothing (not even apt-get update) when everything is there. Run as root, or
# as a user with sudo.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config ccache libssl-dev
  clang libclang-rt-dev                          # scripts/fuzz.sh: libFuzzer, ASan, UBSan; scripts/thread-safety.sh
  clang-format                                   # scripts/check-format.sh: the C++ layout (.clang-format)
  libtorch-dev                                   # LibTorch 1.13 (CPU): worker execution only
  libzmq3-dev cppzmq-dev                         # ZeroMQ 4.3 (+ CURVE via libsodium)
  capnproto libcapnp-dev                         # Cap'n Proto 0.9: wire format and record headers
  librocksdb-dev                                 # RocksDB 7.8: shard and metadata stores
  libxxhash-dev                                  # record checksums
  libspdlog-dev libfmt-dev                       # logging (behind common/log.h)
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libcpp-httplib-dev
  libpcre2-dev libicu-dev libsentencepiece-dev    # strata tokenize: regexes, NFC, SentencePiece (tokenizer/)
  libgtest-dev libgmock-dev
  base-files                                     # /usr/share/common-licenses: the demo corpus
  systemd                                        # systemd-analyze verify of the units (tests)
  libsystemd-dev                                 # sd_notify: readiness + watchdog under systemd
  chromium                                       # headless dashboard test
  debootstrap                                    # offline-bundle test in a fresh Debian root
  docker-compose                                 # validates deploy/docker/compose.yaml offline
  podman runc                                    # builds and runs the image in CI, no registry (runc: hybrid cgroup hosts)
  python3-numpy                                  # tests read what Strata writes (.npy, safetensors); the Python package
  python3-jsonschema python3-yaml                # deploy/k8s validated offline against Kubernetes' JSON schemas (deploy_k8s_manifests)
  pybind11-dev python3-dev                       # the Python package (python/): its extension module
  iproute2                                       # tests/multihost: network namespaces, veth pairs, a bridge
  slurm-wlm munge                                # tests/slurm: its own slurmctld + slurmd (and munged) run deploy/slurm/strata.sbatch
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
