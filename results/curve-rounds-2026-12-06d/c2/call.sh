#!/bin/bash
# Files to the device, warm, binaries of main: the `files` bench (no Arrow files) at 64 MiB,
# 256 MiB and 1 GiB, five repetitions, with the first call of a context beside its bound
# (the path that pins nothing on a new context, each repetition); then arrow_throughput
# three more times (the first to_host against its control). .gpu/extra/files is the bench
# built (at the commit of .gpu/packed) by `cargo bench --workspace --features cuda,cudabuf/arrow --no-run --bench files`.
set -u
O="$OUT/r"; mkdir -p "$O"; T0=$SECONDS
export CUDABUF_BACKEND=cuda RUST_BACKTRACE=1
( cd .gpu && { [ -d bin ] || tar xJf bin.tar.xz; } )
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; cat .gpu/packed; df -h /tmp | tail -1; } > "$O/host.txt" 2>&1
cat "$O/host.txt"
D=/tmp/cudabuf-files; mkdir -p $D
timeout 240 .gpu/extra/files --dir $D --sizes 64M,256M,1G --reps 5 --arrow-sizes "" --json "$O/files.json" > "$O/files.log" 2>&1
echo "files rc=$? in $((SECONDS-T0)) s"; grep '^|' "$O/files.log"
for k in 1 2 3; do timeout 40 .gpu/bin/arrow_throughput --bench --json "$O/arrow$k.json" > "$O/arrow$k.log" 2>&1; echo "arrow$k rc=$?"; done
rm -rf $D; echo "done at $((SECONDS-T0)) s"
cd "$OUT" && tar czf r.tgz r && rm -rf r
