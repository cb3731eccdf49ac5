#!/bin/bash
# Call C: ramped ring steps, H2D step sizes, DMA step costs.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-400}
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
run cuda-fast_paths 60 $R .gpu/bin/cuda-fast_paths --test-threads=4
grep -h -E "test result|FAILED" $O/cuda-fast_paths.log
run perf 200 .gpu/bin/perf --only copies,switches,dma --sizes 1M,4M,16M,64M,256M --json "$O/perf.json"
python3 - "$O/perf.json" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
rows={}
for r in d['results']:
    if r['section']=='switches':
        dirn,name=r['op'].split('_',1); rows.setdefault(name,{})[(dirn,r['size'])]=r['value']
    if r['section']=='copies' and r['op'] in ('h2d_pinned','d2h_pinned','h2d_pageable','d2h_pageable'):
        print(r['op'], r['size']>>20, 'MiB', round(r['value'],2))
    if r['section']=='dma' and ('steps' in r['op'] or 'alone' in r['op'] or 'after' in r['op']):
        print(r['op'], r['size']>>20, 'MiB', round(r['value'],2))
sizes=sorted({k[1] for v in rows.values() for k in v})
print('variant', *[f"{s>>20}M" for s in sizes])
for dirn in ('h2d','d2h'):
  for name,v in rows.items():
    print(dirn, name.ljust(14), *[f"{v.get((dirn,s),0):6.1f}" for s in sizes])
PY
