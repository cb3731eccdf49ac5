#!/bin/bash
# Adaptive staging's follow-up of cold staged copies, on the GPU (binaries of 207e127): the CUDA
# tests, the curve 4 KiB-1 GiB beside PyTorch and CuPy (Rust and Python), the switches
# (default / staged / direct / staged copies 1 ms apart) twice more at 512 KiB-4 MiB, and
# arrow_throughput (the first to_host on an empty pool).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-570}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 12 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; }
trap finish EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|NUMA node|Socket"; cat .gpu/packed 2>/dev/null; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 20 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-driver cuda-streams cuda-diag cuda-fast_paths; do
  run $t 60 $R .gpu/bin/$t --test-threads=4
done
run conformance-cuda 120 $R .gpu/bin/conformance-cuda --test-threads=4
run arrow-cuda 90 $R .gpu/bin/arrow-cuda --test-threads=4
ls .gpu/bin | grep -E "^cli|^cudabuf" > /dev/null && for t in $(ls .gpu/bin | grep -E "^cli-" ); do run $t 60 $R .gpu/bin/$t --test-threads=4; done
grep -h -E "test result|FAILED|panicked" $O/*.log | sort | uniq -c
run perf 240 .gpu/bin/perf --only copies,switches --sizes 4K,16K,64K,256K,1M,4M,16M,64M,256M,1G --json "$O/perf.json"
run compare 150 python3 scripts/bench_compare.py --ours "$O/perf.json" --skip-peer --copies-only --out "$O"
sed -n '/min ratio/,/^$/p' "$O/compare.md" | head -20
mkdir -p $O/again
run again 60 .gpu/bin/perf --only copies --sizes 512K,1M,2M,4M,16M,64M --json "$O/again/perf.json"
for k in 1 2; do mkdir -p $O/sw$k; run sw$k 40 .gpu/bin/perf --only switches --sizes 512K,1M,2M,4M --json "$O/sw$k/perf.json"; done
run arrow 90 .gpu/bin/arrow_throughput --bench --json "$O/arrow.json"
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
run pybench 150 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O" --sizes 4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824
sed -n '/^| operation | min ratio/,$p' "$O/bench.md" | head -12
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
d=json.load(open(O+'/perf.json'))
rows={}
for r in d['results']:
    if r['section']=='switches':
        dirn,name=r['op'].split('_',1); rows.setdefault(name,{})[(dirn,r['size'])]=r['value']
    if r['section']=='copies' and r['op'] in ('h2d_pinned','d2h_pinned','h2d_pageable','d2h_pageable','h2d_pageable_unstaged','d2h_pageable_unstaged') and r['size']>=512<<10 and r['size']<=64<<20:
        print(r['op'], r['size']>>20, 'MiB', round(r['value'],2))
    if r['section']=='dma' and ('after' in r['op'] or 'fill' in r['op'] or 'alone' in r['op']):
        print(r['op'], r['size']>>20, 'MiB', round(r['value'],2))
sizes=sorted({k[1] for v in rows.values() for k in v})
print('variant', *[f"{s>>20}M" for s in sizes])
for dirn in ('h2d','d2h'):
  for name,v in rows.items():
    print(dirn, name.ljust(14), *[f"{v.get((dirn,s),0):6.1f}" for s in sizes])
for sub in ('again','sw1','sw2'):
  try: d=json.load(open(f'{O}/{sub}/perf.json'))
  except Exception as e: print(sub, e); continue
  for r in d['results']:
    if r['section'] in ('copies','switches'):
        print(sub, r['section'], r['op'], r['size']>>10, 'KiB', round(r['value'],2))
t=json.load(open(O+'/staging_trace.json'))
for c in t:
    st=c['steps']; lanes=[s.get('lanes',0) for s in st]
    print(c['copy'], round(c['elapsed_us']), 'us; first4 claims', [round(s['claimed_us']) for s in st[:4]], 'lanes', lanes[:6])
PY

python3 - "$O" <<'PY'
import json,sys
try: d=json.load(open(sys.argv[1]+'/arrow.json'))
except Exception as e: print('arrow', e); sys.exit()
for r in d['results']:
    print('arrow', r['op'].ljust(36), round(r['gbps'],2), 'GB/s', r['median_s'], 's', 'ratio', r['ratio'] and round(r['ratio'],3), 'vs', r['baseline'])
PY
