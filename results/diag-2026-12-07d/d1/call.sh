#!/bin/bash
# Adaptive staging's choices (binaries of the commit in .gpu/packed, suite perf): perf's
# adaptive section twice (every copy's time and path, 512 KiB-32 MiB, both ways, each of
# staged / direct / adaptive twice in turn), then perf's copies at 256 KiB-4 MiB beside the
# peers in three rounds (its notes give the chooser's counts and estimates).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-240}
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
for k in 1 2; do mkdir -p $O/ad$k; run ad$k 90 .gpu/bin/perf --only adaptive --json "$O/ad$k/perf.json"; grep -E "^\| adaptive" $O/ad$k.log | cut -c1-120; done
S=256K,1M,2M,4M
for k in 1 2 3; do mkdir -p $O/cp$k
  run cp$k-perf 40 .gpu/bin/perf --only copies --sizes $S --json "$O/cp$k/perf.json"
  run cp$k-peers 60 python3 scripts/bench_compare.py --ours "$O/cp$k/perf.json" --skip-peer --copies-only --sizes $S --out "$O/cp$k"
  grep -E "pageable|d2d" $O/cp$k/compare.md | cut -c1-130
done
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for k in (1,2,3):
    try:
        for r in json.load(open(f'{O}/cp{k}/perf.json'))['results']:
            if r['op'] in ('h2d_pageable','d2h_pageable'): print(k, r['op'], r['size'], round(r['value'],2), r['note'])
    except Exception as e: print('cp', k, e)
PY
