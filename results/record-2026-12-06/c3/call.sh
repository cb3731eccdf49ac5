#!/bin/bash
# The bound of the 64 MiB pageable host-to-device copy, in one call with the copy itself
# (binaries of f84709a, packed by `scripts/gpu pack correctness perf python`): the CUDA
# tests, perf's dma section at 16-256 MiB (the pinned DMA beside 8 and 12 threads copying
# pageable to pinned: the staged copy's two halves at once, and each half's rate), then
# perf's copies at 16-256 MiB and the dma section again in turn, three rounds; the switches;
# then, with the time left, the curve in rounds.
set -u
T0=$SECONDS; TOTAL=${TOTAL:-200}
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
run cuda-fast_paths 40 $R .gpu/bin/cuda-fast_paths --test-threads=4
run conformance-cuda 60 $R .gpu/bin/conformance-cuda --test-threads=4
grep -h -E "test result|FAILED|panicked at" $O/*.log | sort | uniq -c
for k in 1 2 3; do
  run dma$k 30 .gpu/bin/perf --only dma --sizes 16M,64M,256M --json "$O/dma$k.json"
  run copies$k 30 .gpu/bin/perf --only copies --sizes 16M,64M,256M --json "$O/copies$k.json"
  grep -E "h2d_(dma_alone|dma_beside_mt(8|12)|memcpy_mt(8|12)|fill_mt8|fill_nt_mt8|dma_after_write) +64 MiB" $O/dma$k.log | cut -c1-100
  grep -E "(h2d|d2h)_(pinned|pageable) +64 MiB" $O/copies$k.log | cut -c1-90
done
run switches 60 .gpu/bin/perf --only switches --json "$O/switches.json"
# With time left: the curve in rounds (perf's copies, then the peers, in turn) and the
# table of the medians of the rounds that finished.
S=4K,16K,64K,256K,1M,4M,16M,64M,256M,1G; done_rounds=()
for k in 1 2 3 4 5; do mkdir -p $O/round$k
  run round$k-perf 45 .gpu/bin/perf --only copies --sizes $S --json "$O/round$k/perf.json"
  run round$k-peers 30 python3 scripts/bench_compare.py --ours "$O/round$k/perf.json" --skip-peer --copies-only --out "$O/round$k"
  [ -s "$O/round$k/compare.json" ] && done_rounds+=($k)
done
if [ ${#done_rounds[@]} -gt 0 ]; then
  run compare 20 python3 scripts/bench_compare.py --compare-only --skip-peer --sizes $S --ours $(for k in "${done_rounds[@]}"; do echo $O/round$k/perf.json; done) --peers $(for k in "${done_rounds[@]}"; do echo $O/round$k/compare.json; done) --out "$O"
  sed -n '/min ratio/,/^$/p' "$O/compare.md"
fi
