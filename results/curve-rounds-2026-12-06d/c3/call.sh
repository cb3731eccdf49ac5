#!/bin/bash
# The spaced-out looks for completed operations (binaries and wheel of .gpu/packed): the
# CUDA tests, perf's issue section three times beside that of 6852bf3 (a look before
# every operation), the D2D probe, the Python bench three
# times (merged), pytest on the GPU, one round of the Rust curve with its peers.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-540}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 15 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 20 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-driver cuda-streams cuda-diag cuda-fast_paths; do run $t 60 $R .gpu/bin/$t --test-threads=4; done
run conformance-cuda 120 $R .gpu/bin/conformance-cuda --test-threads=4
run arrow-cuda 90 $R .gpu/bin/arrow-cuda --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | grep -v cudabuf-parquet | sort | uniq -c
# In turn: before (.gpu/extra/perf-old: perf of 6852bf3, a look before every operation)
# and after.
for k in 1 2 3; do
  run issue-old$k 40 .gpu/extra/perf-old --only issue --json "$O/issue-old$k.json"
  run issue$k 40 .gpu/bin/perf --only issue --json "$O/issue$k.json"
done
grep -H '^| issue | \(issue\|loop\)_cudabuf' $O/issue*.log
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
mkdir -p $O/probe; run probe 60 env PYTHONPATH=$site python3 results/curve-rounds-2026-12-06c/c2/d2d_probe.py $O/probe
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['4096']; print('issue only us: cudabuf', r['issue only: cudabuf copy_device'], 'cupy', r['issue only: cupy memcpyAsync'])" $O/probe/d2d_probe.json
SZ="4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824"
for k in 1 2 3; do run py$k 100 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O/py$k" --sizes $SZ; done
run pycurve 30 python3 scripts/gpu_python_checks.py merge --out "$O/pycurve" $O/py{1,2,3}/bench.json
sed -n '/^| operation | min ratio/,$p' "$O/pycurve/bench.md" | head -8
run pytest 150 env PYTHONPATH=$site CUDABUF_REQUIRE_CUDA=1 python3 -m pytest python/tests -q -p no:cacheprovider -rs
tail -3 $O/pytest.log
S=4K,16K,64K,256K,1M,4M,16M,64M,256M,1G
mkdir -p $O/round1
run round1-perf 90 .gpu/bin/perf --only copies --sizes $S --json "$O/round1/perf.json"
run round1-peers 90 python3 scripts/bench_compare.py --ours "$O/round1/perf.json" --skip-peer --copies-only --out "$O/round1"
sed -n '/min ratio/,/^$/p' "$O/round1/compare.md"
