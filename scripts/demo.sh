#!/usr/bin/env bash
# The main job on the embedded default: sets up a fresh Debian 12 machine, builds, starts a local
# cluster of 2 CPU workers, trains a small GPT-2 on the GPL text shipped with Debian (byte-level
# tokens) while following its progress, lists its checkpoints and stops the cluster.
# State goes to $STRATA_STATE_DIR (default ~/.local/share/strata).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bash scripts/build.sh
strata=build/bin/strata
trap '$strata down || true' EXIT
$strata up --workers 2
$strata workers
log=$(mktemp)
$strata submit examples/gpt2-tiny.toml --follow | tee "$log"
run=$(head -n1 "$log")
rm -f "$log"
$strata checkpoints "$run"
