#!/usr/bin/env bash
# Hunts the CUDA test binaries' hangs (docs/gpu-runs.md, RELIABILITY.md) with the hang
# trace armed (CUDABUF_HANG_TRACE_SECS, backend-cuda/tests/common/diag.rs): each binary
# below runs in a loop; a run that outlives its limit prints every thread's stack and
# ends with exit status 124.
#
#   scripts/gpu-proof.sh pack            # here (keeps the traced binaries' symbols)
#   scripts/gpu-hang-trace.sh run [DIR]  # there, from the repo root, .gpu/ carried
#
# Loops (HANG_RUNS runs each, default 20): the CUDA stream tests; the fast-path tests;
# the CUDA conformance binary in parallel (HANG_SUITE_RUNS, default 5); then the
# conformance binary with CUDABUF_CONFORMANCE_ALONE=off (HANG_ALONE_OFF_RUNS, default 2):
# the cases of `cases::ALONE` beside the others.
# `run` writes DIR/hang-summary.txt (the exit statuses counted per loop) and
# DIR/hang-logs.tgz (every run's output). DIR: $OUT, else target/hang-trace.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh

run() {
  local dir=${1:-${OUT:-target/hang-trace}} logs=/tmp/hang-trace runs=${HANG_RUNS:-20}
  rm -rf "$logs" && mkdir -p "$logs" "$dir"
  ulimit -c 0
  local conf streams fast
  conf=$(conformance_bin)
  streams=$(grep -E '^streams-' .gpu/list | head -1)
  fast=$(grep -E '^fast_paths-' .gpu/list | head -1)
  export CUDABUF_REQUIRE_CUDA=1 CUDABUF_CRASH_TRACE=1
  loop() { # loop NAME RUNS TRACE_SECS BINARY ARGS...: the exit statuses, counted
    local name=$1 n=$2 secs=$3 i rc; shift 3
    for i in $(seq 1 "$n"); do
      (cd .gpu/bin && CUDABUF_HANG_TRACE_SECS=$secs timeout -s KILL $((secs + 30)) "./$@") \
        >"$logs/$name-$i.log" 2>&1
      rc=$?
      echo "$rc"
      [ $rc -ne 0 ] && echo "$name run $i: exit $rc" >>"$logs/failures.txt"
    done | sort | uniq -c | sed "s/^/$name: exit statuses (count, status): /" | tee -a "$dir/hang-summary.txt"
  }
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$dir/hang-summary.txt"
  loop streams "$runs" 20 "$streams"
  loop fast_paths "$runs" 20 "$fast"
  loop suite "${HANG_SUITE_RUNS:-5}" 40 "$conf"
  CUDABUF_CONFORMANCE_ALONE=off CUDABUF_CONFORMANCE_WATCHDOG_SECS=10 \
    loop suite-alone-off "${HANG_ALONE_OFF_RUNS:-2}" 30 "$conf"
  cat "$logs/failures.txt" 2>/dev/null | tee -a "$dir/hang-summary.txt"
  tar czf "$dir/hang-logs.tgz" -C /tmp hang-trace
}

case "${1:-}" in
  run) shift; run "$@" ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
