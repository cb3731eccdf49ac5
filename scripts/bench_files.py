#!/usr/bin/env python3
"""Files to the device: cudabuf (its Python package) beside KvikIO, PyTorch and NumPy +
CuPy, on the same files, in one process run after cudabuf's own `files` bench.

Paths measured at each size of ``--sizes`` (wall clock around the call plus a device
synchronize, median over ``--reps``, GB/s with 1 GB = 1e9 bytes), with the page cache
warm (the file read once first) and, with ``--cold``, cold (before each repetition the
file's pages are dropped: ``fdatasync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``):

- file -> device: ``cudabuf`` ``Context.read_file`` (allocates) and
  ``CudaBuffer.read_file`` (into a buffer made once); KvikIO ``CuFile.pread`` into a CuPy
  array, with its defaults (``KVIKIO_NTHREADS``, ``KVIKIO_TASK_SIZE``) and again with
  cudabuf's thread count and chunk size; ``torch.from_file(...)
  .cuda()``; ``cupy.asarray(numpy.fromfile(...))``;
- device -> file: ``CudaBuffer.write_file`` and KvikIO ``CuFile.pwrite``;
- Arrow: an IPC file (uncompressed and LZ4) and a Parquet file of the same table (int64
  and float64 columns of ``size`` bytes in all), read by pyarrow and copied with cudabuf
  (``serialize_record_batch`` per batch), and, where the package has them, read straight
  to the device by cudabuf (``read_ipc_file``, ``read_parquet``); beside them, the decode
  bound of the LZ4 and Parquet files: pyarrow's host-only read (``use_threads=True``, no
  device), recorded as ``<file>: pyarrow host read, threads (decode bound, warm)``.

A peer that is not installed is reported as not run, with the reason, in the table and in
the JSON (``not_run``). With ``--ours`` (the JSON of ``cargo bench --bench files``) the
table adds the ratios the targets are stated in: cudabuf / host parallel read (the bound
measured by that run) and cudabuf / KvikIO.

Usage:
    python3 scripts/bench_files.py --dir DIR --sizes 64M,1G [--cold] [--ours files.json]
        [--json out.json] [--md out.md] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

MIB = 1 << 20


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s.rstrip("KMG")) * scale


def bench_file(directory: Path, size: int) -> Path:
    """The files bench's file of ``size`` bytes (made here when it is not there)."""
    path = directory / f"cudabuf-bench-{size}.bin"
    if path.exists() and path.stat().st_size == size:
        return path
    import numpy as np

    with open(path, "wb") as f:
        block = np.arange(8 * MIB, dtype=np.uint64).astype(np.uint8)
        written = 0
        while written < size:
            n = min(len(block), size - written)
            f.write(block[:n].tobytes())
            written += n
        f.flush()
        os.fsync(f.fileno())
    return path


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 * MIB):
            pass


