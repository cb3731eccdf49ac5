#!/bin/bash
# arrow_throughput with the alternated pairs (.gpu/extra/arrow_throughput, built at HEAD by
# `cargo bench --workspace --features cuda,cudabuf/arrow --no-run --bench arrow_throughput`)
# six times, perf's issue section three times, then the record of the packed commit (c1's
# call script: the CUDA tests, the curve in three rounds, arrow_throughput, the Python
# bench, the probe, the switches; its `.gpu/extra/perf` step finds no binary).
set -u
mkdir -p "$OUT/a"
export CUDABUF_BACKEND=cuda
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
for k in 1 2 3 4 5 6; do
  timeout 40 .gpu/extra/arrow_throughput --bench --json "$OUT/a/arrow$k.json" > "$OUT/a/arrow$k.log" 2>&1
  echo "arrow$k rc=$?: $(grep 'alternated pairs' "$OUT/a/arrow$k.log")"
done
for k in 1 2 3; do timeout 40 .gpu/bin/perf --only issue --json "$OUT/a/issue$k.json" > "$OUT/a/issue$k.log" 2>&1; echo "issue$k rc=$?"; done
grep -H '^| issue | issue_' $OUT/a/issue*.log
TOTAL=470 bash results/curve-rounds-2026-12-06d/c1/call.sh > /tmp/call.out 2>&1
tail -c 7000 /tmp/call.out
