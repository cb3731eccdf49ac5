#!/bin/bash
# The first to_host against its control (the pool off after the same untimed pinned free),
# arrow_throughput six times. Binary of 84346ac + the control row.
set -u
O="$OUT/r"; mkdir -p "$O"
trap 'cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/host.txt
export CUDABUF_BACKEND=cuda
for k in 1 2 3 4 5 6; do timeout 30 .gpu/fix/arrow_throughput --bench --json $O/arrow$k.json > $O/arrow$k.log 2>&1; echo "arrow $k rc=$?"; done
python3 - "$O" <<'PY'
import json,sys
O=sys.argv[1]
for k in range(1,7):
    try:
        r={x['op']:x['gbps'] for x in json.load(open(f'{O}/arrow{k}.json'))['results']}
        a=r['to_host, first call (empty pool)']; b=r['to_host, pool off (new Vec)']; c=r['to_host, pool off, after pin+free']
        a2=r['to_host, first call, call alone']; b2=r['to_host, pool off, call alone']
        print(f'{k}: first {a:.2f} | pool off {b:.2f} ({a/b:.3f}x) | control {c:.2f} ({a/c:.3f}x) | alone: first {a2:.2f} pool off {b2:.2f} ({a2/b2:.3f}x)')
    except Exception as e: print(k, e)
PY
