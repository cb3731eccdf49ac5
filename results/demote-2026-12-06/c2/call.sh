#!/bin/bash
# Steps that alternate streaming and plain stores (379931e): the staging tests on CUDA,
# the switches (ring_alt, default_alt beside the others, with the 64 MiB timelines), then
# perf's timed copies at 64 MiB and 256 MiB with the defaults, with
# CUDABUF_STAGING_PLAIN_FILLS=alternating and with CUDABUF_STAGING_NT_BELOW=max (streaming
# stores at every size), in turn, three rounds. Binaries of 379931e (.gpu/packed).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-240}
O="$OUT/e"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf e.tgz e && rm -rf e; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|L2|L3"; cat .gpu/packed 2>/dev/null; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 15 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
run cuda-fast_paths 60 env CUDABUF_REQUIRE_CUDA=1 .gpu/bin/cuda-fast_paths --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log
mkdir -p $O/sw
run switches 60 .gpu/bin/perf --only switches --json "$O/sw/perf.json"
S=64M,256M
for k in 1 2 3; do
  run copies-default$k 30 .gpu/bin/perf --only copies --sizes $S --json "$O/copies-default$k.json"
  run copies-alt$k 30 env CUDABUF_STAGING_PLAIN_FILLS=alternating .gpu/bin/perf --only copies --sizes $S --json "$O/copies-alt$k.json"
  run copies-nt$k 30 env CUDABUF_STAGING_NT_BELOW=max .gpu/bin/perf --only copies --sizes $S --json "$O/copies-nt$k.json"
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
    for name,v in rows.items():
        print('h2d', name.ljust(18), *[f"{v.get(('h2d',s),0):6.1f}" for s in sizes])
    t=json.load(open(O+'/sw/staging_trace.json'))
    for c in t:
        if c['host_to_device']:
            s=c['steps']; print(c['copy'], round(c['elapsed_us']), 'us; filled by', round(max(x['host_done_us'] for x in s)))
except Exception as e: print('switches summary:', e)
for f in sorted(glob.glob(O+'/copies-*.json')):
    try:
        r=json.load(open(f))['results']
        get=lambda op,s: next((x['value'] for x in r if x['op']==op and x.get('size')==s),None)
        out=[]
        for s in (64<<20,256<<20):
            p=get('h2d_pageable',s); q=get('h2d_pinned',s)
            out.append(f"{s>>20}M h2d pageable {p:.1f} pinned {q:.1f} ({p/q:.3f}x)")
        print(f.split('/')[-1], '; '.join(out))
    except Exception as e: print(f, e)
PY
