#!/bin/bash
# Pageable 64 MiB host-to-device: does a throttled fill (fewer H2D threads, a smaller ring)
# let the DMA run nearer the pinned rate? perf's copies at 64 and 256 MiB per staging
# configuration, two rounds interleaved. Binaries of 207e127 (library = main bf3920b).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-420}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda
trap 'cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/host.txt; cat $O/host.txt
for k in 1 2; do
  for cfg in t8r16 t4r16 t5r16 t6r16 t6r8 t8r8 t8r32 t12r16; do
    [ $(( TOTAL - (SECONDS - T0) )) -lt 40 ] && { echo "out of time at $k $cfg"; break 2; }
    t=${cfg#t}; t=${t%r*}; r=${cfg#*r}
    s=$SECONDS
    CUDABUF_STAGING_THREADS=$t CUDABUF_STAGING_D2H_THREADS=12 CUDABUF_STAGING_RING=$r timeout 60 \
      .gpu/bin/perf --only copies --sizes 64M,256M --json "$O/$cfg-$k.json" > "$O/$cfg-$k.log" 2>&1
    echo "$k $cfg rc=$? $((SECONDS-s)) s"
  done
done
python3 - "$O" <<'PY'
import json,sys,glob,os
O=sys.argv[1]
for f in sorted(glob.glob(O+'/*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(f, e); continue
    v={(r['op'],r['size']>>20):r['value'] for r in d['results'] if r['section']=='copies'}
    row=[]
    for s in (64,256):
        p=v.get(('h2d_pageable',s),0); q=v.get(('h2d_pinned',s),1)
        ob=max([v.get((f'h2d_overlap_bound_mt{n}',s),0) for n in (4,5,6,8,12,16)])
        row.append(f"{s}M h2d {p:5.1f} /pinned {q:5.1f} = {p/q:.3f} ob {ob:5.1f} | d2h {v.get(('d2h_pageable',s),0):5.1f}/{v.get(('d2h_pinned',s),1):5.1f}")
    print(os.path.basename(f).ljust(14), ' || '.join(row))
PY
