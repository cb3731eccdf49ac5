#!/bin/bash
# The ring's trace fix (a step's DMA stamped issued before it is published as sent):
# the fast-path tests 25 times, the unit tests once. Binaries of the fix on 9ab85ec.
set -u
O="$OUT/r"; mkdir -p "$O"
trap 'cd "$OUT" && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/host.txt
export CUDABUF_BACKEND=cuda CUDABUF_REQUIRE_CUDA=1 RUST_BACKTRACE=1
timeout 60 .gpu/fix/cuda-unit --test-threads=4 > $O/cuda-unit.log 2>&1; echo "unit rc=$?"; grep "test result" $O/cuda-unit.log
pass=0; fail=0
for i in $(seq 25); do
  if timeout 30 .gpu/fix/cuda-fast_paths --test-threads=4 > $O/fp$i.log 2>&1; then pass=$((pass+1)); rm $O/fp$i.log; else fail=$((fail+1)); fi
done
echo "fast_paths: $pass runs passed, $fail failed"
grep -h -A3 "panicked" $O/fp*.log 2>/dev/null | head -20
