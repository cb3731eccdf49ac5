#!/bin/bash
# Small pageable copies (32 KiB-1 MiB), both ways: the driver's own copy against a pinned
# buffer's DMA alone, the copy through that buffer by hand (plain and streaming-store
# fills), and the staging engine lowered to 32 KiB (perf's adaptive section, twice each).
set -u
O="$OUT/d"; mkdir -p "$O"
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; cat .gpu/packed 2>/dev/null; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
export CUDABUF_BACKEND=cuda
S=32K,64K,128K,256K,512K,1M
for k in 1 2; do
  mkdir -p $O/a$k $O/e$k
  timeout 60 .gpu/bin/perf --only adaptive --sizes $S --json "$O/a$k/perf.json" > $O/a$k.log 2>&1
  timeout 60 env CUDABUF_STAGING_MIN=32K .gpu/bin/perf --only adaptive --sizes 32K,64K,128K,256K --json "$O/e$k/perf.json" > $O/e$k.log 2>&1
done
grep -h -E "^\| adaptive" $O/a1.log | cut -c1-100
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
rows={}
for tag in ('a1','a2','e1','e2'):
    try: res=json.load(open(f'{O}/{tag}/perf.json'))['results']
    except Exception as e: print(tag, e); continue
    for r in res:
        if r['section']!='adaptive': continue
        key=(r['op'], r['size'], 'engine32K' if tag[0]=='e' else '')
        rows.setdefault(key, []).append(round(r['value'],2))
for (op,size,x),v in sorted(rows.items(), key=lambda kv:(kv[0][0][:3], kv[0][1], kv[0][0])):
    print(f"{op:20s} {size>>10:5d} KiB {x:9s} {v}")
PY
