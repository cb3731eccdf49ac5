#!/usr/bin/env bash
# The pip package on a GPU machine that has Python, PyTorch, CuPy, JAX, numpy, pyarrow and
# pytest, but no Rust and no network.
#
#   scripts/gpu-python.sh pack   # here: builds the abi3 wheel into .whl/ (git-ignored)
#   scripts/gpu-python.sh run    # there, from the repo root, with .whl/ carried
#
# `run` installs the wheel with pip (--no-index --no-deps --target /tmp/site), then runs,
# each part with its own time limit, reporting and going on when one fails:
#   1. pytest python/tests with CUDABUF_BACKEND=cuda CUDABUF_REQUIRE_CUDA=1;
#   2. zero-copy round trips with PyTorch, CuPy and JAX (scripts/gpu_python_checks.py interop);
#   3. IPC between a cudabuf process and CuPy / PyTorch processes, both ways (... ipc);
#   4. copy bandwidth through the Python API next to PyTorch and CuPy (... bench).
# Results go to $OUT: pytest.log, junit.xml, interop.json, ipc.json, bench.json, bench.md,
# summary.txt. Exit code: the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/.."

pack() {
  set -e
  rm -rf .whl && mkdir -p .whl
  (cd python && maturin build --release --strip --out ../.whl)
  local wheel
  wheel=$(ls .whl/cudabuf-*.whl)
  # The GPU machine: x86-64, glibc 2.39, CPython 3.12. Check the tags pip will compare.
  python3 - "$wheel" <<'PY'
import re, sys
from packaging.utils import parse_wheel_filename
name, version, build, tags = parse_wheel_filename(sys.argv[1].rsplit("/", 1)[-1])
ok = False
for tag in tags:
    py_ok = tag.interpreter in ("cp39", "cp310", "cp311", "cp312") and tag.abi == "abi3"
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag.platform)
    plat_ok = tag.platform in ("linux_x86_64", "manylinux2014_x86_64") or (
        m is not None and (int(m.group(1)), int(m.group(2))) <= (2, 39))
    print(f"{tag}: python {'ok' if py_ok else 'NO'} for CPython 3.12, platform {'ok' if plat_ok else 'NO'} for x86-64 glibc 2.39")
    ok = ok or (py_ok and plat_ok)
sys.exit(0 if ok else 1)
PY
  du -h "$wheel"
}

run() {
  local out=${OUT:-gpu-out} failed=0 start=$SECONDS
  mkdir -p "$out"
  local summary="$out/summary.txt"
  : > "$summary"
  note() { echo "$*" | tee -a "$summary"; }
  part() { # part NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc
    echo "=== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    [ $rc -ne 0 ] && failed=$((failed + 1))
    note "$name: rc=$rc in $((SECONDS - t0))s"
  }

  rm -rf /tmp/site
  if ! python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/cudabuf-*.whl; then
    note "install: FAILED (pip install --no-index --no-deps --target /tmp/site .whl/cudabuf-*.whl)"
    return 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  # JAX would otherwise take 75% of the GPU's memory in the pytest process.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  python3 -c 'import sys, cudabuf; print("cudabuf", cudabuf.__version__, "from", cudabuf.__file__, "on Python", sys.version.split()[0])' | tee -a "$summary"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$summary"

  # (The log redirection sits inside `sh -c`, so that part's own report is not in it.)
  part "pytest (CUDABUF_BACKEND=cuda CUDABUF_REQUIRE_CUDA=1)" 240 \
    sh -c 'log=$1; shift; exec "$@" > "$log" 2>&1' sh "$out/pytest.log" \
    env CUDABUF_BACKEND=cuda CUDABUF_REQUIRE_CUDA=1 python3 -m pytest python/tests -p no:cacheprovider -rs \
      --junitxml="$out/junit.xml" -o junit_family=xunit2
  tail -n 25 "$out/pytest.log"
  grep -E ' in [0-9.]+s' "$out/pytest.log" | tail -n 1 | sed 's/^/pytest: /' >> "$summary"

  part "interop: PyTorch, CuPy, JAX round trips" 120 \
    env CUDABUF_BACKEND=cuda python3 scripts/gpu_python_checks.py interop --out "$out"
  part "ipc: cudabuf <-> CuPy and PyTorch processes" 120 \
    env CUDABUF_BACKEND=cuda python3 scripts/gpu_python_checks.py ipc --out "$out"
  part "bench: bandwidth, cudabuf's Python API next to PyTorch and CuPy" 180 \
    env CUDABUF_BACKEND=cuda python3 scripts/gpu_python_checks.py bench --out "$out"

  note "total: $((SECONDS - start))s, $failed part(s) failed"
  return $failed
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: $0 pack|run" >&2; exit 2 ;;
esac
