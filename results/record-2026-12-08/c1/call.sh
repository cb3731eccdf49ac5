#!/bin/bash
# The record of main with copies warmed for 10 ms before they are timed (binaries and wheel of
# the commit in .gpu/packed): the CUDA tests, perf's adaptive section (32 KiB-16 MiB), then
# perf's copies at 1, 4 and 16 MiB three times with the warm-up off and on in turn (whether
# the D2D gap at 4 MiB is the state left by the figure before it), perf's dma section, the
# curve in five rounds (perf's copies, then the peers, in turn; the table from the medians),
# arrow_throughput six times (the first to_host against its control), the Python bench in
# three runs (the table from the medians), the Python layer's per-copy times, the D2D probe,
# perf's issue section.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-500}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 15 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cp /tmp/call.out $O/ 2>/dev/null; cd "$OUT" && tar czf r.tgz r && rm -rf r; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; cat .gpu/packed 2>/dev/null; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
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
mkdir -p $O/ad
run adaptive 120 .gpu/bin/perf --only adaptive --sizes 32K,64K,128K,256K,512K,1M,4M,16M --json "$O/ad/perf.json"
grep -E "^\| adaptive" $O/adaptive.log | cut -c1-120
[ -f $O/ad/adaptive_raw.json ] && python3 results/diag-2026-12-07d/d1/replay.py $O/ad/adaptive_raw.json > $O/replay.log 2>&1; cat $O/replay.log
for k in 1 2 3; do for w in 0 10; do mkdir -p $O/warm$w-$k
  run warm$w-$k 40 env CUDABUF_PERF_COPY_WARM_MS=$w .gpu/bin/perf --only copies --sizes 1M,4M,16M --json "$O/warm$w-$k/perf.json"
done; done
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for w in (0,10):
    for k in (1,2,3):
        try:
            r={(x['op'],x['size']>>20):x['value'] for x in json.load(open(f'{O}/warm{w}-{k}/perf.json'))['results']}
            print(f'warm {w:2} ms run {k}: ' + '  '.join(f"{s} MiB d2d {r[('d2d',s)]:.0f} raw {r[('d2d_raw_sync',s)]:.0f}" for s in (1,4,16)))
        except Exception as e: print('warm', w, k, e)
PY
run dma 60 .gpu/bin/perf --only dma --sizes 16M,64M,256M --json "$O/dma.json"
grep -E "beside_mt(8|12)|memcpy_mt(8|12)|dma_alone|fill" $O/dma.log | grep -v "^|" | cut -c1-110
grep -h -E "test result|FAILED|panicked at" $O/*.log | grep -v cudabuf-parquet | sort | uniq -c
S=4K,16K,64K,256K,1M,4M,16M,64M,256M,1G
for k in 1 2 3 4 5; do mkdir -p $O/round$k
  run round$k-perf 90 .gpu/bin/perf --only copies --sizes $S --json "$O/round$k/perf.json"
  run round$k-peers 90 python3 scripts/bench_compare.py --ours "$O/round$k/perf.json" --skip-peer --copies-only --out "$O/round$k"
done
ours=(); peers=(); for k in 1 2 3 4 5; do [ -f $O/round$k/perf.json ] && [ -f $O/round$k/compare.json ] && { ours+=($O/round$k/perf.json); peers+=($O/round$k/compare.json); }; done
run compare 60 python3 scripts/bench_compare.py --compare-only --skip-peer --sizes $S --ours "${ours[@]}" --peers "${peers[@]}" --out "$O"
sed -n '/min ratio/,/^$/p' "$O/compare.md"
grep -E "pageable \| 64 MiB" "$O/compare.md"
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for k in (1,2,3,4,5):
    try:
        for r in json.load(open(f'{O}/round{k}/perf.json'))['results']:
            if r['op'] in ('h2d_pageable','d2h_pageable') and (1<<19) <= r['size'] < (64<<20): print(k, r['op'], r['size']>>10, 'KiB', round(r['value'],2), r['note'])
    except Exception as e: print('round', k, e)
PY
for k in 1 2 3 4 5 6; do run arrow$k 30 .gpu/bin/arrow_throughput --bench --json "$O/arrow$k.json"; done
grep -H 'alternated pairs' $O/arrow*.log
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
SZ="4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824"
for k in 1 2 3; do run py$k 100 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O/py$k" --sizes $SZ; done
run pycurve 30 python3 scripts/gpu_python_checks.py merge --out "$O/pycurve" $(ls $O/py*/bench.json)
sed -n '/^| operation | min ratio/,$p' "$O/pycurve/bench.md" | head -8
run pydiag 30 env PYTHONPATH=$site python3 results/diag-2026-12-07c/d1/pydiag.py $O/pydiag.json
cut -c1-110 $O/pydiag.log
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for k in range(1,7):
    try:
        r={x['op']:x['gbps'] for x in json.load(open(f'{O}/arrow{k}.json'))['results']}
        a=r['to_host, first call (empty pool)']; b=r['to_host, pool off (new Vec)']; c=r['copy_to_host (new Vec)']
        a2=r['to_host, first call, call alone']; b2=r['to_host, pool off, call alone']; ctl=r['to_host, pool off, after pin+free']
        print(f'arrow {k}: first {a:.2f} pool off {b:.2f} ({a/b:.3f}x) control {ctl:.2f} ({a/ctl:.3f}x) new Vec {c:.2f}; call alone: first {a2:.2f} pool off {b2:.2f} -> {a2/b2:.3f}x')
    except Exception as e: print('arrow', k, e)
PY
mkdir -p $O/probe; run probe 60 env PYTHONPATH=$site python3 results/curve-rounds-2026-12-06c/c2/d2d_probe.py $O/probe
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['4096']; print('issue only us: cudabuf', r['issue only: cudabuf copy_device'], 'cupy', r['issue only: cupy memcpyAsync'])" $O/probe/d2d_probe.json
run issue 40 .gpu/bin/perf --only issue --json "$O/issue.json"
grep '^| issue' $O/issue.log
