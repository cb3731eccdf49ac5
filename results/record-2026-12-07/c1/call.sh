#!/bin/bash
# Two questions in one call (binaries and wheel of f84709a, packed by `scripts/gpu pack
# correctness perf python`; the library code of 02ec37f):
# 1. The bound of the 64 MiB pageable host-to-device copy beside the copy itself: perf's
#    dma section at 16-256 MiB (the pinned DMA beside 8 and 12 threads copying pageable to
#    pinned: the staged copy's two halves at once, and each half's rate), then perf's
#    copies at the same sizes, in turn, three rounds.
# 2. Whether staging below 512 KiB would lift the pageable copies at 64-256 KiB (the
#    driver's own copy there; device to host at 256 KiB is the curve's weakest point):
#    perf's copies at 64 KiB-1 MiB with the defaults, with CUDABUF_STAGING_MIN=64K and
#    adaptivity off (every such copy staged), and with CUDABUF_STAGING_MIN=64K and
#    adaptivity on, in turn, three rounds.
# Then the CUDA tests that cover staging, the switches and, with the time left, the curve
# in rounds.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-300}
O="$OUT/r"; mkdir -p "$O"
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1
left() { echo $(( TOTAL - (SECONDS - T0) )); }
lim() { local l; l=$(( $(left) - 10 )); [ "$1" -lt "$l" ] && l=$1; echo $l; }
finish() { echo "done at $((SECONDS-T0)) s" | tee -a $O/call.log; cp /tmp/call.out $O/ 2>/dev/null; cd "$OUT" && tar czf r.tgz r && rm -rf r; }
trap finish EXIT
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; lscpu | grep -E "Model name|L3"; cat .gpu/packed 2>/dev/null; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
run() { local name=$1 want=$2; shift 2; local l; l=$(lim "$want")
  if [ "$l" -lt 10 ]; then echo "SKIPPED $name: no time left" | tee -a $O/call.log; return; fi
  local t=$SECONDS; timeout "$l" "$@" > "$O/$name.log" 2>&1; local rc=$?
  echo "== $name rc=$rc in $((SECONDS-t)) s (limit $l)" | tee -a $O/call.log; }
R="env CUDABUF_REQUIRE_CUDA=1"
for k in 1 2 3; do
  run dma$k 30 .gpu/bin/perf --only dma --sizes 16M,64M,256M --json "$O/dma$k.json"
  run copies$k 30 .gpu/bin/perf --only copies --sizes 16M,64M,256M --json "$O/copies$k.json"
  grep -E "h2d_(dma_alone|dma_beside_mt(8|12)|memcpy_mt(8|12)|fill_mt8|fill_nt_mt8|dma_after_write) +64 MiB" $O/dma$k.log | cut -c1-100
  grep -E "(h2d|d2h)_(pinned|pageable) +64 MiB" $O/copies$k.log | cut -c1-90
done
SM=64K,128K,256K,512K,1M
for k in 1 2 3; do
  run small$k-default 20 .gpu/bin/perf --only copies --sizes $SM --json "$O/small$k-default.json"
  run small$k-staged 20 env CUDABUF_STAGING_MIN=64K CUDABUF_STAGING_ADAPTIVE=0 .gpu/bin/perf --only copies --sizes $SM --json "$O/small$k-staged.json"
  run small$k-adaptive 20 env CUDABUF_STAGING_MIN=64K .gpu/bin/perf --only copies --sizes $SM --json "$O/small$k-adaptive.json"
done
python3 - "$O" <<'PY'
import json, sys, statistics
O = sys.argv[1]
for op in ("h2d_pageable", "d2h_pageable"):
    for size in (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20):
        row = []
        for v in ("default", "staged", "adaptive"):
            vals = []
            for k in (1, 2, 3):
                try:
                    rs = json.load(open(f"{O}/small{k}-{v}.json"))["results"]
                    vals += [r["value"] for r in rs if r["section"] == "copies" and r["op"] == op and r.get("size") == size]
                except Exception:
                    pass
            row.append(f"{v} " + "/".join(f"{x:.2f}" for x in vals))
        print(op, size >> 10, "KiB:", "; ".join(row))
PY
run cuda-fast_paths 40 $R .gpu/bin/cuda-fast_paths --test-threads=4
run conformance-cuda 60 $R .gpu/bin/conformance-cuda --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/cuda-fast_paths.log $O/conformance-cuda.log | sort | uniq -c
run switches 60 .gpu/bin/perf --only switches --json "$O/switches.json"
# With time left: the curve in rounds (perf's copies, then the peers, in turn) and the
# tables of the rounds that finished.
S=4K,16K,64K,256K,1M,4M,16M,64M,256M,1G; done_rounds=()
for k in 1 2 3 4 5; do mkdir -p $O/round$k
  run round$k-perf 45 .gpu/bin/perf --only copies --sizes $S --json "$O/round$k/perf.json"
  run round$k-peers 30 python3 scripts/bench_compare.py --ours "$O/round$k/perf.json" --skip-peer --copies-only --out "$O/round$k"
  [ -s "$O/round$k/compare.json" ] && [ -s "$O/round$k/perf.json" ] && done_rounds+=($k)
done
if [ ${#done_rounds[@]} -gt 0 ]; then
  run compare 20 python3 scripts/bench_compare.py --compare-only --skip-peer --sizes $S --ours $(for k in "${done_rounds[@]}"; do echo $O/round$k/perf.json; done) --peers $(for k in "${done_rounds[@]}"; do echo $O/round$k/compare.json; done) --out "$O"
  sed -n '/min ratio/,/^$/p;/min median/,/^$/p' "$O/compare.md"
fi
