#!/usr/bin/env python3
"""The Python package on a GPU, next to PyTorch, CuPy and JAX (run by `scripts/gpu run python`).

Subcommands (each prints one JSON line per check and writes OUT/<name>.json):

- ``interop``: zero-copy round trips, writing through one library and reading through the
  other, both directions: cudabuf <-> PyTorch, cudabuf <-> CuPy, cudabuf <-> JAX (JAX
  arrays are immutable: JAX reads what cudabuf wrote, cudabuf reads what JAX computed),
  and PyTorch <-> CuPy through one cudabuf buffer.
- ``ipc``: device memory shared between processes: a cudabuf process exports, a CuPy
  process opens the raw handle (``cudaIpcOpenMemHandle``), checks and writes back; a CuPy
  process and a PyTorch process export, a cudabuf process opens with ``open_ipc_buffer``
  (pyarrow's 72-byte format built from the raw handle), checks and writes back.
- ``bench``: copy bandwidth (H2D/D2H pinned and pageable, D2D) at each size through the
  cudabuf Python API, PyTorch and CuPy in this one process: median GB/s (1 GB = 1e9
  bytes; D2D counts bytes read plus written) over at least 20 ms of calls (at least 5-50
  calls), the best of three turns per library, ratios,
  and whether cudabuf is within 5% of the faster peer at 64 MiB. cudabuf's D2D is issued
  on the legacy default stream (``Stream.copy_device``) like the peers' copies; its
  synchronous ``copy_from_device`` (pyarrow's semantics) is a row of its own. Writes
  bench.json and bench.md.
- ``merge RUN/bench.json ...``: the same tables from several runs of ``bench`` (on one
  machine), each figure the median of the runs: single runs' ratios at small sizes move
  by several percent between runs. Writes bench.json and bench.md into ``--out``.

Every check is independent: a failure is reported and the rest still run; the exit code
is 1 if any check failed (skips, for a library that is not installed, do not fail).

Usage: python3 scripts/gpu_python_checks.py {interop,ipc,bench} --out DIR [--sizes ...]
       python3 scripts/gpu_python_checks.py merge --out DIR RUN1/bench.json RUN2/bench.json ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Optional

import numpy as np

RESULTS: list[dict[str, Any]] = []


def check(name: str) -> Callable[[Callable[[], Optional[str]]], Callable[[], None]]:
    """Run a check, record ok / failed / skipped (an ImportError skips)."""

    def wrap(fn: Callable[[], Optional[str]]) -> Callable[[], None]:
        def run() -> None:
            start = time.perf_counter()
            try:
                detail = fn()
                status = "ok"
            except ImportError as e:
                status, detail = "skipped", f"not installed: {e}"
            except Exception:
                status, detail = "failed", traceback.format_exc(limit=6)
            result = {"check": name, "status": status, "detail": detail, "seconds": round(time.perf_counter() - start, 3)}
            RESULTS.append(result)
            print(json.dumps(result), flush=True)

        return run

    return wrap


def cuda_ctx() -> Any:
    import cudabuf
    from cudabuf import cuda

    cudabuf.set_backend(os.environ.get("CUDABUF_BACKEND", "cuda") or "cuda")
    return cuda.Context(0)


# ---- interop ---------------------------------------------------------------------


def interop_checks() -> list[Callable[[], None]]:
    @check("torch: cudabuf writes, torch reads (CAI import of a torch tensor)")
    def torch_reads() -> str:
        import torch

        ctx = cuda_ctx()
        t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        view = ctx.buffer_from_object(t)
        assert view.address == t.data_ptr(), (view.address, t.data_ptr())
        pattern = np.arange(1 << 20, dtype=np.uint32).astype(np.uint8)
        view.copy_from_host(pattern)
        assert bool((t.cpu().numpy() == pattern).all())
        return f"{view.size} bytes at {view.address:#x}"

    @check("torch: torch writes, cudabuf reads (DLPack export of a cudabuf buffer)")
    def torch_writes() -> str:
        import torch

        ctx = cuda_ctx()
        buf = ctx.new_buffer(4 << 20)
        t = torch.from_dlpack(buf.view("float32"))
        assert t.data_ptr() == buf.address and t.device.type == "cuda"
        t.copy_(torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
        torch.cuda.synchronize()
        got = np.frombuffer(buf.copy_to_host(), dtype=np.float32)
        assert bool((got == np.arange(1 << 20, dtype=np.float32)).all())
        t2 = torch.as_tensor(buf, device="cuda")  # CAI export
        assert t2.data_ptr() == buf.address
        return "zero-copy both ways (DLPack and __cuda_array_interface__)"

    @check("cupy: cudabuf writes, cupy reads; cupy writes, cudabuf reads")
    def cupy_both() -> str:
        import cupy

        ctx = cuda_ctx()
        a = cupy.zeros(1 << 18, dtype=cupy.int32)
        view = ctx.buffer_from_object(a)
        assert view.address == a.data.ptr
        view.copy_from_host(np.arange(1 << 18, dtype=np.int32))
        assert bool((a.get() == np.arange(1 << 18, dtype=np.int32)).all())
        buf = ctx.new_buffer(8 * 1024)
        b = cupy.asarray(buf.view("float64"))
        assert b.data.ptr == buf.address
        b[...] = cupy.arange(1024, dtype=cupy.float64) * 2
        cupy.cuda.runtime.deviceSynchronize()
        assert np.frombuffer(buf.copy_to_host(), dtype=np.float64).tolist() == [2.0 * i for i in range(1024)]
        c = cupy.from_dlpack(buf.view("float64"))
        assert c.data.ptr == buf.address
        return "zero-copy both ways (CAI and DLPack)"

    @check("jax: cudabuf writes, jax reads; jax computes, cudabuf reads")
    def jax_both() -> str:
        import jax
        import jax.numpy as jnp

        if not any(d.platform == "gpu" for d in jax.devices()):
            raise ImportError("JAX sees no GPU")
        ctx = cuda_ctx()
        buf = ctx.buffer_from_data(np.zeros(1 << 16, dtype=np.float32))
        x = jax.dlpack.from_dlpack(buf.view("float32"))
        zero_copy = x.unsafe_buffer_pointer() == buf.address
        buf.copy_from_host(np.full(1 << 16, 3.5, dtype=np.float32))
        seen = float(np.asarray(x)[0])
        y = (jnp.arange(1 << 16, dtype=jnp.float32) * 2).block_until_ready()
        view = ctx.buffer_from_object(y)
        assert view.address == y.unsafe_buffer_pointer()
        assert np.frombuffer(view.copy_to_host(), dtype=np.float32)[:4].tolist() == [0.0, 2.0, 4.0, 6.0]
        assert zero_copy and seen == 3.5, (zero_copy, seen)
        return "JAX imports cudabuf memory zero-copy and cudabuf views JAX arrays"

    @check("torch <-> cupy through one cudabuf buffer")
    def torch_cupy() -> str:
        import cupy
        import torch

        ctx = cuda_ctx()
        buf = ctx.new_buffer(4096)
        t = torch.from_dlpack(buf.view("int32"))
        c = cupy.asarray(buf.view("int32"))
        t.fill_(7)
        torch.cuda.synchronize()
        assert int(c.sum()) == 7 * 1024
        c[...] = 11
        cupy.cuda.runtime.deviceSynchronize()
        assert int(t.sum().item()) == 11 * 1024
        return "one allocation, three libraries"

    return [torch_reads, torch_writes, cupy_both, jax_both, torch_cupy]


# ---- ipc ---------------------------------------------------------------------------


def child(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout.strip()


CUPY_OPENER = """
import sys, numpy as np, cupy
raw = bytes.fromhex(sys.argv[1]); n = int(sys.argv[2])
ptr = cupy.cuda.runtime.ipcOpenMemHandle(raw)
mem = cupy.cuda.UnownedMemory(ptr, n, None)
arr = cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
print(arr.get().tobytes().hex())
arr[...] = 0x5A
cupy.cuda.runtime.deviceSynchronize()
cupy.cuda.runtime.ipcCloseMemHandle(ptr)
"""

CUDABUF_OPENER = """
import sys, cudabuf
from cudabuf import cuda
cudabuf.set_backend("cuda")
handle = cuda.IpcMemHandle.from_buffer(bytes.fromhex(sys.argv[1]))
buf = cuda.Context(0).open_ipc_buffer(handle)
if len(sys.argv) > 3:
    buf = buf.slice(int(sys.argv[2]), int(sys.argv[3]))
