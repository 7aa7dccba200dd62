#!/usr/bin/env bash
# scripts/gpu-bundle.sh [OUTDIR=.deps] -- on a Debian 12 machine with apt: the dependency bundle a
# GPU node without network needs (see README, "GPU node"): the shared bundle plus what Strata adds
# to it (xxHash for record checksums, libsystemd's headers for sd_notify, the brotli, OpenSSL and zlib
# headers Debian's cpp-httplib was built against; for tokenizer/: PCRE2's headers (the node's own
# libpcre2-8.so.0 is used at run time), ICU 72 and SentencePiece, which Ubuntu 24.04 has not, or
# not as -dev). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.deps}
rm -rf "$out"  # bundle.sh counts the .debs it finds there
bash scripts/gpu-node/bundle.sh "$out"
(cd "$out" && apt-get download -q libxxhash-dev libxxhash0 libsystemd-dev libbrotli-dev libssl-dev zlib1g-dev \
   libpcre2-dev libpcre2-8-0 libicu-dev libicu72 libsentencepiece-dev libsentencepiece0 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' || true)
ls "$out"/libxxhash-dev_*.deb "$out"/libsystemd-dev_*.deb "$out"/libpcre2-dev_*.deb "$out"/libicu-dev_*.deb \
   "$out"/libicu72_*.deb "$out"/libsentencepiece-dev_*.deb "$out"/libsentencepiece0_*.deb >/dev/null
echo "gpu-bundle: $(ls "$out"/*.deb | wc -l) .debs in $out"
