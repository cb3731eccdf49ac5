#!/usr/bin/env bash
# The driver-only reproduction attempt of the conformance hang (docs/gpu-runs.md,
# 2026-12-03; backend-cuda/examples/driver_lock_repro.rs): the call patterns in several
# mixes, each until it hangs (no progress for 20 s: the threads' calls are printed) or for
# its time.
#
#   scripts/gpu-driver-repro.sh pack        # here: the example into .gpu/bin
#   scripts/gpu-driver-repro.sh run [DIR]   # there, from the repo root, .gpu/ carried
#
# `run` writes DIR/driver-repro.txt (DIR: $OUT, else target/driver-repro).
set -uo pipefail
cd "$(dirname "$0")/.."

pack() {
  set -e
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release -p cudabuf-cuda --example driver_lock_repro
  mkdir -p .gpu/bin
  cp target/release/examples/driver_lock_repro .gpu/bin/ && strip .gpu/bin/driver_lock_repro
}

run() {
  local dir=${1:-${OUT:-target/driver-repro}} secs=${REPRO_SECS:-45}
  mkdir -p "$dir"
  ulimit -c 0
  for mix in ${REPRO_MIXES:-PSEDDR PPSS PSE PSD SSEEDD PPEEDD}; do
    echo "### $mix ($secs s)"
    timeout -s KILL $((secs + 30)) .gpu/bin/driver_lock_repro "$mix" "$secs"
    echo "exit $?"
  done 2>&1 | tee "$dir/driver-repro.txt"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
