#!/usr/bin/env bash
# Everything the project measures on a GPU, in one device call.
#
#   scripts/gpu-all.sh pack        # here, on the build machine: fills .gpu/
#   scripts/gpu-all.sh run         # on the GPU machine, from the repo root, .gpu/ carried
#
# `pack` = scripts/gpu-conformance.sh pack (every test executable of the workspace with
# the CUDA backend, quickstart) plus the `perf` bench, the `cudabuf` command, the CUDA
# fast-path tests (scripts/bench-compare.sh's pieces) and the Arrow throughput bench.
# `run` = the conformance run (tests with CUDABUF_REQUIRE_CUDA=1, quickstart), the
# comparison with PyTorch and CuPy, the Arrow bench, then compute-sanitizer memcheck over
# the CUDA conformance binary; each step has its own time limit so the whole fits in 10
# minutes. Logs go to a folder that is packed into $OUT/logs.tgz (the device tool brings
# back at most 8 files); the summaries are also copied to $OUT directly.
set -uo pipefail
cd "$(dirname "$0")/.."

. scripts/gpu-lib.sh

pack() {
  set -e
  scripts/gpu-conformance.sh pack
  pack_exe .gpu/bin/ "the perf bench" bench -p cudabuf --features cuda --bench perf --no-run
  pack_exe .gpu/bin/fast_paths "the fast-path tests" \
    test --release -p cudabuf-cuda --test fast_paths --no-run
  pack_exe .gpu/bin/arrow_throughput "the arrow bench" \
    bench -p cudabuf-arrow --features cuda --bench arrow_throughput --no-run
  # The `cudabuf` command (cudabuf-cli; its `cuda` feature is on by default).
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release -p cudabuf-cli
  cp target/release/cudabuf .gpu/bin/
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release -p cudabuf-arrow --features cuda --example arrow_roundtrip
  cp target/release/examples/arrow_roundtrip .gpu/bin/
  for f in .gpu/bin/*; do strip "$f" 2>/dev/null || true; done
  du -sh .gpu
}

run() {
  local logs=/tmp/gpu-logs out=${OUT:-gpu-out} fail=0 start=$SECONDS
  rm -rf "$logs" && mkdir -p "$logs/conformance" "$logs/bench" "$out"
  step() { echo; echo "##### $* ($(( SECONDS - start )) s)"; }

  step "conformance, quickstart (sanitizer later)"
  # The sanitizer runs last, on its own, so that its slowness cannot crowd out the rest.
  SKIP_SANITIZER=1 timeout 150 scripts/gpu-conformance.sh run "$logs/conformance" || fail=1

  local conf
  conf=$(conformance_bin)
  step "device filled with buffers: out of memory, then usable (alone)"
  CUDABUF_REQUIRE_CUDA=1 CUDABUF_FILL_DEVICE=1 timeout 90 .gpu/bin/"$conf" --exact \
    cuda::device_filled_with_buffers_gives_out_of_memory_and_recovers >"$logs/fill.log" 2>&1 || fail=1
  grep -E 'test result|panicked' "$logs/fill.log"

  step "stream-ordered allocation: out of memory with a free pending on another stream (alone)"
  CUDABUF_REQUIRE_CUDA=1 CUDABUF_FILL_DEVICE=1 timeout 90 .gpu/bin/"$conf" --exact \
    cuda::stream_alloc_out_of_memory_waits_for_pending_frees >"$logs/stream_oom.log" 2>&1 || fail=1
  grep -E 'test result|panicked' "$logs/stream_oom.log"

  step "load: 16 threads for 30 s"
  CUDABUF_REQUIRE_CUDA=1 CUDABUF_STRESS_SECS=30 CUDABUF_STRESS_THREADS=16 timeout 60 .gpu/bin/"$conf" \
    --exact cuda::stress_mixed_operations_on_many_threads_lose_nothing --nocapture >"$logs/stress.log" 2>&1 || fail=1
  grep -E 'test result|panicked|operations' "$logs/stress.log" | head -5

  step "cudabuf info on CUDA"
  timeout 60 .gpu/bin/cudabuf info >"$logs/info.txt" 2>&1 || fail=1
  timeout 60 .gpu/bin/cudabuf info --json >"$out/info.json" 2>>"$logs/info.txt" || fail=1
  cat "$logs/info.txt"
  grep -q "^cuda: available" "$logs/info.txt" || { echo "cudabuf info: CUDA not available"; fail=1; }

  step "arrow example on CUDA"
  CUDABUF_BACKEND=cuda timeout 30 .gpu/bin/arrow_roundtrip >"$logs/arrow_example.log" 2>&1 || fail=1
  tail -5 "$logs/arrow_example.log"

  step "performance against PyTorch and CuPy"
  timeout 280 scripts/bench-compare.sh run "$logs/bench" || fail=1

  step "arrow throughput"
  CUDABUF_BACKEND=cuda timeout 60 .gpu/bin/arrow_throughput --bench >"$logs/arrow_bench.log" 2>&1 || fail=1
  cat "$logs/arrow_bench.log" | tail -25

  step "compute-sanitizer memcheck"
  local left=$(( 560 - (SECONDS - start) ))
  if [ "$left" -gt 30 ]; then
    SANITIZER_ONLY=1 timeout "$left" scripts/gpu-conformance.sh run "$logs/conformance" || fail=1
  else
    echo "no time left for the sanitizer ($left s)"
    fail=1
  fi

  step "packing logs"
  cp "$logs/conformance/tests.log" "$out/tests.log" 2>/dev/null
  cp "$logs/bench/compare.md" "$out/compare.md" 2>/dev/null
  cp "$logs/bench/ours.json" "$out/ours.json" 2>/dev/null
  cp "$logs/arrow_bench.log" "$out/arrow_bench.log" 2>/dev/null
  grep -E 'ERROR SUMMARY|LEAK SUMMARY|test result' "$logs/conformance/sanitizer.log" > "$out/sanitizer-summary.txt" 2>/dev/null
  tar czf "$out/logs.tgz" -C /tmp gpu-logs
  ls -la "$out"
  return $fail
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
