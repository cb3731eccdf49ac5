#!/bin/bash
# Call A: the ring on CUDA (tests with the ring on), the switches with the ring, the DMA probe.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-570}
O=/tmp/r; rm -rf $O; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 12 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; tar czf "$OUT/r.tgz" -C /tmp r; }
trap finish EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed 2>/dev/null; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 20 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
run cuda-unit 40 $R .gpu/bin/cuda-unit
run cuda-fast_paths 90 $R .gpu/bin/cuda-fast_paths --test-threads=4
grep -E "test result|FAILED|panicked" "$O/cuda-fast_paths.log" | head
run conformance-ring 120 $R CUDABUF_STAGING_RING=8 .gpu/bin/conformance-cuda --test-threads=4
grep -E "test result|FAILED|panicked" "$O/conformance-ring.log" | head
run arrow-ring 90 $R CUDABUF_STAGING_RING=8 .gpu/bin/arrow-cuda --test-threads=4
grep -E "test result|FAILED" "$O/arrow-ring.log" | head
run switches 200 .gpu/bin/perf --only switches --json "$O/switches.json"
grep -E "switches|timeline" "$O/switches.log" | grep -E "64 MiB|64MiB" | head -60
run dma 60 .gpu/bin/perf --only dma --sizes 16M,64M,256M --json "$O/dma.json"
grep -E "dma" "$O/dma.log" | tail -40
run copies-ring 90 env CUDABUF_STAGING_RING=8 .gpu/bin/perf --only copies --sizes 1M,4M,16M,64M,256M --json "$O/copies_ring.json"
run copies-lanes 90 .gpu/bin/perf --only copies --sizes 1M,4M,16M,64M,256M --json "$O/copies_lanes.json"
for f in copies_ring copies_lanes; do python3 - "$O/$f.json" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
recs=d['results']
for r in recs:
    if r.get('op') in ('h2d_pinned','d2h_pinned','h2d_pageable','d2h_pageable') or 'overlap_bound' in r.get('op',''):
        print(sys.argv[1].split('/')[-1], r['op'], r.get('size'), round(r['value'],2))
PY
done
