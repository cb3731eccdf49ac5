# Shell functions shared by the GPU scripts (sourced, not run): gpu-conformance.sh,
# gpu-all.sh, gpu-multi.sh, gpu-perf.sh, gpu-alloc.sh, gpu-streams.sh and bench-compare.sh.

# artifact CARGO_ARGS... : build with cargo (release/bench profiles without debug info) and
# print the path of the last executable it produced ("" if none).
artifact() {
  CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_BENCH_DEBUG=0 cargo "$@" --message-format=json 2>/dev/null |
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

# conformance_bin : the name, in .gpu/bin, of the CUDA conformance binary (the arrow crate
# has a `cuda-*` test binary too; the conformance one lists `cuda::slice_aliases_parent`).
conformance_bin() {
  local f
  for f in $(ls .gpu/bin/ | grep -E '^cuda-[0-9a-f]+$'); do
    if .gpu/bin/"$f" --list 2>/dev/null | grep -q '^cuda::slice_aliases_parent'; then
      echo "$f"
      return
    fi
  done
}
