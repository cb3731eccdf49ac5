#!/bin/bash
# As run the second time: the command line first ran `tar xJf bin.tar.xz bin/arrow_throughput` in .gpu
# and this sed on the script: the py loop emptied (`for k in; do`), so only the arrow runs ran.
# The Python layer's bench three more times and arrow_throughput five times (the first
# to_host), on the machine of c4. Binaries and wheel of 207e127 (library = main bf3920b).
set -u
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda PYTHONUNBUFFERED=1
trap 'cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/host.txt; cat $O/host.txt
site=/tmp/site; rm -rf $site; python3 -m pip install --no-index --no-deps --target $site .whl/cudabuf-*.whl > "$O/pip.log" 2>&1
for k in 1 2 3 4 5; do timeout 30 .gpu/bin/arrow_throughput --bench --json "$O/arrow$k.json" > "$O/arrow$k.log" 2>&1; echo "arrow $k rc=$?"; done
for k in; do mkdir -p $O/py$k
  PYTHONPATH=$site timeout 100 python3 scripts/gpu_python_checks.py bench --out "$O/py$k" --sizes 4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456 1073741824 > "$O/py$k/pybench.log" 2>&1; echo "py $k rc=$?"
  sed -n '/^| operation | min ratio/,/^$/p' "$O/py$k/bench.md"
done
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for k in range(1,6):
    try:
        r={x['op']:x for x in json.load(open(f'{O}/arrow{k}.json'))['results']}
        a=r['to_host, first call (empty pool)']['gbps']; b=r['to_host, pool off (new Vec)']['gbps']; c=r['copy_to_host (new Vec)']['gbps']
        print(f'arrow {k}: first to_host {a:.2f} pool off {b:.2f} copy_to_host new Vec {c:.2f}: {a/b:.3f}x pool off, {a/c:.3f}x new Vec')
    except Exception as e: print('arrow', k, e)
PY
