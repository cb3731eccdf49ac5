#!/bin/bash
# Device copies that share one event (a run of Stream.copy_device records one event per
# 16 copies or 32 MiB held): the CUDA tests and the Python tests on the GPU with the new
# wheel, then the old wheel (1520593) and the new one side by side on one machine: the
# D2D probe (copy + synchronize, and the issue cost of one copy) and the Python bench in
# three alternating runs each (the table from the medians).
set -u
T0=$SECONDS; TOTAL=${TOTAL:-540}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 15 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed 2>/dev/null; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
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
grep -h -E "test result|FAILED|panicked at" $O/*.log | grep -v cudabuf-parquet | sort | uniq -c
for v in new old; do w=.whl/cudabuf-*.whl; [ $v = old ] && w=.whl/old/cudabuf-*.whl
  rm -rf /tmp/site-$v; python3 -m pip install --no-index --no-deps --target /tmp/site-$v $w > "$O/pip-$v.log" 2>&1; echo "pip $v rc=$?"; done
run pytest 150 env PYTHONPATH=/tmp/site-new CUDABUF_REQUIRE_CUDA=1 python3 -m pytest python/tests -q -p no:cacheprovider -rs
tail -3 $O/pytest.log
P=results/curve-rounds-2026-12-06c/c2/d2d_probe.py
for v in old new; do mkdir -p $O/probe-$v; run probe-$v 60 env PYTHONPATH=/tmp/site-$v python3 $P $O/probe-$v; done
SZ="4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824"
for k in 1 2 3; do for v in old new; do
  run py-$v$k 100 env PYTHONPATH=/tmp/site-$v python3 scripts/gpu_python_checks.py bench --out "$O/py-$v$k" --sizes $SZ; done; done
for v in old new; do run pycurve-$v 30 python3 scripts/gpu_python_checks.py merge --out "$O/pycurve-$v" $O/py-${v}{1,2,3}/bench.json
  echo "== $v"; sed -n '/^| operation | min ratio/,$p' "$O/pycurve-$v/bench.md" | head -8; grep -E "^\| (1 MiB|4 KiB|64 KiB) \| D2D \|" "$O/pycurve-$v/bench.md"; done
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for v in ('old','new'):
    try:
        d=json.load(open(f'{O}/probe-{v}/d2d_probe.json'))
        r=d['4096']
        print(v, 'issue only: cudabuf', r['issue only: cudabuf copy_device'], 'cupy', r['issue only: cupy memcpyAsync'],
              '| copy+sync us at 4K/1M/4M/16M: cudabuf', [d[s]['cudabuf copy_device, cudabuf bufs, ctx.synchronize'] for s in d],
              'cupy', [d[s]['cupy copy_from_device, cupy bufs, deviceSynchronize'] for s in d])
    except Exception as e: print(v, e)
PY
