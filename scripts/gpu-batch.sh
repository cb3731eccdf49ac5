#!/usr/bin/env bash
# Several GPU scripts' `run` steps in one device call, within the device tool's limits
# (at most 8 files come back): each part writes into its own folder, which is packed into
# $OUT/<part>.tgz, and $OUT/batch-summary.txt says how each part ended and how long it took.
#
#   scripts/gpu-batch.sh PART[:SECONDS] ...
#
# PART is perf, streams, alloc, python, all (scripts/gpu-<part>.sh run DIR) and SECONDS its
# time limit (default 300). Run from the repo root on the GPU machine, with what the parts
# need carried (.gpu/ for perf, streams, alloc and all; .whl/ for python).
#
# Example: scripts/gpu-batch.sh perf:330 streams:150 alloc:60
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/gpu-batch}
mkdir -p "$out"
summary="$out/batch-summary.txt"
: >"$summary"
start=$SECONDS
for spec in "$@"; do
  part=${spec%%:*}
  limit=${spec#*:}
  [ "$limit" = "$spec" ] && limit=300
  dir=/tmp/gpu-batch/$part
  rm -rf "$dir" && mkdir -p "$dir"
  t0=$SECONDS
  echo "##### $part (limit ${limit}s, at $(( SECONDS - start )) s)"
  # The parts read their output folder from OUT (or their first argument).
  OUT=$dir timeout --kill-after=10 "$limit" "scripts/gpu-$part.sh" run "$dir" >"$dir/run.log" 2>&1
  rc=$?
  tail -40 "$dir/run.log"
  echo "$part: exit $rc after $(( SECONDS - t0 )) s" | tee -a "$summary"
  tar czf "$out/$part.tgz" -C /tmp/gpu-batch "$part"
done
echo "total $(( SECONDS - start )) s" | tee -a "$summary"
