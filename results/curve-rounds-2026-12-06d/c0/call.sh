#!/bin/bash
# Where the issue time of a device copy goes (perf's `issue` section, .gpu/extra/perf: main
# plus that section), the Python D2D probe (wheel of main), then files to the device, warm
# (the first call of a context beside its bound), and arrow_throughput three times (the
# first to_host against its control). Binaries and wheel of main (.gpu/packed).
set -u
O="$OUT/r"; mkdir -p "$O"; T0=$SECONDS
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1 PYTHONUNBUFFERED=1
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed; python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'; df -h /tmp | tail -1; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
for k in 1 2 3; do timeout 40 .gpu/extra/perf --only issue --json "$O/issue$k.json" > "$O/issue$k.log" 2>&1; echo "issue$k rc=$?"; done
grep '^| issue' $O/issue*.log
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
mkdir -p $O/probe; timeout 80 env PYTHONPATH=$site python3 results/curve-rounds-2026-12-06c/c2/d2d_probe.py $O/probe > $O/probe.log 2>&1; echo "probe rc=$?"
D=/tmp/cudabuf-files; mkdir -p $D
timeout 200 .gpu/extra/files --dir $D --sizes 64M,256M,1G --reps 5 --arrow-sizes "" --json "$O/files.json" > "$O/files.log" 2>&1
echo "files rc=$? at $((SECONDS-T0)) s"; grep '^|' "$O/files.log"; rm -rf $D
for k in 1 2 3; do timeout 40 .gpu/bin/arrow_throughput --bench --json "$O/arrow$k.json" > "$O/arrow$k.log" 2>&1; echo "arrow$k rc=$?"; done
echo "done at $((SECONDS-T0)) s"
cd "$OUT" && tar czf r.tgz r && rm -rf r
