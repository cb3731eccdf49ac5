#!/bin/bash
# The curve in three rounds (perf's copies, then the peers, in turn; the table from the
# medians), the CUDA tests, the switches with their timelines (staged_t12 traced too),
# arrow_throughput (the first to_host) and the Python layer's bench. Binaries of 207e127 (library code = main bf3920b), perf of 1d004d4.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-480}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 15 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
pack_out() { cd "$OUT" && tar czf r.tgz r && rm -rf r; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cp /tmp/call.out $O/ 2>/dev/null; pack_out; }
trap finish EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|NUMA node|Socket"; cat .gpu/packed 2>/dev/null; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 20 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-driver cuda-streams cuda-diag cuda-fast_paths; do run $t 60 $R .gpu/bin/$t --test-threads=4; done
run conformance-cuda 120 $R .gpu/bin/conformance-cuda --test-threads=4
run arrow-cuda 90 $R .gpu/bin/arrow-cuda --test-threads=4
run cli-cli 60 $R .gpu/bin/cli-cli --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | sort | uniq -c
S=4K,16K,64K,256K,1M,4M,16M,64M,256M,1G
for k in 1 2 3; do mkdir -p $O/round$k
  run round$k-perf 90 .gpu/bin/perf --only copies --sizes $S --json "$O/round$k/perf.json"
  run round$k-peers 90 python3 scripts/bench_compare.py --ours "$O/round$k/perf.json" --skip-peer --copies-only --out "$O/round$k"
  sed -n '/min ratio/,/^$/p' "$O/round$k/compare.md" | cut -c1-60
done
run compare 60 python3 scripts/bench_compare.py --compare-only --skip-peer --sizes $S --ours $O/round{1,2,3}/perf.json --peers $O/round{1,2,3}/compare.json --out "$O"
sed -n '/min ratio/,/^$/p' "$O/compare.md"
grep -E "pageable \| 64 MiB" "$O/compare.md"
mkdir -p $O/sw
run switches 120 .gpu/bin/perf --only switches --json "$O/sw/perf.json"
run arrow 90 .gpu/bin/arrow_throughput --bench --json "$O/arrow.json"
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
run pybench 150 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O" --sizes 4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824
sed -n '/^| operation | min ratio/,$p' "$O/bench.md" | head -12
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
try:
    d=json.load(open(O+'/sw/perf.json'))
    rows={}
    for r in d['results']:
        if r['section']=='switches':
            dirn,name=r['op'].split('_',1); rows.setdefault(name,{})[(dirn,r['size'])]=r['value']
    sizes=sorted({k[1] for v in rows.values() for k in v})
    print('variant', *[f"{s>>20}M" for s in sizes])
    for dirn in ('h2d','d2h'):
        for name,v in rows.items():
            print(dirn, name.ljust(18), *[f"{v.get((dirn,s),0):6.1f}" for s in sizes])
    t=json.load(open(O+'/sw/staging_trace.json'))
    for c in t:
        st=c['steps']
        print(c['copy'], round(c['elapsed_us']), 'us; claims', [round(s['claimed_us']) for s in st[:8]], 'lanes', [s.get('lanes',0) for s in st[:8]], 'last host_done', round(max(s['host_done_us'] for s in st)))
except Exception as e: print('switches summary:', e)
try:
    for r in json.load(open(O+'/arrow.json'))['results']:
        print('arrow', r['op'].ljust(36), round(r['gbps'],2), 'GB/s ratio', r['ratio'] and round(r['ratio'],3), 'vs', r['baseline'])
except Exception as e: print('arrow summary:', e)
PY
