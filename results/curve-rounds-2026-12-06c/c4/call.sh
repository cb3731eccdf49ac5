#!/bin/bash
# Main after the review of the shared completion events (the uncovered count restarted by
# a synchronization, a failed record's wait lets go): the CUDA tests, pytest on the GPU,
# the D2D probe and one run of the Python bench, with the binaries and wheel of 2da032b.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-260}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cd "$OUT" && tar czf r.tgz r && rm -rf r; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed 2>/dev/null; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 15 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-driver cuda-streams cuda-diag cuda-fast_paths; do run $t 60 $R .gpu/bin/$t --test-threads=4; done
run conformance-cuda 120 $R .gpu/bin/conformance-cuda --test-threads=4
run arrow-cuda 90 $R .gpu/bin/arrow-cuda --test-threads=4
run cli-cli 60 $R .gpu/bin/cli-cli --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | grep -v cudabuf-parquet | sort | uniq -c
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1; echo "pip rc=$?"
run pytest 120 env PYTHONPATH=$site CUDABUF_REQUIRE_CUDA=1 python3 -m pytest python/tests -q -p no:cacheprovider -rs
tail -2 $O/pytest.log
mkdir -p $O/probe; run probe 40 env PYTHONPATH=$site python3 results/curve-rounds-2026-12-06c/c2/d2d_probe.py $O/probe
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['4096']; print('issue only us: cudabuf', r['issue only: cudabuf copy_device'], 'cupy', r['issue only: cupy memcpyAsync'])" $O/probe/d2d_probe.json
SZ="4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824"
run py1 80 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O/py1" --sizes $SZ
sed -n '/^| operation | min ratio/,$p' "$O/py1/bench.md" | head -8
