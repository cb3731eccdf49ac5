#!/usr/bin/env bash
# The CUDA conformance run, in two halves.
#
#   scripts/gpu-conformance.sh pack [ARGS]  # here, on the build machine (Rust toolchain, no GPU needed);
#                                           # ARGS go to cargo (e.g. --exclude CRATE)
#   scripts/gpu-conformance.sh run [DIR]   # on the GPU machine, from the repo root, with .gpu/ carried over
#
# `pack` builds every test executable of the workspace with the CUDA backend (release,
# no debug info) into .gpu/ with ../shared/tools/gpu-pack when it exists (else the same
# with cargo directly), and adds the quickstart example.
# `run` prints the GPU and driver, runs every packed test executable with
# CUDABUF_REQUIRE_CUDA=1 (a CUDA case that cannot run fails), the quickstart on CUDA, and
# compute-sanitizer memcheck over the CUDA conformance binary; logs go to DIR (default
# gpu-logs/, or $OUT on the lent GPU machine), and exits non-zero if any part failed.
# SKIP_SANITIZER=1 leaves memcheck out; SANITIZER_ONLY=1 runs memcheck alone.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh

pack() {
  set -e
  local tool=../shared/tools/gpu-pack
  if [ -x "$tool" ]; then
    "$tool" test --release --workspace --features cuda "$@"
  else
    echo "gpu-pack not found: build and pack by hand into .gpu/" >&2
    exit 2
  fi
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release --features cuda --example quickstart
  cp target/release/examples/quickstart .gpu/bin/ && strip .gpu/bin/quickstart
  du -sh .gpu
}

run() {
  local dir=${1:-${OUT:-gpu-logs}}
  mkdir -p "$dir"
  local fail=0
  if [ -z "${SANITIZER_ONLY:-}" ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$dir/gpu.txt"
    echo "=== test executables (CUDABUF_REQUIRE_CUDA=1)"
    .gpu/run-all -- --test-threads=4 >"$dir/tests.log" 2>&1 || fail=1
    grep -E '^(===|test result)' "$dir/tests.log"
    echo "=== quickstart on CUDA"
    CUDABUF_BACKEND=cuda .gpu/bin/quickstart >"$dir/quickstart.log" 2>&1 || fail=1
    cat "$dir/quickstart.log"
    echo "=== summary of the test executables"
    echo "passed: $(grep -hoE '[0-9]+ passed' "$dir/tests.log" | awk '{s+=$1} END {print s+0}')," \
         "failed: $(grep -hoE '[0-9]+ failed' "$dir/tests.log" | awk '{s+=$1} END {print s+0}')," \
         "ignored: $(grep -hoE '[0-9]+ ignored' "$dir/tests.log" | awk '{s+=$1} END {print s+0}')"
  fi
  [ -n "${SKIP_SANITIZER:-}" ] && return $fail
  local cuda_bin
  cuda_bin=$(conformance_bin)
  if command -v compute-sanitizer >/dev/null && [ -n "$cuda_bin" ]; then
    echo "=== compute-sanitizer memcheck over $cuda_bin"
    # API errors are not reported: the suite provokes them on purpose (out of memory,
    # pageable and freed addresses, exporting pinned memory) and checks the typed error.
    (cd .gpu/bin && CUDABUF_REQUIRE_CUDA=1 compute-sanitizer --tool memcheck --leak-check full \
       --report-api-errors no --error-exitcode 99 "./$cuda_bin" --test-threads=1) \
       >"$dir/sanitizer.log" 2>&1 || fail=1
    grep -E 'ERROR SUMMARY|LEAK SUMMARY|test result' "$dir/sanitizer.log"
  else
    echo "=== compute-sanitizer or the CUDA conformance binary not found: memcheck not run"
    fail=1
  fi
  return $fail
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
