#!/usr/bin/env bash
# Several GPUs (issue 7): the multi-device conformance cases and the peer-copy figures, in
# one device call on a machine with 2+ GPUs (the device tool's `nvidia-h200-x2`).
#
#   scripts/gpu-multi.sh pack      # here, on the build machine: fills .gpu/
#   scripts/gpu-multi.sh run       # on the GPU machine, from the repo root, .gpu/ carried
#
# `pack` = scripts/gpu-conformance.sh pack (every test executable of the workspace with the
# CUDA backend, quickstart) plus the `perf` bench (scripts/gpu-all.sh's way).
# `run` prints the GPUs and their topology, runs every packed test executable with
# CUDABUF_REQUIRE_CUDA=1 (the conformance suite on CUDA, where no multi-device case may be
# ignored now; the backend's driver tests, including peer access on and off), lists the
# multi-device cases' results, then the peer copies (scripts/bench-compare.sh peer:
# cudabuf with peer access and with CUDABUF_PEER_ACCESS=0, PyTorch's tensor.to('cuda:1')
# and back). Logs go to $OUT (summary.txt, tests.log, multi.txt, compare.md, ours_peer.json,
# logs.tgz); it exits non-zero if any part failed. About 4 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."

# The cases that need 2 devices (ignored with one GPU, run here).
MULTI_CASES="peer_copy_between_devices_0_and_1 peer_copy_large_between_devices_both_directions
buffer_from_data_of_other_device_buffer_copies contexts_of_different_devices_differ
buffer_context_device_number_is_its_device buffer_from_object_of_other_device_buffer_is_invalid_argument
foreign_buffer_of_other_device_memory_is_invalid_address host_buffer_is_portable_to_other_devices
shared_context_of_other_device_handle_is_invalid_argument ipc_open_in_child_process_on_other_device"

. scripts/gpu-lib.sh

pack() {
  set -e
  scripts/gpu-conformance.sh pack
  pack_exe .gpu/bin/ "the perf bench" bench -p cudabuf --features cuda --bench perf --no-run
  du -sh .gpu
}

run() {
  local logs=/tmp/gpu-multi-logs out=${OUT:-gpu-out} fail=0 start=$SECONDS
  rm -rf "$logs" && mkdir -p "$logs/bench" "$out"
  step() { echo; echo "##### $* ($(( SECONDS - start )) s)"; }
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
    nvidia-smi topo -m
    nproc
  } 2>&1 | tee "$logs/gpu.txt"
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "only ${gpus:-0} GPU(s) here: the multi-device cases would be ignored; run this on nvidia-h200-x2" >&2
    fail=1
  fi

  step "every test executable, CUDABUF_REQUIRE_CUDA=1"
  timeout 280 .gpu/run-all -- --test-threads=4 >"$logs/tests.log" 2>&1 || fail=1
  grep -E '^(===|test result)' "$logs/tests.log"
  echo "passed: $(grep -hoE '[0-9]+ passed' "$logs/tests.log" | awk '{s+=$1} END {print s+0}')," \
       "failed: $(grep -hoE '[0-9]+ failed' "$logs/tests.log" | awk '{s+=$1} END {print s+0}')," \
       "ignored: $(grep -hoE '[0-9]+ ignored' "$logs/tests.log" | awk '{s+=$1} END {print s+0}')" |
    tee "$logs/counts.txt"

  step "the multi-device cases"
  local c line
  for c in $MULTI_CASES; do
    line=$(grep -E "^test cuda::$c( |$)" "$logs/tests.log" | head -1)
    echo "${line:-test cuda::$c ... NOT FOUND}"
  done | tee "$logs/multi.txt"
  # Every one must have run and passed: not failed, not ignored, not missing.
  grep -q -v '\.\.\. ok$' "$logs/multi.txt" && fail=1
  grep -E 'peer_access_is_enabled|cuDeviceCanAccessPeer' "$logs/tests.log" | head -6

  step "peer copies: cudabuf with and without peer access, PyTorch .to('cuda:1')"
  timeout 200 scripts/bench-compare.sh peer "$logs/bench" || fail=1

  step "packing logs"
  {
    cat "$logs/counts.txt"
    cat "$logs/multi.txt"
    grep -E '^\| peer|NOT RUN|did NOT run|^  d2d' "$logs/bench/ours_peer.log" 2>/dev/null
  } >"$out/summary.txt"
  cp "$logs/tests.log" "$logs/multi.txt" "$out/" 2>/dev/null
  cp "$logs/bench/peer/compare.md" "$out/compare.md" 2>/dev/null
  cp "$logs/bench/ours_peer.json" "$out/ours_peer.json" 2>/dev/null
  tar czf "$out/logs.tgz" -C /tmp gpu-multi-logs
  ls -la "$out"
  echo "done in $(( SECONDS - start )) s, fail=$fail"
  return $fail
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
