#!/usr/bin/env bash
# Every performance figure of issue 13 in one device call, with PyTorch and CuPy beside
# cudabuf (docs/PERFORMANCE.md, "How to reproduce").
#
#   scripts/gpu-perf.sh pack          # here, on the build machine: adds .gpu/perf/
#   scripts/gpu-perf.sh run [DIR]     # on the GPU machine, from the repo root, .gpu/ carried
#   scripts/gpu-perf.sh sim [DIR]     # here: the same figures on the simulator
#   scripts/gpu-perf.sh plot DIR LABEL  # here: the PNG curves in docs/ from DIR's JSON
#
# `pack` builds, with the CUDA backend and without debug info, the `perf` bench, the Arrow
# throughput bench, the CUDA fast-path tests (staged and batched copies) and the Arrow
# cases on CUDA, into .gpu/perf/ (it keeps the rest of .gpu/, so it can follow
# scripts/gpu-all.sh pack). About 17 MiB; a few minutes here.
#
# `run` (about 4-5 minutes on the H200; every step has its own time limit and the whole
# stops at 7.5 minutes, PERF_DEADLINE_S=450; perf writes its JSON after every section, so
# a step cut short keeps what it measured; a step that fails is reported and the others
# still run):
#   1. the host and GPU (nvidia-smi, CPUs, transparent huge pages);
#   2. the fast-path tests and the Arrow cases on CUDA (CUDABUF_REQUIRE_CUDA=1), so that
#      wrong bytes are caught in the same call as the figures;
#   3. perf on CUDA with the curve sizes 4 KiB..1 GiB (copies, the host-memcpy bound,
#      staging sweep, allocation and its curve over live allocations, IPC and its curve
#      over open handles, writer, buffer_from_data, dispatch) -> perf.json;
#   4. arrow_throughput (1M rows x 8 columns, 64 MiB) -> arrow.json;
#   5. scripts/bench_compare.py: PyTorch and CuPy at the same sizes and live counts, and
#      the table of targets -> compare.json, compare.md.
# Results go to DIR (default $OUT on the lent machine, else target/bench-logs/perf-gpu):
# exactly two files, perf-summary.md (the table of targets, and which steps failed) and
# perf.tgz (perf.json, arrow.json, compare.json, compare.md, every log), so that with
# scripts/gpu-all.sh's six files the call stays within the eight files the device tool
# brings back. Back here: tar xzf perf.tgz, then `scripts/gpu-perf.sh plot DIR h200`.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh

# The bandwidth curves' sizes (4 KiB to 1 GiB in steps of 4x).
CURVE_SIZES=4K,16K,64K,256K,1M,4M,16M,64M,256M,1G

pack() {
  set -e
  mkdir -p .gpu/perf
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
  pack_exe .gpu/perf/perf "the perf bench" bench -p cudabuf --features cuda --bench perf --no-run
  pack_exe .gpu/perf/arrow_throughput "the arrow bench" \
    bench -p cudabuf-arrow --features cuda --bench arrow_throughput --no-run
  pack_exe .gpu/perf/fast_paths "the fast-path tests" \
    test --release -p cudabuf-cuda --test fast_paths --no-run
  pack_exe .gpu/perf/arrow_cuda "the Arrow CUDA cases" \
    test --release -p cudabuf-arrow --features cuda --test cuda --no-run
  ls -la .gpu/perf
  du -sh .gpu
}

# step NAME LIMIT_S CMD...: run CMD with a time limit (never past the deadline), its
# output in $logs/NAME.log; say how it ended.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$(( deadline - SECONDS ))
  if [ "$left" -lt 20 ]; then
    echo "##### $name: SKIPPED, no time left ($left s)" | tee -a "$logs/steps.txt"
    fail=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "##### $name ($(( SECONDS - start )) s so far, limit $limit s)"
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  local status="ok"
  [ "$rc" -eq 124 ] && status="TIMED OUT after $limit s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && status="FAILED (exit $rc)"
  [ "$rc" -ne 0 ] && fail=1
  echo "$name: $status in $(( SECONDS - t0 )) s" | tee -a "$logs/steps.txt"
}

