#!/bin/bash
# Pageable copies at 1 MiB-1 GiB per staging configuration, binaries of 5c8a603:
# the defaults (8 H2D threads, plain fills from 64 MiB), 12 H2D threads, 12 with demoted
# fills (cldemote after plain stores, from 64 MiB), 8 with demoted fills; two rounds interleaved.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-300}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda
trap 'echo "done at $((SECONDS-T0)) s" >> $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uptime; cat .gpu/packed; } > "$O/host.txt" 2>&1
for k in 1 2; do
  for cfg in t8-plain t12-demote t12-plain t8-demote; do
    [ $(( TOTAL - (SECONDS - T0) )) -lt 45 ] && { echo "out of time at $k $cfg" | tee -a $O/call.log; break 2; }
    t=${cfg%-*}; t=${t#t}; f=${cfg#*-}
    s=$SECONDS
    env CUDABUF_STAGING_THREADS=$t CUDABUF_STAGING_D2H_THREADS=12 CUDABUF_STAGING_PLAIN_FILLS=$f timeout 40 .gpu/bin/perf --only copies --sizes 1M,4M,16M,64M,256M,1G --json "$O/$cfg-$k.json" > "$O/$cfg-$k.log" 2>&1
    echo "== $cfg-$k rc=$? in $((SECONDS-s)) s" | tee -a $O/call.log
  done
done
python3 - "$O" <<'PY'
import json,sys,glob,os
O=sys.argv[1]
for f in sorted(glob.glob(O+'/*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(os.path.basename(f), e); continue
    v={(r['op'],r['size']>>20):r['value'] for r in d['results'] if r['section']=='copies'}
    print(os.path.basename(f)[:-5].ljust(14), ' '.join(f"{s}M {v.get(('h2d_pageable',s),0):5.1f}/{v.get(('h2d_pinned',s),1):4.1f}={v.get(('h2d_pageable',s),0)/v.get(('h2d_pinned',s),1):.2f}" for s in (1,4,16,64,256,1024)))
PY