class Bench:
    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.records: list[dict[str, Any]] = []
        self.not_run: dict[str, str] = {}
        self.sync: Callable[[], None] = lambda: None

    def rate(self, nbytes: int, before: Callable[[], None], call: Callable[[], Any]) -> float:
        rates = []
        for _ in range(max(1, self.reps)):
            before()
            t = time.perf_counter()
            keep = call()
            self.sync()
            rates.append(nbytes / (time.perf_counter() - t) / 1e9)
            del keep
        return statistics.median(rates)

    def record(self, path: str, size: int, gbs: float) -> None:
        self.records.append({"path": path, "size": size, "gbs": gbs})
        print(f"| {path} | {size // MIB} MiB | {gbs:.2f} |", flush=True)

    def skip(self, path: str, reason: str) -> None:
        if path not in self.not_run:
            self.not_run[path] = reason
            print(f"| {path} | - | not run: {reason} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--sizes", default="64M,256M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--ours", type=Path, help="the JSON of `cargo bench --bench files`")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--arrow-sizes", default="64M,256M", help="table sizes for the Arrow paths")
    args = ap.parse_args()

    import numpy as np

    from cudabuf import cuda

    ctx = cuda.Context(0)
    b = Bench(args.reps)
    b.sync = ctx.synchronize
    print(f"# files, Python: cudabuf backend {ctx.backend}, dir {args.dir}, {args.reps} reps")
    print("| path | size | GB/s |\n|---|---|---|")

    try:
        import cupy  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001 - any import failure means "not run"
        cupy = None
        cupy_reason = f"cupy: {e}"
    try:
        import kvikio  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001
        kvikio = None
        kvikio_reason = f"kvikio: {e}"
    try:
        import torch  # type: ignore[import-not-found]

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
    except Exception as e:  # noqa: BLE001
        torch = None
        torch_reason = f"torch: {e}"

    for size in [parse_size(s) for s in args.sizes.split(",")]:
        path = bench_file(args.dir, size)
        conditions: list[tuple[str, Callable[[], None]]] = [("warm", lambda: None)]
        if args.cold:
            conditions.append(("cold", lambda p=path: drop_cache(p)))  # type: ignore[misc]
        buf = ctx.new_buffer(size)
        for cond, before in conditions:
            warm(path) if cond == "warm" else None
            b.record(f"cudabuf Context.read_file ({cond})", size, b.rate(size, before, lambda: ctx.read_file(path)))
            b.record(f"cudabuf CudaBuffer.read_file ({cond})", size, b.rate(size, before, lambda: buf.read_file(path)))
            if kvikio is not None and cupy is not None:
                arr = cupy.empty(size, dtype=cupy.uint8)

                def kv_read() -> None:
                    with kvikio.CuFile(path, "r") as f:
                        f.pread(arr).get()

                b.sync = lambda: (ctx.synchronize(), cupy.cuda.runtime.deviceSynchronize())  # type: ignore[assignment]
                b.record(f"KvikIO CuFile.pread ({cond})", size, b.rate(size, before, kv_read))
                # KvikIO with cudabuf's thread count and chunk size, so that the ratio is
                # not a comparison of defaults alone.
                opts = ctx.file_options()
                try:
                    import kvikio.defaults as kvikio_defaults  # type: ignore[import-not-found]

                    with kvikio_defaults.set({"num_threads": opts["threads"], "task_size": opts["chunk_size"]}):
                        rate_same = b.rate(size, before, kv_read)
                    b.record(
                        f"KvikIO CuFile.pread, {opts['threads']} threads, {opts['chunk_size'] >> 20} MiB tasks ({cond})",
                        size,
                        rate_same,
                    )
                except Exception as e:  # noqa: BLE001 - an older KvikIO without defaults.set
                    b.skip("KvikIO CuFile.pread with cudabuf's threads", f"kvikio.defaults.set: {e}")
            else:
                b.skip("KvikIO CuFile.pread", kvikio_reason if kvikio is None else cupy_reason)
            if torch is not None:
                b.sync = torch.cuda.synchronize
                b.record(
                    f"torch.from_file().cuda() ({cond})",
                    size,
                    b.rate(size, before, lambda: torch.from_file(str(path), size=size, dtype=torch.uint8).cuda()),
                )
            else:
                b.skip("torch.from_file().cuda()", torch_reason)
            if cupy is not None:
                b.sync = cupy.cuda.runtime.deviceSynchronize
                b.record(
                    f"cupy.asarray(np.fromfile()) ({cond})",
                    size,
                    b.rate(size, before, lambda: cupy.asarray(np.fromfile(path, dtype=np.uint8))),
                )
            else:
                b.skip("cupy.asarray(np.fromfile())", cupy_reason)
            b.sync = ctx.synchronize
        # Device -> file, over an existing file of the same size (the page cache's rate).
        out = args.dir / f"cudabuf-bench-{size}.pyout"
        with open(out, "wb") as f:
            f.truncate(size)
        b.record("cudabuf CudaBuffer.write_file", size, b.rate(size, lambda: None, lambda: buf.write_file(out)))
        if kvikio is not None and cupy is not None:
            arr = cupy.zeros(size, dtype=cupy.uint8)

            def kv_write() -> None:
                with kvikio.CuFile(out, "r+") as f:
                    f.pwrite(arr).get()

            b.record("KvikIO CuFile.pwrite", size, b.rate(size, lambda: None, kv_write))
        else:
            b.skip("KvikIO CuFile.pwrite", kvikio_reason if kvikio is None else cupy_reason)
        out.unlink()
        del buf

    arrow_paths(b, ctx, args.dir, [parse_size(s) for s in args.arrow_sizes.split(",")])

    summary = compare(b.records, json.loads(args.ours.read_text()) if args.ours else None)
    if summary:
        print("\n" + summary)
    if args.json:
        args.json.write_text(json.dumps({"records": b.records, "not_run": b.not_run}, indent=1))
    if args.md:
        args.md.write_text(summary + "\n")
    return 0


