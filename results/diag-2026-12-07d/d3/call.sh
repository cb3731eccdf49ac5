#!/bin/bash
# The retry schedule of adaptive staging for much slower paths, far retries only once the
# slower path's window is full (binaries of the commit in
# .gpu/packed, suites correctness perf): the CUDA tests, perf's adaptive section twice
# (medians, means and every copy's time), perf's copies at 1-16 MiB beside the peers twice.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-200}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; cat .gpu/packed; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 15 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-driver cuda-streams cuda-diag cuda-fast_paths; do run $t 60 $R .gpu/bin/$t --test-threads=4; done
run conformance-cuda 60 $R .gpu/bin/conformance-cuda --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | sort | uniq -c
for k in 1 2; do mkdir -p $O/ad$k; run ad$k 60 .gpu/bin/perf --only adaptive --json "$O/ad$k/perf.json"; grep -E "^\| adaptive \| (h2d|d2h)_adaptive" $O/ad$k.log | cut -c1-150; done
for k in 1 2; do [ -f $O/ad$k/adaptive_raw.json ] && python3 results/diag-2026-12-07d/d1/replay.py $O/ad$k/adaptive_raw.json > $O/replay$k.log 2>&1; grep -E "adaptive med" $O/replay$k.log | head -14; done
S=1M,4M,16M
for k in 1 2; do mkdir -p $O/cp$k
  run cp$k-perf 40 .gpu/bin/perf --only copies --sizes $S --json "$O/cp$k/perf.json"
  run cp$k-peers 40 python3 scripts/bench_compare.py --ours "$O/cp$k/perf.json" --skip-peer --copies-only --sizes $S --out "$O/cp$k"
  grep -E "^\| (h2d|d2h)_pageable \||^\| d2d \|" $O/cp$k/compare.md | cut -c1-110
done