print(buf.to_pybytes().hex())
buf.copy_from_host(b"\\xa5" * buf.size)
buf.context.synchronize()
"""


def ipc_checks() -> list[Callable[[], None]]:
    @check("ipc: cudabuf exports, a CuPy process opens, reads and writes back")
    def cudabuf_to_cupy() -> str:
        import cupy  # noqa: F401  (the child needs it)

        ctx = cuda_ctx()
        data = np.random.default_rng(0).integers(0, 256, size=1 << 20, dtype=np.uint8).tobytes()
        buf = ctx.buffer_from_data(data)
        handle = buf.export_for_ipc()
        raw = handle.to_pyarrow_bytes()[8:72]  # pyarrow's 72 bytes: size, then the CUipcMemHandle
        seen = child(CUPY_OPENER, raw.hex(), str(len(data)))
        assert bytes.fromhex(seen) == data
        assert buf.to_pybytes() == b"\x5a" * len(data)
        return f"{len(data)} bytes there and back"

    @check("ipc: a CuPy process exports, a cudabuf process opens, reads and writes back")
    def cupy_to_cudabuf() -> str:
        import cupy

        n = 1 << 20
        ptr = cupy.cuda.runtime.malloc(n)  # plain cudaMalloc: the handle names exactly it
        try:
            mem = cupy.cuda.UnownedMemory(ptr, n, None)
            arr = cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
            data = np.random.default_rng(1).integers(0, 256, size=n, dtype=np.uint8)
            arr.set(data)
            cupy.cuda.runtime.deviceSynchronize()
            raw = bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr))
            handle = n.to_bytes(8, "little") + raw  # pyarrow's format, which cudabuf reads
            seen = child(CUDABUF_OPENER, handle.hex())
            assert bytes.fromhex(seen) == data.tobytes()
            assert bool((arr.get() == 0xA5).all())
        finally:
            cupy.cuda.runtime.free(ptr)
        return f"{n} bytes there and back"

    @check("ipc: a PyTorch process exports (storage handle + offset), a cudabuf process opens a slice")
    def torch_to_cudabuf() -> str:
        import torch

        t = torch.arange(1 << 18, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        storage = t.untyped_storage()
        shared = storage._share_cuda_()
        # PyTorch 2.x prefixes the 64-byte cudaIpcMemHandle with its own ShareableHandle
        # header (format version, handle kind, ...); the raw CUDA handle comes last.
        # The layout of that header changes between PyTorch versions: find the raw handle
        # in it by comparing with the one the driver gives for the same allocation.
        import cupy

        torch_handle = bytes(shared[1])
        size, offset = int(shared[2]), int(shared[3])
        base = t.data_ptr() - offset
        driver_handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
        at = torch_handle.find(driver_handle)
        assert at >= 0, (
            f"PyTorch's {len(torch_handle)}-byte handle ({torch_handle.hex()}) does not hold "
            f"the cudaIpcMemHandle of its allocation ({driver_handle.hex()})"
        )
        raw = torch_handle[at : at + 64]
        handle = (offset + size).to_bytes(8, "little") + raw
        want = t.cpu().numpy().tobytes()  # before the child writes 0xA5 over it
        seen = bytes.fromhex(child(CUDABUF_OPENER, handle.hex(), str(offset), str(size)))
        if seen != want:
            first = next(i for i in range(min(len(seen), len(want))) if seen[i] != want[i])
            raise AssertionError(
                f"read {len(seen)} bytes, expected {len(want)}; first difference at byte "
                f"{first}: {seen[first:first + 8].hex()} != {want[first:first + 8].hex()}"
            )
        torch.cuda.synchronize()
        assert bool((t.cpu().numpy().view(np.uint8) == 0xA5).all())
        return (
            f"{size} bytes at offset {offset} there and back (the raw handle at byte {at} "
            f"of PyTorch's {len(torch_handle)})"
        )

    return [cudabuf_to_cupy, cupy_to_cudabuf, torch_to_cudabuf]


# ---- bench -------------------------------------------------------------------------


#: Each operation is timed at least `reps_for(size)` times and for at least this long (at
#: most MAX_SAMPLES times), so that copies of ~10 us get hundreds of samples, not 20.
MIN_SECONDS = 0.02
MAX_SAMPLES = 5000


def timed(fn: Callable[[], None], sync: Callable[[], None], reps: int) -> float:
    fn()
    sync()
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < reps or (time.perf_counter() - began < MIN_SECONDS and len(samples) < MAX_SAMPLES):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def reps_for(size: int) -> int:
    return 50 if size <= 1 << 20 else 20 if size <= 64 << 20 else 5


OPS = ["H2D pinned", "D2H pinned", "H2D pageable", "D2H pageable", "D2D"]
# cudabuf only (no peer has it): `CudaBuffer.copy_from_device`, synchronous like pyarrow's.
SYNC_D2D = "D2D, synchronous copy_from_device"
# Each library is measured this many times per size, in turn; each operation keeps its
# best median (the same for every library), so a passing disturbance does not decide a
# ratio.
ROUNDS = 3


def bench_cudabuf(size: int) -> dict[str, float]:
    from cudabuf import cuda

    ctx = cuda_ctx()
    pinned = cuda.new_host_buffer(size)
    np.frombuffer(pinned, dtype=np.uint8)[:] = 1
    pageable = np.ones(size, dtype=np.uint8)
    src, dst = ctx.new_buffer(size), ctx.new_buffer(size)
    stream = ctx.default_stream()
    sync = ctx.synchronize
    r = reps_for(size)
    out = {
        "H2D pinned": timed(lambda: src.copy_from_host(pinned), sync, r),
        "D2H pinned": timed(lambda: src.copy_to_host(buf=pinned), sync, r),
        "H2D pageable": timed(lambda: src.copy_from_host(pageable), sync, r),
        "D2H pageable": timed(lambda: src.copy_to_host(buf=pageable), sync, r),
        # Like the peers' copies: issued on the legacy default stream, one wait (the
        # synchronize) for it.
        "D2D": timed(lambda: stream.copy_device(dst, src), sync, r),
        # pyarrow's semantics: the copy is complete when the call returns.
        SYNC_D2D: timed(lambda: dst.copy_from_device(src), sync, r),
    }
    return out


def bench_torch(size: int) -> dict[str, float]:
    import torch

    pinned = torch.ones(size, dtype=torch.uint8).pin_memory()
    pageable = torch.ones(size, dtype=torch.uint8)
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty(size, dtype=torch.uint8, device="cuda")
    sync = torch.cuda.synchronize
    r = reps_for(size)
    return {
        "H2D pinned": timed(lambda: src.copy_(pinned), sync, r),
        "D2H pinned": timed(lambda: pinned.copy_(src), sync, r),
        "H2D pageable": timed(lambda: src.copy_(pageable), sync, r),
        "D2H pageable": timed(lambda: pageable.copy_(src), sync, r),
        "D2D": timed(lambda: dst.copy_(src), sync, r),
    }


def bench_cupy(size: int) -> dict[str, float]:
    import cupy

    pinned_mem = cupy.cuda.alloc_pinned_memory(size)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=size)
    pinned[:] = 1
    pageable = np.ones(size, dtype=np.uint8)
    src = cupy.empty(size, dtype=cupy.uint8)
    dst = cupy.empty(size, dtype=cupy.uint8)
    sync = cupy.cuda.runtime.deviceSynchronize
    r = reps_for(size)
    return {
        "H2D pinned": timed(lambda: src.data.copy_from_host(pinned.ctypes.data, size), sync, r),
        "D2H pinned": timed(lambda: src.data.copy_to_host(pinned.ctypes.data, size), sync, r),
        "H2D pageable": timed(lambda: src.data.copy_from_host(pageable.ctypes.data, size), sync, r),
        "D2H pageable": timed(lambda: src.data.copy_to_host(pageable.ctypes.data, size), sync, r),
        "D2D": timed(lambda: dst.data.copy_from_device(src.data, size), sync, r),
    }


def gbps(op: str, size: int, seconds: float) -> float:
    moved = 2 * size if op.startswith("D2D") else size
    return moved / seconds / 1e9


def human(size: int) -> str:
    return f"{size >> 30} GiB" if size >= 1 << 30 else f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def run_bench(sizes: list[int], out_dir: str) -> dict[str, Any]:
    table: dict[str, Any] = {"sizes": sizes, "results": {}, "unit": "GB/s (1e9 bytes/s), median", "notes": []}
    for size in sizes:
        row: dict[str, Any] = {}
        for _ in range(ROUNDS):
            for name, fn in (("cudabuf", bench_cudabuf), ("torch", bench_torch), ("cupy", bench_cupy)):
                if name in row and row[name] is None:
                    continue  # not installed, or failed in an earlier turn
                try:
                    seconds = fn(size)
                except Exception as e:
                    row[name] = None
                    why = (f"not run at {human(size)}: {e}" if isinstance(e, ImportError)
                           else f"failed at {human(size)}: {traceback.format_exc(limit=3)}")
                    table["notes"].append(f"{name} {why}")
                    continue
                best = row.setdefault(name, {})
                for op, secs in seconds.items():
                    best[op] = max(best.get(op, 0.0), round(gbps(op, size, secs), 2))
        table["results"][human(size)] = row
        print(json.dumps({"bench": human(size), **row}), flush=True)
    return render(table, out_dir)


def median_of_runs(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """One table from the tables of several runs of ``bench``: each figure (size, library,
    operation) the median of the runs that have it (the sizes in the order first seen), so
    that one run's slow or fast spell decides no ratio; a library that failed or was
    missing in a run is left out of that figure's median, and the runs' notes are kept."""
    if not tables:
        raise ValueError("no runs to merge")
    merged: dict[str, Any] = {
        "sizes": [],
        "results": {},
        "unit": f"GB/s (1e9 bytes/s), median of {len(tables)} runs of the per-run figure",
        "notes": [],
        "runs": len(tables),
    }
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for table in tables:
        for size in table.get("sizes", []):
            if size not in merged["sizes"]:
                merged["sizes"].append(size)
        for label, row in table["results"].items():
            per_lib = values.setdefault(label, {})
            for lib, figures in row.items():
                if figures is None:
                    per_lib.setdefault(lib, {})
                    continue
                for op, v in figures.items():
                    per_lib.setdefault(lib, {}).setdefault(op, []).append(v)
        merged["notes"] += [n for n in table.get("notes", []) if n not in merged["notes"]]
    for label, per_lib in values.items():
        merged["results"][label] = {
            lib: ({op: round(statistics.median(vs), 2) for op, vs in ops.items()} or None)
            for lib, ops in per_lib.items()
        }
    if len(tables) == 1:
        return merged  # one run: its own ratios are the table's
    # Each run's own ratio (cudabuf to the faster peer of the same run), the median over
    # the runs: a run in which every library ran slow or fast alike moves no ratio, and
    # with an odd number of runs one disturbed run leaves the median between two
    # undisturbed runs' ratios. Only where every run has cudabuf's figure and the same
    # peers' (a run without its faster peer would be held to the slower one).
    merged["run_ratios"] = {}
    for label in merged["results"]:
        rows = [table["results"].get(label) or {} for table in tables]
        for op in OPS:
            if any(not (row.get("cudabuf") or {}).get(op) for row in rows):
                continue
            ran = [tuple(bool((row.get(lib) or {}).get(op)) for lib in ("torch", "cupy")) for row in rows]
            if len(set(ran)) != 1 or not any(ran[0]):
                continue
            rs = [ratio_to_faster_peer(row, op) for row in rows]
            merged["run_ratios"].setdefault(label, {})[op] = round(statistics.median(r for r in rs if r), 4)
    return merged


def ratio_to_faster_peer(row: dict[str, Any], op: str) -> Optional[float]:
    """cudabuf's figure for `op` over the faster of PyTorch's and CuPy's in `row`."""
    ours = (row.get("cudabuf") or {}).get(op)
    peers = [p[op] for p in (row.get("torch"), row.get("cupy")) if p and p.get(op)]
    return float(ours) / max(peers) if ours and peers else None


