#!/usr/bin/env bash
# The caching allocator on a recorded trace, next to PyTorch's (issue 13, item 3;
# docs/PERFORMANCE.md, "Caching allocator").
#
#   scripts/gpu-alloc.sh pack        # here, on the build machine: the alloc_trace bench for CUDA into .gpu/bin
#   scripts/gpu-alloc.sh run [DIR]   # on the GPU machine, from the repo root, .gpu/ carried
#   scripts/gpu-alloc.sh sim [DIR]   # here: the same replay on the simulator (its latencies are
#                                    # the simulator's; hit rate and memory are the allocator's)
#
# `pack` builds benches/alloc_trace.rs with the CUDA backend (release, no debug info, as
# ../shared/tools/gpu-pack does) and adds it to .gpu/bin, keeping what another pack
# (scripts/gpu-all.sh pack, say) put there, so that one device call can run both.
# `run` generates the trace (100,000 allocations, sizes log-uniform 256 B - 64 MiB, seed 42;
# into /tmp, it is 2 MB), replays it with cudabuf on CUDA (DIR/alloc_ours.json and .log),
# again with stream-ordered allocation on one stream (`--stream`: DIR/alloc_ours_stream.json
# and .log; issue 11, item 2), then with PyTorch's caching allocator (scripts/alloc_trace_torch.py: DIR/alloc_torch.json),
# and writes the side-by-side table with the targets to DIR/alloc_table.md (also printed).
# DIR defaults to $OUT on the lent GPU machine, else target/alloc-logs. Well under a minute
# on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh

TRACE=/tmp/cudabuf-alloc-trace.txt

pack() {
  set -e
  mkdir -p .gpu/bin
  rm -f .gpu/bin/alloc_trace-*
  pack_exe .gpu/bin/ "the alloc_trace bench (--features cuda)" \
    bench -p cudabuf --features cuda --bench alloc_trace --no-run
  ls -la .gpu/bin | grep alloc_trace
  du -sh .gpu
}

bench_bin() {
  ls .gpu/bin/ 2>/dev/null | grep -E '^alloc_trace-[0-9a-f]+$' | head -1
}

# replay BACKEND DIR BIN...: generate the trace, replay it with cudabuf (BIN...), then PyTorch.
replay() {
  local backend=$1 dir=$2; shift 2
  local fail=0 start=$SECONDS
  mkdir -p "$dir"
  "$@" generate "$TRACE" || return 1
  head -1 "$TRACE"
  sha256sum "$TRACE" | tee "$dir/alloc_trace.sha256"
  echo "=== cudabuf on $backend"
  CUDABUF_BACKEND=$backend timeout 150 "$@" replay "$TRACE" --json "$dir/alloc_ours.json" \
    >"$dir/alloc_ours.log" 2>&1 || fail=1
  cat "$dir/alloc_ours.log"
  echo "=== cudabuf on $backend, new_buffer_on one stream"
  CUDABUF_BACKEND=$backend timeout 150 "$@" replay "$TRACE" --stream \
    --json "$dir/alloc_ours_stream.json" >"$dir/alloc_ours_stream.log" 2>&1 || fail=1
  cat "$dir/alloc_ours_stream.log"
  echo "=== PyTorch ($(( SECONDS - start )) s so far)"
  local torch_json=()
  [ "$backend" = cuda ] && torch_json=(--json "$dir/alloc_torch.json")
  local ours=()
  [ -f "$dir/alloc_ours.json" ] && ours=(--ours "$dir/alloc_ours.json")
  timeout 150 python3 scripts/alloc_trace_torch.py --trace "$TRACE" "${ours[@]}" \
    "${torch_json[@]}" --markdown "$dir/alloc_table.md" 2>"$dir/alloc_torch.log"
  local status=$?
  cat "$dir/alloc_torch.log"
  # Exit status 2: PyTorch did not run (the table says why); on the GPU that is a failure.
  if [ "$status" -ne 0 ] && { [ "$backend" = cuda ] || [ "$status" -ne 2 ]; }; then fail=1; fi
  echo "=== done in $(( SECONDS - start )) s; table in $dir/alloc_table.md"
  return $fail
}

run() {
  local dir=${1:-${OUT:-target/alloc-logs}}
  mkdir -p "$dir"
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  } 2>&1 | tee "$dir/alloc_gpu.txt"
  local bin
  bin=$(bench_bin)
  if [ -z "$bin" ]; then
    echo "no alloc_trace binary in .gpu/bin: run 'scripts/gpu-alloc.sh pack' first" >&2
    return 2
  fi
  replay cuda "$dir" .gpu/bin/"$bin"
}

sim() {
  local dir=${1:-target/alloc-logs/sim}
  cargo build --release --bench alloc_trace >/dev/null 2>&1 || { echo "build failed" >&2; return 1; }
  local exe
  exe=$(artifact bench -p cudabuf --bench alloc_trace --no-run)
  replay sim "$dir" "$exe"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  sim) shift; sim "$@" ;;
  *) echo "usage: $0 pack | run [DIR] | sim [DIR]" >&2; exit 2 ;;
esac
