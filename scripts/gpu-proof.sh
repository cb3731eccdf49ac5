#!/usr/bin/env bash
# The correctness proof on a GPU, in one device call: every test executable of the
# workspace with CUDABUF_REQUIRE_CUDA=1 (conformance, Arrow, streams, driver, fast paths,
# the command), the examples on CUDA, the device-fill and load cases, the Python package's
# suite and interop checks, then compute-sanitizer memcheck over the CUDA conformance
# binary with the time that is left. (The figures are scripts/gpu-perf.sh,
# gpu-streams.sh, gpu-alloc.sh and gpu-python.sh's bench; scripts/gpu-batch.sh runs those.)
#
#   scripts/gpu-proof.sh pack     # here: .gpu/ (tests, examples, the command) and .whl/
#   scripts/gpu-proof.sh run      # there, from the repo root, with .gpu and .whl carried
#
# `run` writes $OUT/proof-summary.txt and $OUT/proof.tgz (every log); each step has its own
# time limit, a failed step is reported and the rest still run, and the whole stays under
# PROOF_DEADLINE_S (default 560) seconds (the test executables: PROOF_TESTS_S, default
# 260). Exit status: 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh

pack() {
  set -e
  scripts/gpu-conformance.sh pack
  for example in pipeline; do
    CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release --features cuda --example "$example"
    cp target/release/examples/"$example" .gpu/bin/ && strip .gpu/bin/"$example"
  done
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release -p cudabuf-arrow --features cuda --example arrow_roundtrip
  cp target/release/examples/arrow_roundtrip .gpu/bin/ && strip .gpu/bin/arrow_roundtrip
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release -p cudabuf-cli
  cp target/release/cudabuf .gpu/bin/ && strip .gpu/bin/cudabuf
  scripts/gpu-python.sh pack
  # What cannot run there or proves nothing there: the simulator's conformance and Arrow
  # binaries and the compile-fail tests (they need cargo). Leaving them out keeps the
  # carried tree under the device's 64 MiB.
  for f in $(grep -E '^(sim-|compile_fail-)' .gpu/list); do rm -f ".gpu/bin/$f"; done
  grep -vE '^(sim-|compile_fail-)' .gpu/list > .gpu/list.new && mv .gpu/list.new .gpu/list
  # The binaries that the crash and hang traces (CUDABUF_CRASH_TRACE,
  # CUDABUF_HANG_TRACE_SECS) are for keep their symbol tables (built without debug
  # information, a few MiB more), so that their stacks name cudabuf's frames too.
  for f in $(conformance_bin) $(grep -E '^(streams|fast_paths|driver)-' .gpu/list); do
    cp "target/release/deps/$f" ".gpu/bin/$f"
  done
  du -sh .gpu .whl
}

run() {
  local out=${OUT:-target/gpu-proof} logs=/tmp/gpu-proof start=$SECONDS fail=0
  local deadline=${PROOF_DEADLINE_S:-560}
  rm -rf "$logs" && mkdir -p "$logs" "$out"
  local summary="$out/proof-summary.txt"
  : >"$summary"
  note() { echo "$*" | tee -a "$summary"; }
  step() { # step NAME LIMIT COMMAND...: runs COMMAND with the limit, notes how it ended
    local name=$1 limit=$2 t0=$SECONDS rc; shift 2
    echo; echo "##### $name (limit ${limit}s, at $((SECONDS - start)) s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    [ $rc -ne 0 ] && fail=1
    note "$name: exit $rc after $((SECONDS - t0)) s"
  }
  note "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"

  # Root can force a pid for the pid-reuse case: make it fail rather than skip.
  step "test executables and quickstart (CUDABUF_REQUIRE_CUDA=1)" "${PROOF_TESTS_S:-260}" \
    env CUDABUF_REQUIRE_PID_REUSE=1 CUDABUF_CONFORMANCE_WATCHDOG_SECS=30 SKIP_SANITIZER=1 \
    scripts/gpu-conformance.sh run "$logs/tests"
  grep -E '^=== FAILED|passed: ' "$logs/tests/"*.log "$logs/tests/"*.txt 2>/dev/null | tee -a "$summary"
  grep -h -B1 -A6 'panicked at' "$logs/tests/tests.log" 2>/dev/null | head -60

  step "pipeline example on CUDA" 60 sh -c \
    'CUDABUF_BACKEND=cuda .gpu/bin/pipeline 1G 8M >"$1" 2>&1; rc=$?; cat "$1"; exit $rc' sh "$logs/pipeline.log"
  step "arrow example on CUDA" 30 sh -c \
    'CUDABUF_BACKEND=cuda .gpu/bin/arrow_roundtrip >"$1" 2>&1; rc=$?; tail -5 "$1"; exit $rc' sh "$logs/arrow_example.log"
  step "cudabuf info" 30 sh -c '.gpu/bin/cudabuf info | tee "$1"; grep -q "^cuda: available" "$1"' sh "$logs/info.txt"

  local conf
  conf=$(conformance_bin)
  step "device filled with buffers (alone)" 90 sh -c \
    'cd .gpu/bin && CUDABUF_REQUIRE_CUDA=1 CUDABUF_FILL_DEVICE=1 ./"$1" --exact cuda::device_filled_with_buffers_gives_out_of_memory_and_recovers >"$2" 2>&1; rc=$?; grep -E "test result|panicked" "$2"; exit $rc' \
    sh "$conf" "$logs/fill.log"
  step "stream-ordered out-of-memory (alone)" 60 sh -c \
    'cd .gpu/bin && CUDABUF_REQUIRE_CUDA=1 CUDABUF_FILL_DEVICE=1 ./"$1" --exact cuda::stream_alloc_out_of_memory_waits_for_pending_frees >"$2" 2>&1; rc=$?; grep -E "test result|panicked" "$2"; exit $rc' \
    sh "$conf" "$logs/stream_oom.log"
  step "load: 16 threads for 15 s" 45 sh -c \
    'cd .gpu/bin && CUDABUF_REQUIRE_CUDA=1 CUDABUF_STRESS_SECS=15 CUDABUF_STRESS_THREADS=16 ./"$1" --exact cuda::stress_mixed_operations_on_many_threads_lose_nothing --nocapture >"$2" 2>&1; rc=$?; grep -E "test result|panicked|operations" "$2" | head -5; exit $rc' \
    sh "$conf" "$logs/stress.log"

  if ls .whl/cudabuf-*.whl >/dev/null 2>&1; then
    step "python: pytest, interop, IPC, bandwidth" 150 env OUT="$logs/python" scripts/gpu-python.sh run
    cat "$logs/python/summary.txt" 2>/dev/null | tee -a "$summary"
  else
    note "python: no wheel in .whl/ (scripts/gpu-python.sh pack): not run"
    fail=1
  fi

  local left=$((deadline - (SECONDS - start)))
  if [ "$left" -gt 45 ]; then
    step "compute-sanitizer memcheck (the CUDA conformance binary)" "$left" \
      env SANITIZER_ONLY=1 scripts/gpu-conformance.sh run "$logs/sanitizer"
    grep -hE 'ERROR SUMMARY|LEAK SUMMARY|test result' "$logs/sanitizer/sanitizer.log" 2>/dev/null | tee -a "$summary"
  else
    note "compute-sanitizer: not run (only ${left} s left of ${deadline})"
    fail=1
  fi
  note "total $((SECONDS - start)) s; $([ $fail -eq 0 ] && echo 'every step passed' || echo 'a step FAILED')"
  tar czf "$out/proof.tgz" -C /tmp gpu-proof
  return $fail
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
