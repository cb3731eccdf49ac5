#!/bin/bash
# Short check of the defaults with demoted fills at 64-256 MiB (binaries and wheel of the
# commit in .gpu/packed): perf's copies at 16 MiB-1 GiB, two rounds; the Python bench at
# 1-16 MiB and the per-copy times of the Python layer's pageable copies (pydiag.py).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-110}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
trap 'echo "done at $((SECONDS-T0)) s" >> $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; cat .gpu/packed; } > "$O/host.txt" 2>&1; cat $O/host.txt
run() { local name=$1 want=$2; shift 2; local l=$(( $(left) - 5 )); [ "$want" -lt "$l" ] && l=$want
  if [ "$l" -lt 8 ]; then echo "SKIPPED $name" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; echo "== $name rc=$? in $((SECONDS-t)) s" | tee -a $O/call.log; }
for k in 1 2; do run perf$k 40 .gpu/bin/perf --only copies --sizes 16M,64M,256M,1G --json "$O/perf$k.json"; done
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
run pydiag 15 env PYTHONPATH=$site python3 results/diag-2026-12-07c/d1/pydiag.py $O/pydiag.json
cut -c1-110 $O/pydiag.log
python3 - "$O" <<'PY'
import json,sys,glob,os
O=sys.argv[1]
for f in sorted(glob.glob(O+'/perf*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(os.path.basename(f), e); continue
    v={(r['op'],r['size']>>20):r['value'] for r in d['results'] if r['section']=='copies'}
    print(os.path.basename(f), ' '.join(f"{s}M h2d {v.get(('h2d_pageable',s),0):5.1f}/{v.get(('h2d_pinned',s),1):4.1f}={v.get(('h2d_pageable',s),0)/v.get(('h2d_pinned',s),1):.3f} d2h {v.get(('d2h_pageable',s),0)/v.get(('d2h_pinned',s),1):.3f}" for s in (16,64,256,1024)))
PY