def arrow_paths(b: Bench, ctx: Any, directory: Path, sizes: list[int]) -> None:
    """Arrow IPC (uncompressed, LZ4) and Parquet files of ``size`` bytes of columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    from cudabuf import cuda

    for size in sizes:
        rows = size // 16
        table = pa.table(
            {
                "i": pa.array(np.arange(rows, dtype=np.int64)),
                "x": pa.array(np.linspace(0, 1, rows)),
            }
        )
        files = {
            "IPC file": directory / f"cudabuf-bench-{size}.arrow",
            "IPC file, LZ4": directory / f"cudabuf-bench-{size}.lz4.arrow",
            "Parquet": directory / f"cudabuf-bench-{size}.parquet",
        }
        feather.write_feather(table, files["IPC file"], compression="uncompressed", chunksize=1 << 20)
        feather.write_feather(table, files["IPC file, LZ4"], compression="lz4", chunksize=1 << 20)
        pq.write_table(table, files["Parquet"], row_group_size=1 << 20)

        def host_read(kind: str, path: Path) -> Callable[[], Any]:
            """pyarrow's read into host memory with its thread pool: the decode bound."""

            def run() -> Any:
                if kind == "Parquet":
                    return pq.read_table(path, use_threads=True)
                return feather.read_table(path, use_threads=True)

            return run

        def pyarrow_then_copy(kind: str, path: Path) -> Callable[[], Any]:
            def run() -> Any:
                t = pq.read_table(path) if kind == "Parquet" else feather.read_table(path)
                return [cuda.serialize_record_batch(batch, ctx) for batch in t.to_batches()]

            return run

        for kind, path in files.items():
            warm(path)
            if kind != "IPC file":
                b.record(
                    f"{kind}: pyarrow host read, threads (decode bound, warm)",
                    size,
                    b.rate(size, lambda: None, host_read(kind, path)),
                )
            b.record(f"{kind}: pyarrow read + cudabuf copy (warm)", size, b.rate(size, lambda: None, pyarrow_then_copy(kind, path)))
            reader = getattr(cuda, "read_parquet" if kind == "Parquet" else "read_ipc_file", None)
            if reader is None:
                b.skip(f"{kind}: cudabuf straight to the device", "this cudabuf package has no such function")
            else:
                b.record(
                    f"{kind}: cudabuf straight to the device (warm)",
                    size,
                    b.rate(size, lambda: None, lambda r=reader, p=path: r(p, ctx)),  # type: ignore[misc]
                )
            path.unlink()


def compare(records: list[dict[str, Any]], ours: Optional[dict[str, Any]]) -> str:
    """The target ratios: cudabuf / host parallel read and cudabuf / KvikIO, per size."""
    by = {(r["path"], r["size"]): r["gbs"] for r in records}
    if ours:
        by.update({(r["path"], r["size"]): r["gbs"] for r in ours["records"]})
    lines = ["| size | condition | cudabuf read_file | host parallel read | ratio | KvikIO pread | ratio |", "|---|---|---|---|---|---|---|"]
    for size in sorted({s for (_, s) in by}):
        for cond in ("warm", "cold"):
            ours_gbs = by.get((f"cudabuf CudaBuffer.read_file ({cond})", size)) or by.get((f"cudabuf read_file_at ({cond})", size))
            bound = by.get((f"host pread, parallel, into one buffer ({cond})", size)) or by.get((f"host pread, parallel ({cond})", size))
            kv = by.get((f"KvikIO CuFile.pread ({cond})", size))
            if ours_gbs is None:
                continue
            fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            ratio = lambda a, c: "-" if c is None else f"{a / c:.2f}x"  # noqa: E731
            lines.append(f"| {size // MIB} MiB | {cond} | {ours_gbs:.2f} | {fmt(bound)} | {ratio(ours_gbs, bound)} | {fmt(kv)} | {ratio(ours_gbs, kv)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


if __name__ == "__main__":
    raise SystemExit(main())
