#!/usr/bin/env bash
# Streams on the GPU (issue 11): the CUDA backend's stream tests, then the overlap
# benchmark next to PyTorch, in one device call.
#
#   scripts/gpu-streams.sh pack        # here, on the build machine (Rust toolchain, no GPU)
#   scripts/gpu-streams.sh run [DIR]   # on the GPU machine, from the repo root, .gpu/ carried
#
# `pack` builds, with ../shared/tools/gpu-pack (which replaces any earlier .gpu/; in a git
# worktree, the same by hand), the cudabuf-cuda unit tests and
# backend-cuda/tests/streams.rs (release, no debug info), and adds the streams_overlap
# bench executable as .gpu/bin/streams_overlap. .gpu/ is git-ignored: carry it.
# `run` prints the GPU and driver, runs the packed test executables with
# CUDABUF_REQUIRE_CUDA=1 (a case that cannot run fails), then streams_overlap (H2D with
# D2H on two streams at 64 MiB and 256 MiB pinned against the one-way rate, target
# >= 1.7x; a 1 GiB upload in 8 MiB chunks through two pinned staging buffers, pipelined
# on two streams with events and serial on one), then scripts/streams_overlap_torch.py,
# the same patterns through PyTorch's streams, and prints one table with ratios. Each
# part has its own time limit and reports on its own; the rest still runs. About a
# minute on an H200 (the limits add up to under 4 minutes).
# Results in DIR (default $OUT on the lent GPU machine, else target/streams-logs), at most
# 8 files: summary.md, tests.log, streams_ours.json, streams_torch.json,
# streams_compare.json, streams_compare.md, logs.tgz. Exits non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-lib.sh

# pack_in_worktree : what gpu-pack does for these two test executables, for a git
# worktree (where .git is a file, which gpu-pack cannot write its exclude line into).
pack_in_worktree() {
  local exclude exe
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
  rm -rf .gpu && mkdir -p .gpu/bin
  : >.gpu/list
  for target in --lib "--test streams"; do
    # shellcheck disable=SC2086 # two words on purpose
    exe=$(artifact test --release -p cudabuf-cuda $target --no-run)
    [ -n "$exe" ] || { echo "cargo test $target did not build" >&2; exit 1; }
    cp "$exe" .gpu/bin/ && strip ".gpu/bin/$(basename "$exe")"
    basename "$exe" >>.gpu/list
  done
}

pack() {
  set -e
  local tool=../shared/tools/gpu-pack
  if [ -f .git ]; then
    pack_in_worktree
  elif [ -x "$tool" ]; then
    "$tool" test --release -p cudabuf-cuda --lib --test streams "$@"
  else
    echo "gpu-pack not found at $tool" >&2
    exit 2
  fi
  pack_exe .gpu/bin/streams_overlap "the streams_overlap bench" \
    bench -p cudabuf-cuda --bench streams_overlap --no-run
  ls -la .gpu/bin
  du -sh .gpu
}

run() {
  local out=${1:-${OUT:-target/streams-logs}} fail=0 start=$SECONDS logs
  logs=$(mktemp -d /tmp/streams-logs.XXXXXX)
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1
  step() { echo; echo "##### $* ($(( SECONDS - start )) s)"; }

  step "GPU"
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  } 2>&1 | tee "$logs/gpu.txt"

  step "stream tests (CUDABUF_REQUIRE_CUDA=1)"
  if [ ! -s .gpu/list ]; then
    echo "no test executables in .gpu/: run 'scripts/gpu-streams.sh pack' first" | tee "$logs/tests.log"
    fail=1
  else
    local f
    for f in $(cat .gpu/list); do
      echo "=== $f" >>"$logs/tests.log"
      CUDABUF_REQUIRE_CUDA=1 RUST_BACKTRACE=1 timeout 90 .gpu/bin/"$f" --test-threads=4 \
        >>"$logs/tests.log" 2>&1 || { echo "=== FAILED: $f" >>"$logs/tests.log"; fail=1; }
    done
    grep -E '^(===|test result)|FAILED|panicked' "$logs/tests.log"
  fi

  step "cudabuf streams_overlap"
  if [ -x .gpu/bin/streams_overlap ]; then
    CUDABUF_REQUIRE_CUDA=1 timeout 90 .gpu/bin/streams_overlap --json "$logs/streams_ours.json" \
      >"$logs/streams_ours.md" 2>"$logs/streams_ours.log" || { echo "streams_overlap FAILED"; fail=1; }
    cat "$logs/streams_ours.md"
    grep -E 'FAILED|did NOT run' "$logs/streams_ours.log" || true
  else
    echo "no .gpu/bin/streams_overlap: run 'scripts/gpu-streams.sh pack' first"
    fail=1
  fi

  step "PyTorch, same patterns"
  timeout 120 python3 scripts/streams_overlap_torch.py --ours "$logs/streams_ours.json" --out "$logs" \
    >/dev/null 2>"$logs/streams_torch.log" || { echo "the PyTorch side FAILED"; fail=1; }
  tail -3 "$logs/streams_torch.log"
  [ -f "$logs/streams_compare.md" ] && cat "$logs/streams_compare.md"

  step "results"
  {
    echo "# gpu-streams run"
    echo
    sed 's/^/    /' "$logs/gpu.txt"
    echo
    echo "## tests"
    echo
    grep -E '^(===|test result)|FAILED|panicked' "$logs/tests.log" 2>/dev/null | sed 's/^/    /'
    echo
    echo "## overlap"
    echo
    cat "$logs/streams_compare.md" 2>/dev/null || echo "no comparison table (see logs.tgz)"
    echo
    echo "cudabuf's own table:"
    echo
    cat "$logs/streams_ours.md" 2>/dev/null
    echo
    echo "exit: $fail after $(( SECONDS - start )) s"
  } >"$logs/summary.md"
  local name
  for name in summary.md tests.log streams_ours.json streams_torch.json streams_compare.json streams_compare.md; do
    [ -f "$logs/$name" ] && cp "$logs/$name" "$out/$name"
  done
  tar czf "$out/logs.tgz" -C "$logs" .
  ls -la "$out"
  echo "done in $(( SECONDS - start )) s; exit $fail"
  return $fail
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
