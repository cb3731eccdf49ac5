#!/bin/bash
# The bounce buffer from 64 KiB (the default since 32 KiB host to device ran behind): the
# CUDA tests, perf's adaptive section at 32 KiB-512 KiB twice, and two rounds of perf's
# copies at 16 KiB-1 MiB beside the peers.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-200}
O="$OUT/d"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf d.tgz d && rm -rf d; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; cat .gpu/packed 2>/dev/null; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 15 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-fast_paths cuda-driver cuda-streams; do run $t 60 $R .gpu/bin/$t --test-threads=4; done
run conformance-cuda 60 $R .gpu/bin/conformance-cuda --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | sort | uniq -c
mkdir -p $O/ad; run adaptive 60 .gpu/bin/perf --only adaptive --sizes 32K,64K,128K,256K --json "$O/ad/perf.json"
grep -E "^\| adaptive" $O/adaptive.log | cut -c1-120
S=16K,32K,64K,256K,1M
for k in 1 2; do mkdir -p $O/round$k
  run round$k-perf 40 .gpu/bin/perf --only copies --sizes $S --json "$O/round$k/perf.json"
  run round$k-peers 40 python3 scripts/bench_compare.py --ours "$O/round$k/perf.json" --skip-peer --copies-only --out "$O/round$k"
  grep -E "^\| (h2d|d2h)_pageable \|" $O/round$k/compare.md | cut -c1-110
done
