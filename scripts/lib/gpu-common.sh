# shellcheck shell=bash
# Shell functions shared by scripts/gpu and scripts/bench-compare.sh (sourced, not run).
# Both cd to the repository root before sourcing this file.

# The cargo settings every GPU build uses: release code without debug information, so
# that the executables are small enough to be copied to the GPU machine. Keep the same
# settings everywhere, or cargo rebuilds everything between two packs.
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_BENCH_DEBUG=0

# artifact CARGO_ARGS... : build with cargo and print the path of the last executable it
# produced ("" if none). Cargo's own messages and errors go to standard error.
artifact() {
  cargo "$@" --message-format=json-render-diagnostics |
    python3 -c '
import json, sys
exe = None
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        exe = m["executable"]
print(exe or "")'
}

# pack_exe DEST WHAT CARGO_ARGS... : build with `artifact`, copy the executable to DEST (a
# file, or a folder to keep cargo's name) and strip the copy; fails, naming WHAT, when
# cargo built nothing.
pack_exe() {
  local dest=$1 what=$2 exe
  shift 2
  exe=$(artifact "$@")
  [ -n "$exe" ] || { echo "$what did not build (cargo $*)" >&2; return 1; }
  [ -d "$dest" ] && dest=$dest/$(basename "$exe")
  cp "$exe" "$dest"
  strip "$dest" 2>/dev/null || true
}

# gpu_line : one line naming the GPU(s) and the driver, or saying why there is none.
gpu_line() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "no GPU found: nvidia-smi is not installed here"
    return 1
  fi
  local q
  q=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1) ||
    { echo "no GPU found: nvidia-smi: $(echo "$q" | head -1)"; return 1; }
  echo "$q" | paste -sd ';' -
}

# host_info : the machine a measurement ran on (GPU, PCIe link, CPUs, memory, Python peers).
host_info() {
  date -u +%Y-%m-%dT%H:%M:%SZ
  git log -1 --format='commit %h %s' 2>/dev/null || true
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
      --format=csv,noheader 2>&1
  else
    echo "nvidia-smi: not installed here"
  fi
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null)"
  echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  echo "numa: $(lscpu 2>/dev/null | grep -E '^NUMA node\(s\)' | tr -s ' ')"
  free -g | head -2
  python3 -c 'import torch, cupy; print("torch", torch.__version__, "cuda", torch.version.cuda, "cupy", cupy.__version__)' 2>&1 | tail -1
}