def render(table: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """The tables of ``bench`` (and of ``merge``) from its figures: bench.md and
    bench.json in ``out_dir``, the Markdown printed too."""
    lines = [
        "| size | operation | cudabuf (Python) | PyTorch | CuPy | cudabuf / faster peer |",
        "|---|---|---|---|---|---|",
    ]
    if table.get("runs"):
        lines = [f"Each figure is the median of {table['runs']} runs of `bench`.", ""] + lines
    verdicts: list[dict[str, Any]] = []
    ratios: dict[tuple[str, str], float] = {}
    for label, row in table["results"].items():
        for op in OPS:
            ours = (row.get("cudabuf") or {}).get(op)
            ratio = ratio_to_faster_peer(row, op)
            if ratio is not None:
                ratios[(label, op)] = ratio
            fmt = lambda v: f"{v:.1f}" if v is not None else "n/a"  # noqa: E731
            lines.append(
                f"| {label} | {op} | {fmt(ours)} | {fmt((row.get('torch') or {}).get(op))} | "
                f"{fmt((row.get('cupy') or {}).get(op))} | {f'{ratio:.3f}' if ratio else 'n/a'} |"
            )
            if label == "64 MiB" and ratio is not None:
                verdicts.append({"operation": op, "ratio": round(ratio, 4), "within_5pct": ratio >= 0.95})
        ours_sync = (row.get("cudabuf") or {}).get(SYNC_D2D)
        if ours_sync is not None:
            lines.append(f"| {label} | {SYNC_D2D} (cudabuf only) | {ours_sync:.1f} | - | - | - |")
    table["target_64MiB"] = verdicts
    # The curve: per operation, the smallest ratio to the faster peer over the sizes.
    curve: list[dict[str, Any]] = []
    for op in OPS:
        points = [(r, label) for (label, o), r in ratios.items() if o == op]
        if points:
            worst = min(points)
            entry: dict[str, Any] = {"operation": op, "min_ratio": round(worst[0], 4), "at": worst[1],
                                     "ratios": {label: round(r, 4) for r, label in points}}
            per_run = [(ops[op], label) for label, ops in (table.get("run_ratios") or {}).items() if op in ops]
            if per_run:
                low = min(per_run)
                entry.update(min_run_ratio=low[0], run_ratio_at=low[1])
            curve.append(entry)
    table["curve"] = curve
    lines += ["", "| operation | min ratio to the faster peer | at | >= 0.95 at every size |", "|---|---|---|---|"]
    lines += [f"| {c['operation']} | {c['min_ratio']:.3f} | {c['at']} | {'yes' if c['min_ratio'] >= 0.95 else 'no'} |"
              for c in curve]
    if any("min_run_ratio" in c for c in curve):
        lines += ["", "Each run's ratio to its own faster peer, the median over the runs:", "",
                  "| operation | min median of per-run ratios | at | >= 0.95 at every size |", "|---|---|---|---|"]
        lines += [f"| {c['operation']} | {c['min_run_ratio']:.3f} | {c['run_ratio_at']} | "
                  f"{'yes' if c['min_run_ratio'] >= 0.95 else 'no'} |" for c in curve if "min_run_ratio" in c]
    md = "\n".join(lines) + "\n"
    if verdicts:
        met = sum(v["within_5pct"] for v in verdicts)
        md += f"\nTarget (cudabuf's Python layer within 5% of the faster peer at 64 MiB): {met}/{len(verdicts)} operations.\n"
    for note in table["notes"]:
        md += f"\n- {note.strip()}"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(table, f, indent=1)
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["interop", "ipc", "bench", "merge"])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--sizes", nargs="*", type=int, default=[1 << 20, 64 << 20, 1 << 30])
    parser.add_argument("runs", nargs="*", help="merge: the bench.json of each run")
    args = parser.parse_intermixed_args()
    os.makedirs(args.out, exist_ok=True)
    if args.what == "merge":
        if len(args.runs) < 1:
            parser.error("merge needs the bench.json of at least one run")
        tables = []
        for path in args.runs:
            with open(path) as f:
                tables.append(json.load(f))
        render(median_of_runs(tables), args.out)
        return 0
    if args.runs:
        parser.error(f"{args.what} takes no files")
    if args.what == "bench":
        table = run_bench(args.sizes, args.out)
        return 0 if all(row.get("cudabuf") for row in table["results"].values()) else 1
    checks = interop_checks() if args.what == "interop" else ipc_checks()
    for run in checks:
        run()
    with open(os.path.join(args.out, f"{args.what}.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    failed = [r for r in RESULTS if r["status"] == "failed"]
    counts = {s: sum(r["status"] == s for r in RESULTS) for s in ("ok", "failed", "skipped")}
    print(f"{args.what}: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
