#!/bin/bash
# Diagnosis, binaries and wheel of 5c8a603 (the library of main): (1) the Python layer's
# pageable copies at 1-16 MiB, per-copy times in the bench's loop, with the defaults,
# adaptivity off (every copy from 512 KiB staged), staging off, and the defaults after
# PyTorch and CuPy ran in the same process; the bench itself at those sizes; perf's
# copies there as the Rust control. (2) Pageable 64 MiB host to device per staging
# configuration (H2D threads 8/12/16 x plain, demoted, written-back, streaming fills),
# two rounds interleaved.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-300}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
trap 'echo "done at $((SECONDS-T0)) s" >> $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; uptime; cat .gpu/packed; } > "$O/host.txt" 2>&1; cat $O/host.txt
run() { local name=$1 want=$2; shift 2; local l=$(( $(left) - 10 )); [ "$want" -lt "$l" ] && l=$want
  if [ "$l" -lt 8 ]; then echo "SKIPPED $name" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; echo "== $name rc=$? in $((SECONDS-t)) s" | tee -a $O/call.log; }
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
D=results/diag-2026-12-07c/d1/pydiag.py
for k in 1 2; do
  run py-default$k 30 env PYTHONPATH=$site python3 $D $O/py-default$k.json
  run py-allstaged$k 30 env PYTHONPATH=$site CUDABUF_STAGING_ADAPTIVE=0 python3 $D $O/py-allstaged$k.json
  run py-direct$k 30 env PYTHONPATH=$site CUDABUF_STAGING=0 python3 $D $O/py-direct$k.json
  run py-peers$k 40 env PYTHONPATH=$site python3 $D $O/py-peers$k.json --peers
done
grep -h "M h2d\|M d2h" $O/py-*1.log | cut -c1-120
run pybench 60 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O/pybench" --sizes 1048576 4194304 16777216
grep pageable $O/pybench/bench.md
run rust-small 40 .gpu/bin/perf --only copies --sizes 1M,4M,16M --json "$O/rust-small.json"
grep -E "pageable" $O/rust-small.log | grep -v "^|" | cut -c1-100
for k in 1 2; do
  for cfg in t8-plain t12-plain t16-plain t12-demote t12-writeback t16-writeback t12-nt t16-nt; do
    t=${cfg%-*}; t=${t#t}; f=${cfg#*-}
    e="CUDABUF_STAGING_THREADS=$t"
    case $f in demote|writeback) e="$e CUDABUF_STAGING_PLAIN_FILLS=$f";; nt) e="$e CUDABUF_STAGING_NT_BELOW=max";; esac
    run h2d64-$cfg-$k 25 env $e .gpu/bin/perf --only copies --sizes 64M --json "$O/h2d64-$cfg-$k.json"
  done
done
python3 - "$O" <<'PY'
import json,sys,glob,os
O=sys.argv[1]
for f in sorted(glob.glob(O+'/h2d64-*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(os.path.basename(f), e); continue
    v={r['op']:r['value'] for r in d['results'] if r['section']=='copies'}
    p=v.get('h2d_pageable',0); q=v.get('h2d_pinned',1)
    print(os.path.basename(f)[:-5].ljust(24), f"h2d {p:5.1f} / pinned {q:5.1f} = {p/q:.3f}; d2h {v.get('d2h_pageable',0):5.1f} / {v.get('d2h_pinned',1):5.1f}")
PY