run() {
  local dir=${1:-${OUT:-target/bench-logs/perf-gpu}}
  local logs=/tmp/cudabuf-perf
  start=$SECONDS
  deadline=$(( SECONDS + ${PERF_DEADLINE_S:-450} ))
  fail=0
  rm -rf "$logs" && mkdir -p "$logs" "$dir"
  export PYTHONUNBUFFERED=1 CUDABUF_BACKEND=cuda RUST_BACKTRACE=1
  if [ ! -x .gpu/perf/perf ]; then
    echo "no .gpu/perf/perf: run 'scripts/gpu-perf.sh pack' here first and carry .gpu/" >&2
    return 2
  fi
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    git log -1 --format='commit %h %s' 2>/dev/null || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
    echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
    echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
    echo "numa: $(lscpu 2>/dev/null | grep -E '^NUMA node\(s\)' | tr -s ' ')"
    free -g | head -2
    python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)' 2>&1
  } 2>&1 | tee "$logs/host.txt"

  step fast_paths 90 env CUDABUF_REQUIRE_CUDA=1 .gpu/perf/fast_paths --test-threads=1
  grep -E '^test |test result' "$logs/fast_paths.log" 2>/dev/null
  step arrow_cuda 90 env CUDABUF_REQUIRE_CUDA=1 .gpu/perf/arrow_cuda
  grep -E 'test result|FAILED|panicked' "$logs/arrow_cuda.log" 2>/dev/null

  step perf 270 .gpu/perf/perf --sizes "$CURVE_SIZES" --json "$logs/perf.json"
  grep -E 'FAILED|NOT RUN|did NOT run' "$logs/perf.log" 2>/dev/null
  sed -n '/^pageable copies against pinned/,/^$/p' "$logs/perf.log" 2>/dev/null
  echo "staging sweep, best of each direction:"
  grep -E '^\| sweep' "$logs/perf.log" 2>/dev/null | sort -t'|' -k5 -g -r | head -4

  step arrow 60 .gpu/perf/arrow_throughput --bench --json "$logs/arrow.json"
  cat "$logs/arrow.log" 2>/dev/null

  step compare 200 python3 scripts/bench_compare.py --ours "$logs/perf.json" --arrow "$logs/arrow.json" \
    --sizes "$CURVE_SIZES" --skip-peer --out "$logs"
  tail -4 "$logs/compare.log" 2>/dev/null

  {
    echo "# cudabuf performance run ($(( SECONDS - start )) s)"
    echo
    sed 's/^/    /' "$logs/host.txt"
    echo
    echo "Steps:"
    echo
    sed 's/^/- /' "$logs/steps.txt"
    echo
    cat "$logs/compare.md" 2>/dev/null || echo "(no compare.md: the comparison did not finish)"
  } >"$dir/perf-summary.md"
  tar czf "$dir/perf.tgz" -C "$logs" .
  echo
  grep -E 'MISSED|targets met' "$dir/perf-summary.md"
  echo "=== done in $(( SECONDS - start )) s; $dir: perf-summary.md, perf.tgz ($(du -h "$dir/perf.tgz" | cut -f1))"
  return $fail
}

sim() {
  local dir=${1:-target/bench-logs/perf-sim}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)  # cargo bench runs each bench from its package's folder
  local t0=$SECONDS
  # Up to 256 MiB: the simulator's 1 GiB copies add a minute here and no new shape.
  cargo bench -p cudabuf --bench perf -- --sizes "${SIM_SIZES:-4K,16K,64K,256K,1M,4M,16M,64M,256M}" \
    --json "$dir/perf.json" >"$dir/perf.log" 2>&1 || echo "perf FAILED (see $dir/perf.log)"
  cargo bench -p cudabuf-arrow --bench arrow_throughput -- --json "$dir/arrow.json" >"$dir/arrow.log" 2>&1 ||
    echo "arrow_throughput FAILED (see $dir/arrow.log)"
  python3 scripts/bench_compare.py --compare-only --ours "$dir/perf.json" --arrow "$dir/arrow.json" \
    --sizes "${SIM_SIZES:-4K,16K,64K,256K,1M,4M,16M,64M,256M}" --skip-peer --out "$dir" >/dev/null
  sed -n '/^simulator copy \/ host memcpy/,$p' "$dir/perf.log"
  cat "$dir/arrow.log" | grep -v '^ *Running\|Finished\|Compiling'
  echo "=== done in $(( SECONDS - t0 )) s; $dir: perf.json, arrow.json, compare.md; plots: scripts/gpu-perf.sh plot $dir sim"
}

plot() {
  local dir=${1:?the folder with perf.json (and compare.json)} label=${2:?a label: h200, sim}
  local peers=()
  [ -f "$dir/compare.json" ] && peers=(--peers "$dir/compare.json")
  python3 scripts/plot_perf.py --ours "$dir/perf.json" "${peers[@]}" --label "$label" --out docs
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  sim) shift; sim "$@" ;;
  plot) shift; plot "$@" ;;
  *) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
