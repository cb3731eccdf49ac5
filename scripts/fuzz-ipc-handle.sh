#!/usr/bin/env bash
# Coverage-guided fuzzing of IPC handle bytes: the cargo-fuzz (libFuzzer, AddressSanitizer,
# debug assertions) target fuzz/fuzz_targets/ipc_handle.rs over IpcMemHandle::from_bytes,
# serde and Context::open_ipc_buffer on the simulator.
#
#   scripts/fuzz-ipc-handle.sh [SECONDS]     # default 600 (10 minutes)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`; installed here if missing) and a nightly
# toolchain (`rustup toolchain install nightly`); without nightly it builds with the stable
# toolchain and RUSTC_BOOTSTRAP=1 (which lets stable take cargo-fuzz's -Z flags).
# One job, at nice 10, in its own PID namespace when `unshare` may make one (so that the
# simulator, opening /proc/<pid>/fd/<fd> for a handle naming another process, can only
# reach the fuzzer's own processes). The corpus (fuzz/corpus/ipc_handle) is kept between
# runs and seeded with the handles the target exports; crashes go to
# fuzz/artifacts/ipc_handle/; the log to fuzz/fuzz-ipc-handle.log. Prints libFuzzer's final
# statistics and one summary line; exits non-zero if the fuzzer found a crash.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-600}
target=ipc_handle
corpus=corpus/$target
artifacts=artifacts/$target
log=fuzz-ipc-handle.log

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
if rustup run nightly rustc --version >/dev/null 2>&1; then
  build=(cargo +nightly fuzz build "$target")
  toolchain="nightly ($(rustup run nightly rustc --version))"
else
  build=(env RUSTC_BOOTSTRAP=1 cargo fuzz build "$target")
  toolchain="stable with RUSTC_BOOTSTRAP=1 ($(rustc --version))"
fi
echo "building with $toolchain: ${build[*]}"
nice -n 10 "${build[@]}"
bin=target/x86_64-unknown-linux-gnu/release/$target

mkdir -p "$corpus" "$artifacts"
# Seeds: mode byte 1 or 2 + the index of a handle the target exports (whole buffer, slice,
# zero size, pyarrow's 72 bytes) and no mask: the valid handles themselves.
for mode in 1 2; do
  for which in 0 1 2 3; do
    printf "\\x0$mode\\x0$which" >"$corpus/seed-$mode-$which"
  done
done
printf '\x00\x00\x00\x00\x00\x00\x00\x00\x00' >"$corpus/seed-zero-size"

ns=()
if unshare --pid --fork --mount-proc true 2>/dev/null; then
  ns=(unshare --pid --fork --mount-proc)
  echo "running in a new PID namespace"
else
  echo "unshare not permitted here: running in this PID namespace"
fi

crashes_before=$(find "$artifacts" -type f | wc -l)
corpus_before=$(find "$corpus" -type f | wc -l)
echo "fuzzing $target for $secs s (corpus: $corpus_before inputs)"
set +e
timeout $((secs + 300)) "${ns[@]}" nice -n 10 "$bin" "$corpus" \
  -dict=ipc_handle.dict -artifact_prefix="$artifacts/" \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  >"$log" 2>&1
status=$?
set -e
grep -E '^(stat::|Done )' "$log" || true
execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
corpus_after=$(find "$corpus" -type f | wc -l)
crashes=$(( $(find "$artifacts" -type f | wc -l) - crashes_before ))
echo "summary: target $target, $secs s, $execs executions, corpus $corpus_before -> $corpus_after inputs, $crashes new crash artifact(s), fuzzer exit status $status"
if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
  echo "FAILED: see $PWD/$log and $PWD/$artifacts/" >&2
  exit 1
fi
