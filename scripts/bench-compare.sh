#!/usr/bin/env bash
# cudabuf's first performance comparison against PyTorch and CuPy, in two halves
# (docs/PERFORMANCE.md). The full set of figures is `scripts/gpu run perf` (docs/GPU.md);
# this script keeps the shorter run of the first sections, and the peer copies alone.
#
#   scripts/bench-compare.sh pack        # here, on the build machine (Rust toolchain, no GPU)
#   scripts/bench-compare.sh run [DIR]   # on the GPU machine, from the repo root, .gpu/ carried
#   scripts/bench-compare.sh sim [DIR]   # here: the same benchmark on the simulator
#   scripts/bench-compare.sh peer [DIR]  # on a machine with 2+ GPUs: only the copies between
#                                        # GPUs 0 and 1 (perf --only peer, then PyTorch's .to)
#
# `pack` builds the `perf` bench binary, the `cudabuf` command and the CUDA fast-path
# tests (backend-cuda/tests/fast_paths.rs) with the CUDA backend (release, no debug info)
# into .gpu/bin (replacing any earlier .gpu/). `run` and `peer` also find them where
# `scripts/gpu pack perf` puts them.
# `run` prints the GPU and driver, runs the fast-path tests, runs perf on CUDA (JSON to DIR/ours.json, its table and
# progress to DIR/ours.log), then scripts/bench_compare.py, which measures the same
# operations through PyTorch and CuPy in one process and prints one table with ratios and
# the targets met or missed (DIR/compare.md, DIR/compare.json), then `cudabuf bandwidth`.
# DIR defaults to $OUT on the lent GPU machine, else target/bench-logs/. About 3 minutes on an H200.
# With fewer than 2 GPUs the peer figures are not measured, and both halves say so.
set -uo pipefail
cd "$(dirname "$0")/.."

# The sections of the first performance issue (the curves of issue 13 are
# `scripts/gpu run perf`).
ISSUE5_SECTIONS=copies,sweep,alloc,ipc,writer,from_data,dispatch,peer
# shellcheck source=scripts/lib/gpu-common.sh
. scripts/lib/gpu-common.sh

pack() {
  set -e
  rm -rf .gpu && mkdir -p .gpu/bin
  pack_exe .gpu/bin/perf "the perf bench" bench -p cudabuf --features cuda --bench perf --no-run "$@"
  # The `cudabuf` command (cudabuf-cli; its `cuda` feature is on by default).
  pack_exe .gpu/bin/cudabuf "the cudabuf command" build --release -p cudabuf-cli
  # The CUDA fast-path tests (staged copies, async writer copies, caching allocator) run
  # first on the GPU, so that wrong bytes are caught in the same call as the figures.
  pack_exe .gpu/bin/fast_paths "the fast-path tests" \
    test --release -p cudabuf-cuda --test fast_paths --no-run
  ls -la .gpu/bin
  du -sh .gpu
}

perf_bin() {
  if [ -x .gpu/bin/perf ]; then echo perf; return; fi
  find .gpu/bin -maxdepth 1 -name 'perf-*' -printf '%f\n' 2>/dev/null | grep -E '^perf-[0-9a-f]+$' | head -1
}

# fast_paths_bin : this script's name for the fast-path tests, or scripts/gpu's.
fast_paths_bin() {
  local f
  for f in fast_paths cuda-fast_paths; do [ -x ".gpu/bin/$f" ] && { echo ".gpu/bin/$f"; return; }; done
}

run() {
  local dir=${1:-${OUT:-target/bench-logs}}
  mkdir -p "$dir"
  local fail=0 start=$SECONDS
  export PYTHONUNBUFFERED=1
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
    nproc
    grep -m1 'model name' /proc/cpuinfo || true
  } 2>&1 | tee "$dir/gpu.txt"
  local bin
  bin=$(perf_bin)
  if [ -z "$bin" ]; then
    echo "no perf binary in .gpu/bin: run 'scripts/bench-compare.sh pack' first" >&2
    return 2
  fi
  local fast
  fast=$(fast_paths_bin)
  if [ -n "$fast" ]; then
    echo "=== CUDA fast-path tests (CUDABUF_REQUIRE_CUDA=1)"
    CUDABUF_REQUIRE_CUDA=1 RUST_BACKTRACE=1 "$fast" --test-threads=1 >"$dir/fast_paths.log" 2>&1 || fail=1
    grep -E '^test |test result' "$dir/fast_paths.log" || true
  fi
  echo "=== cudabuf perf on CUDA (.gpu/bin/$bin, $(( SECONDS - start )) s so far)"
  CUDABUF_BACKEND=cuda .gpu/bin/"$bin" --only "$ISSUE5_SECTIONS" --json "$dir/ours.json" >"$dir/ours.log" 2>&1 || fail=1
  # The table (stdout) is at the end of the log; progress lines start with [perf] or spaces.
  grep -E '^\||FAILED|NOT RUN|did NOT run|^simulator|^peer' "$dir/ours.log" | grep -v '^| sweep' || true
  echo "=== staging sweep (best of each direction)"
  grep -E '^\| sweep' "$dir/ours.log" | sort -t'|' -k5 -g -r | head -4 || true
  echo "=== PyTorch and CuPy ($(( SECONDS - start )) s so far)"
  python3 scripts/bench_compare.py --ours "$dir/ours.json" --sizes 1M,64M,1G --live-levels 0 --out "$dir" 2>"$dir/compare.log" || fail=1
  tail -5 "$dir/compare.log"
  echo "=== cudabuf bandwidth ($(( SECONDS - start )) s so far)"
  if [ -x .gpu/bin/cudabuf ]; then
    .gpu/bin/cudabuf bandwidth --backend cuda --sizes 1M,64M,256M >"$dir/bandwidth.txt" 2>&1 || fail=1
    cat "$dir/bandwidth.txt"
  fi
  echo "=== done in $(( SECONDS - start )) s; results in $dir (gpu.txt, fast_paths.log, ours.json, ours.log, compare.md, compare.json, compare.log, bandwidth.txt)"
  return $fail
}

peer() {
  local dir=${1:-${OUT:-target/bench-logs}}
  mkdir -p "$dir"
  local fail=0 bin
  export PYTHONUNBUFFERED=1
  bin=$(perf_bin)
  if [ -z "$bin" ]; then
    echo "no perf binary in .gpu/bin: run 'scripts/bench-compare.sh pack' first" >&2
    return 2
  fi
  nvidia-smi topo -m 2>&1 | tee "$dir/topo.txt"
  echo "=== cudabuf peer copies (with peer access, then a child with CUDABUF_PEER_ACCESS=0)"
  CUDABUF_BACKEND=cuda .gpu/bin/"$bin" --only peer --json "$dir/ours_peer.json" >"$dir/ours_peer.log" 2>&1 || fail=1
  grep -E '^\||FAILED|NOT RUN|did NOT run|^peer|^  d2d' "$dir/ours_peer.log" || true
  echo "=== PyTorch tensor.to('cuda:1') and back"
  python3 scripts/bench_compare.py --ours "$dir/ours_peer.json" --out "$dir/peer" --peer-only 2>"$dir/compare_peer.log" || fail=1
  tail -3 "$dir/compare_peer.log"
  return $fail
}

sim() {
  local dir=${1:-target/bench-logs}
  mkdir -p "$dir"
  cargo bench -p cudabuf --bench perf -- --json "$dir/sim.json" 2>"$dir/sim.log" | tee "$dir/sim.txt"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  sim) shift; sim "$@" ;;
  peer) shift; peer "$@" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
