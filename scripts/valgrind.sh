#!/usr/bin/env bash
# The simulator's test suite under valgrind memcheck: every test executable of cudabuf-core,
# cudabuf-sim (the unit tests and the `faults` sweep), cudabuf-conformance (the `sim` suite
# and the unit tests) and the cudabuf facade (unit tests, mock_usage), debug build, each
# run under
#
#   valgrind --tool=memcheck --error-exitcode=99 --leak-check=full
#            --errors-for-leak-kinds=definite --trace-children=yes
#
# Zero errors are expected: any invalid read or write, use of uninitialised memory, bad
# free, or definitely lost block fails the run. Nothing is suppressed (the suppression
# file scripts/valgrind.supp is passed when it exists and says why for each entry).
# --trace-children=yes: the IPC cases re-execute the test binary as a child (an importer,
# an exporter, one that aborts, one that is killed); those children run under memcheck too.
# The IPC child that aborts on purpose and the one killed on purpose end by their signal
# (the case checks that), so their own leak checks do not run; core dumps are switched off.
#
#   scripts/valgrind.sh [FILTER]    # FILTER: only executables whose name contains it
#
# The random cases run with the suite's own defaults; CUDABUF_STRESS_SECS,
# CUDABUF_PROPTEST_CASES and CUDABUF_IPC_FUZZ_CASES change them as usual.
# VALGRIND_LOG_DIR (default target/valgrind) gets one log per process (valgrind's %p).
# Prints a line per executable and a summary; exits non-zero if any executable failed or
# valgrind reported an error.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
filter=${1:-}
logdir=${VALGRIND_LOG_DIR:-$root/target/valgrind}
rm -rf "$logdir" && mkdir -p "$logdir"
ulimit -c 0

export RUST_BACKTRACE=0

supp=()
[ -f scripts/valgrind.supp ] && supp=(--suppressions="$root/scripts/valgrind.supp")

# "<package manifest dir> <target name> <executable>" for every test executable.
packages=(-p cudabuf-core -p cudabuf-sim -p cudabuf-conformance -p cudabuf)
if ! cargo test --no-run "${packages[@]}"; then
  echo "the test executables did not build" >&2
  exit 2
fi
list=$(cargo test --no-run --message-format=json "${packages[@]}" 2>/dev/null |
  python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(os.path.dirname(m["manifest_path"]), m["target"]["name"], m["executable"])
')
if [ -z "$list" ]; then
  echo "no test executables (did the build fail? run: cargo test --no-run -p cudabuf-core -p cudabuf-sim -p cudabuf-conformance -p cudabuf)" >&2
  exit 2
fi

fail=0
total_errors=0
while read -r dir name exe; do
  base=$(basename "$exe")
  case "$base" in *"$filter"*) ;; *) continue ;; esac
  start=$(date +%s)
  (cd "$dir" && valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
      --errors-for-leak-kinds=definite --show-leak-kinds=definite --trace-children=yes \
      --num-callers=40 "${supp[@]}" --log-file="$logdir/$base.%p.log" \
      "$exe" >"$logdir/$base.out" 2>&1)
  status=$?
  secs=$(( $(date +%s) - start ))
  result=$(grep -E '^test result' "$logdir/$base.out" | tail -1)
  # Errors over every process of this executable (children included).
  errors=$(cat "$logdir/$base".*.log | grep -oE 'ERROR SUMMARY: [0-9]+' | awk '{s+=$3} END {print s+0}')
  procs=$(ls "$logdir/$base".*.log | wc -l)
  total_errors=$((total_errors + errors))
  printf '%-40s exit %-3s %3s s  %2s process(es)  memcheck errors %s  %s\n' \
    "$name ($base)" "$status" "$secs" "$procs" "$errors" "$result"
  if [ "$status" -ne 0 ] || [ "$errors" -ne 0 ]; then fail=1; fi
done <<<"$list"

echo "summary: memcheck errors $total_errors over all processes; logs in $logdir"
if [ "$fail" -ne 0 ]; then
  echo "FAILED: see the logs above" >&2
fi
exit $fail
