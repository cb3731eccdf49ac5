#!/bin/bash
# The form of the looks in cudabuf now (binaries and wheel of .gpu/packed): the CUDA
# stream and conformance tests, arrow_throughput with the alternated pairs six times
# (.gpu/extra/arrow_throughput, built at the packed commit by `cargo bench --workspace
# --features cuda,cudabuf/arrow --no-run --bench arrow_throughput`), perf's issue section
# three times, the D2D probe, pytest on the GPU, the Python bench three times (merged).
set -u
O="$OUT/r"; mkdir -p "$O"; T0=$SECONDS
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
R="env CUDABUF_REQUIRE_CUDA=1"
for t in cuda-unit cuda-streams conformance-cuda arrow-cuda; do timeout 90 $R .gpu/bin/$t --test-threads=4 > $O/$t.log 2>&1; echo "$t rc=$?: $(grep 'test result' $O/$t.log)"; done
for k in 1 2 3 4 5 6; do
  timeout 40 .gpu/extra/arrow_throughput --bench --json "$O/arrow$k.json" > "$O/arrow$k.log" 2>&1
  echo "arrow$k rc=$?: $(grep 'alternated pairs' "$O/arrow$k.log")"
done
for k in 1 2 3; do timeout 40 .gpu/bin/perf --only issue --json "$O/issue$k.json" > "$O/issue$k.log" 2>&1; echo "issue$k rc=$?"; done
grep -H '^| issue | issue_cudabuf\|^| issue | issue_raw_copy |' $O/issue*.log
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
mkdir -p $O/probe; timeout 60 env PYTHONPATH=$site python3 results/curve-rounds-2026-12-06c/c2/d2d_probe.py $O/probe > $O/probe.log 2>&1; echo "probe rc=$?"
timeout 120 env PYTHONPATH=$site CUDABUF_REQUIRE_CUDA=1 python3 -m pytest python/tests -q -p no:cacheprovider -rs > $O/pytest.log 2>&1; echo "pytest rc=$?"; tail -1 $O/pytest.log
SZ="4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824"
for k in 1 2 3; do timeout 100 env PYTHONPATH=$site python3 scripts/gpu_python_checks.py bench --out "$O/py$k" --sizes $SZ > $O/py$k.log 2>&1; echo "py$k rc=$?"; done
python3 scripts/gpu_python_checks.py merge --out "$O/pycurve" $O/py{1,2,3}/bench.json > $O/pycurve.log 2>&1
sed -n '/^| operation | min ratio/,$p' "$O/pycurve/bench.md" | head -8
echo "done at $((SECONDS-T0)) s"
cd "$OUT" && tar czf r.tgz r && rm -rf r
