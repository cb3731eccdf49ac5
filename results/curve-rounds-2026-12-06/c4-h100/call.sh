#!/bin/bash
# The Python layer's D2D: where the time goes (d2d_probe.py), then the Python bench with
# time-budgeted samples. Wheel of 207e127.
set -u
O="$OUT/r"; mkdir -p "$O"
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/host.txt
PYTHONPATH=$site timeout 150 python3 .gpu/d2d_probe.py "$O" > "$O/probe.log" 2>&1; echo "probe rc=$?"
cat $O/probe.log | tail -80
PYTHONPATH=$site timeout 200 python3 scripts/gpu_python_checks.py bench --out "$O" --sizes 4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824 > "$O/pybench.log" 2>&1; echo "pybench rc=$?"
sed -n '/^| operation | min ratio/,$p' "$O/bench.md" | head -12
grep -E "D2D \|" "$O/bench.md"
cd "$OUT" && tar czf r.tgz r && rm -rf r
