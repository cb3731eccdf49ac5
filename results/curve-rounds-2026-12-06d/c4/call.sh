#!/bin/bash
# arrow_throughput with the alternated pairs (.gpu/extra/arrow_throughput, built at HEAD by
# `cargo bench --workspace --features cuda,cudabuf/arrow --no-run --bench arrow_throughput`)
# six times, then the record of the packed commit (c1's call script: the CUDA tests, the
# curve in three rounds, arrow_throughput, the Python bench, the probe, the switches).
set -u
mkdir -p "$OUT/a"
export CUDABUF_BACKEND=cuda
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
for k in 1 2 3 4 5 6; do
  timeout 40 .gpu/extra/arrow_throughput --bench --json "$OUT/a/arrow$k.json" > "$OUT/a/arrow$k.log" 2>&1
  echo "arrow$k rc=$?: $(grep 'alternated pairs' "$OUT/a/arrow$k.log")"
done
TOTAL=500 bash results/curve-rounds-2026-12-06d/c1/call.sh > /tmp/call.out 2>&1
tail -c 7000 /tmp/call.out
