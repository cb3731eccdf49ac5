#!/bin/bash
# Plain fills followed by cldemote / clwb (8601f32): the CPU's cache-line flags, the CUDA
# tests, perf's dma section at 4-256 MiB (the DMA right after plain, streaming, demoted and
# written-back writes), the switches (ring_demote, ring_clwb, default_demote beside the
# others, with their 64 MiB timelines), then perf's timed copies at 16 MiB-1 GiB with the
# defaults and with CUDABUF_STAGING_PLAIN_FILLS=demote (and =writeback), in turn, three
# rounds. Binaries of 8601f32 (.gpu/packed in host.txt).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-330}
O="$OUT/d"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf d.tgz d && rm -rf d; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|NUMA node|Socket|L2|L3"; echo "flags: $(grep -o -w -E 'cldemote|clwb|clflushopt|movdiri' /proc/cpuinfo | sort | uniq -c | tr '\n' ' ')"; cat .gpu/packed 2>/dev/null; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 15 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-fast_paths cuda-streams; do run $t 60 $R .gpu/bin/$t --test-threads=4; done
run conformance-cuda 90 $R .gpu/bin/conformance-cuda --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | sort | uniq -c
run dma 90 .gpu/bin/perf --only dma --sizes 4M,16M,64M,256M --json "$O/dma.json"
grep -E "after|fill|cldemote|dma_alone" $O/dma.log | grep -v '^|' | cut -c1-120
mkdir -p $O/sw
run switches 90 .gpu/bin/perf --only switches --json "$O/sw/perf.json"
S=16M,64M,256M,1G
for k in 1 2 3; do
  run copies-default$k 40 .gpu/bin/perf --only copies --sizes $S --json "$O/copies-default$k.json"
  run copies-demote$k 40 env CUDABUF_STAGING_PLAIN_FILLS=demote .gpu/bin/perf --only copies --sizes $S --json "$O/copies-demote$k.json"
  run copies-clwb$k 40 env CUDABUF_STAGING_PLAIN_FILLS=writeback .gpu/bin/perf --only copies --sizes $S --json "$O/copies-clwb$k.json"
done
python3 - "$O" <<'PY'
import json,sys,glob
O=sys.argv[1]
try:
    d=json.load(open(O+'/sw/perf.json'))
    rows={}
    for r in d['results']:
        if r['section']=='switches' and r.get('size'):
            dirn,name=r['op'].split('_',1); rows.setdefault(name,{})[(dirn,r['size'])]=r['value']
    sizes=sorted({k[1] for v in rows.values() for k in v})
    print('switches', *[f"{s>>20}M" for s in sizes])
    for dirn in ('h2d','d2h'):
        for name,v in rows.items():
            print(dirn, name.ljust(18), *[f"{v.get((dirn,s),0):6.1f}" for s in sizes])
except Exception as e: print('switches summary:', e)
for f in sorted(glob.glob(O+'/copies-*.json')):
    try:
        r=json.load(open(f))['results']
        get=lambda op,s: next((x['value'] for x in r if x['op']==op and x.get('size')==s),None)
        out=[]
        for s in (16<<20,64<<20,256<<20,1<<30):
            p=get('h2d_pageable',s); q=get('h2d_pinned',s)
            out.append(f"{s>>20}M h2d pageable {p} pinned {q} ({(p/q if p and q else 0):.3f}x)")
        print(f.split('/')[-1], '; '.join(out))
    except Exception as e: print(f, e)
PY
