#!/usr/bin/env python3
"""cudabuf against PyTorch and CuPy, in one process run after cudabuf's own benchmark.

Measures, with the same method as cudabuf's `perf` bench (wall clock around each operation
plus a device synchronize, median over repetitions, GB/s with 1 GB = 1e9 bytes,
device-to-device counting bytes read plus written):

- H2D / D2H from pinned and pageable host memory, and D2D, at every size of `--sizes`
  (the bandwidth curves: 4 KiB to 1 GiB by default), through PyTorch (`Tensor.copy_`) and
  CuPy (`MemoryPointer.copy_from_host` & co, which are `cudaMemcpy`);
- allocation round trips: PyTorch's caching allocator (raw `caching_allocator_alloc` /
  `_delete`, and `torch.empty` + del) and CuPy's memory pool (`MemoryPool.malloc` + del)
  at 256 B, 1 MiB, 256 MiB, and both against the number of live allocations (0 to 10,000
  of 64 KiB: the allocation curves);
- plain `cudaMalloc` + `cudaFree`, in a fresh child process that holds nothing else:
  alone, beside one live 64 KiB allocation, beside a block CuPy's pool keeps (what this
  script's earlier versions measured by accident: the pool's block keeps the driver's
  memory for small allocations mapped, so the pair costs a few microseconds instead of
  the ~88 us of a real map and unmap), and against the number of live allocations;
- a raw `cuIpcOpenMemHandle` (ctypes on libcuda) in fresh child processes, the reference
  for cudabuf's first IPC open;
- with at least 2 GPUs (`torch.cuda.device_count() >= 2`), peer copies at 64 MiB and
  1 GiB (`--peer-sizes`): `tensor.to('cuda:1')` of a `cuda:0` tensor and back, and
  `copy_` into a preallocated tensor of the other device, counting the bytes once (as
  cudabuf's `peer` section does); with fewer GPUs it prints that they did not run, and
  why, and the JSON says so (`info.peer_not_run`);

then reads cudabuf's figures (`--ours`, the JSON of `perf --json`; `--arrow`, the JSON of
`arrow_throughput --json`), prints one table with ratios (ours / theirs, ours / the bound
measured in the same run) and the targets of docs/PERFORMANCE.md met or missed, and writes
compare.json and compare.md (a Markdown table for docs/PERFORMANCE.md) into `--out`.
`scripts/plot_perf.py` turns perf.json and compare.json into the curves.

Usage:
    python3 scripts/bench_compare.py --ours OUT/perf.json --arrow OUT/arrow.json --out OUT
    python3 scripts/bench_compare.py --ours OUT/ours.json --out OUT --peer-only   # several GPUs
    python3 scripts/bench_compare.py --compare-only --ours ... --peers OUT/compare.json  # table again
    # rounds: run perf and this script (which measures the peers) in turn N times, then
    python3 scripts/bench_compare.py --compare-only --ours R1/perf.json R2/perf.json R3/perf.json \
        --peers R1/compare.json R2/compare.json R3/compare.json --out OUT   # medians over the rounds
    # (with several --ours, OUT/perf-median.json holds cudabuf's medians, for plot_perf.py)
    python3 scripts/bench_compare.py --ipc-child HEX     # internal: one raw IPC open
    python3 scripts/bench_compare.py --alloc-child       # internal: cudaMalloc alone
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Optional

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
#: The bandwidth curves' sizes: 4 KiB to 1 GiB in steps of 4x.
CURVE_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M,1G"
#: Live-allocation counts of the allocation curves, and the live allocations' size.
LIVE_LEVELS = (0, 1, 10, 100, 1000, 10_000)
LIVE_SIZE = 64 * KIB
#: The sizes of the allocation round trips.
ALLOC_SIZES = (256, MIB, 256 * MIB)

Figure = dict[str, Any]
Results = dict[str, Any]


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def human(n: Optional[int]) -> str:
    if n is None:
        return ""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def parse_sizes(text: str) -> list[int]:
    """`4K,1M,1G,300` -> bytes (binary units)."""
    units = {"K": KIB, "M": MIB, "G": GIB}
    out = []
    for s in text.split(","):
        s = s.strip().upper().removesuffix("IB").removesuffix("B")
        out.append(int(s[:-1]) * units[s[-1]] if s and s[-1] in units else int(s))
    return out


def time_calls(
    f: Callable[[], object], warmup: int, min_reps: int, max_reps: int, budget_s: float, warm_s: float = 0.0
) -> tuple[float, int]:
    """Seconds per call: at least `warmup` calls and `warm_s` seconds of them, then min..max
    timed calls within the budget."""
    warm_start = time.perf_counter()
    warmed = 0
    while warmed < warmup or time.perf_counter() - warm_start < warm_s:
        f()
        warmed += 1
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_reps and (len(samples) < min_reps or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        f()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples), len(samples)


def time_batched(f: Callable[[], object], sample_s: float = 0.002, batches: int = 15, budget_s: float = 0.3) -> tuple[float, int]:
    """Seconds per call of a cheap operation: median over batches of ~sample_s."""
    f()
    t = time.perf_counter()
    f()
    one = max(time.perf_counter() - t, 1e-9)
    batch = max(1, min(200_000, int(sample_s / one)))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < batches and (len(samples) < 3 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        for _ in range(batch):
            f()
        samples.append((time.perf_counter() - t) / batch)
    return statistics.median(samples), len(samples)


def synced_by(sync: Callable[[], object]) -> Callable[[Callable[[], object]], Callable[[], None]]:
    """A wrapper that times a peer library's operation as cudabuf's copies are timed: the call,
    then `sync` (a device synchronize), since cudabuf's copies return when done."""

    def wrap(f: Callable[[], object]) -> Callable[[], None]:
        def call() -> None:
            f()
            sync()

        return call

    return wrap


#: A copy's least warm-up time, as cudabuf's `perf` warms its own (the environment variable
#: and its default are perf's): a small copy's calls last a few milliseconds in all, and the
#: device's clocks left by the figure before it would otherwise decide it.
COPY_WARM_VAR = "CUDABUF_PERF_COPY_WARM_MS"
COPY_WARM_MS = 10.0


def copy_warm_s() -> float:
    try:
        return float(os.environ.get(COPY_WARM_VAR, COPY_WARM_MS)) / 1000.0
    except ValueError:
        return COPY_WARM_MS / 1000.0


def copy_budget(size: int) -> dict[str, Any]:
    if size >= 256 * MIB:
        return dict(warmup=1, min_reps=5, max_reps=15, budget_s=0.6, warm_s=copy_warm_s())
    return dict(warmup=2, min_reps=10, max_reps=200, budget_s=0.3, warm_s=copy_warm_s())


def gbps(nbytes: int, secs: float) -> float:
    return nbytes / secs / 1e9


def figure(section: str, op: str, size: Optional[int], value: float, unit: str, samples: int, x: Optional[int] = None) -> Figure:
    """One measured figure, in the shape of cudabuf's perf JSON results."""
    return dict(section=section, op=op, size=size, x=x, value=value, unit=unit, samples=samples)


# ------------------------------------------------------------------------------------
# PyTorch


def torch_bench(sizes: list[int], results: Results, live_levels: Iterable[int]) -> None:
    import torch  # type: ignore[import-not-found]

    results["info"]["torch"] = torch.__version__
    dev = torch.device("cuda", 0)
    results["info"]["gpu"] = torch.cuda.get_device_name(0)
    sync = torch.cuda.synchronize
    for size in sizes:
        log(f"torch copies at {human(size)}")
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        pinned.fill_(1)
        pageable = torch.empty(size, dtype=torch.uint8)
        pageable.fill_(2)
        d1 = torch.empty(size, dtype=torch.uint8, device=dev)
        d1.fill_(3)
        d2 = torch.empty(size, dtype=torch.uint8, device=dev)
        sync()

        op = synced_by(sync)

        ops = {
            "h2d_pinned": (op(lambda: d2.copy_(pinned)), size),
            "d2h_pinned": (op(lambda: pinned.copy_(d1)), size),
            "h2d_pageable": (op(lambda: d2.copy_(pageable)), size),
            "d2h_pageable": (op(lambda: pageable.copy_(d1)), size),
            "d2d": (op(lambda: d2.copy_(d1)), 2 * size),
        }
        for name, (f, nbytes) in ops.items():
            t, n = time_calls(f, **copy_budget(size))
            results["torch"].append(figure("copies", name, size, gbps(nbytes, t), "GB/s", n))
        del pinned, pageable, d1, d2
        torch.cuda.empty_cache()
    if COPIES_ONLY:
        return

    def raw_alloc(size: int) -> Callable[[], None]:
        def f() -> None:
            p = torch.cuda.caching_allocator_alloc(size, 0)
            torch.cuda.caching_allocator_delete(p)
        return f

    for size in ALLOC_SIZES:
        log(f"torch alloc {human(size)}")

        def tensor(size: int = size) -> None:
            x = torch.empty(size, dtype=torch.uint8, device=dev)
            del x

        for name, f in (("caching_allocator_alloc+delete", raw_alloc(size)), ("torch.empty+del", tensor)):
            t, n = time_batched(f)
            results["torch"].append(figure("alloc", name, size, t * 1e6, "us", n))
    torch.cuda.empty_cache()

    # The caching allocator against the number of live tensors.
    live: list[Any] = []
    for level in live_levels:
        while len(live) < level:
            live.append(torch.empty(LIVE_SIZE, dtype=torch.uint8, device=dev))
        log(f"torch alloc with {level} live tensors")
        for size in (256, MIB):
            t, n = time_batched(raw_alloc(size), batches=11, budget_s=0.2)
            results["torch"].append(figure("alloc_live", "caching_allocator_alloc+delete", size, t * 1e6, "us", n, x=level))
    del live
    torch.cuda.empty_cache()


def torch_peer_bench(peer_sizes: list[int], results: Results) -> None:
    """Copies between cuda:0 and cuda:1 through PyTorch, if there are two GPUs."""
    import torch

    results["info"].setdefault("torch", torch.__version__)
    count = torch.cuda.device_count()
    results["info"]["gpus"] = count
    if count < 2:
        why = f"torch.cuda.device_count() is {count}: peer copies need 2 GPUs"
        print(f"peer copies (tensor.to('cuda:1')) did NOT run: {why}", flush=True)
        results["info"]["peer_not_run"] = why
        return
    results["info"]["gpu"] = torch.cuda.get_device_name(0)
    results["info"]["gpu1"] = torch.cuda.get_device_name(1)
    results["info"]["torch_can_device_access_peer"] = {
        "0->1": torch.cuda.can_device_access_peer(1, 0), "1->0": torch.cuda.can_device_access_peer(0, 1)}
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)

    def sync() -> None:
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)

    for size in peer_sizes:
        log(f"torch peer copies at {human(size)}")
        x0 = torch.empty(size, dtype=torch.uint8, device=d0)
        x0.fill_(5)
        x1 = torch.empty(size, dtype=torch.uint8, device=d1)
        x1.fill_(6)
        sync()

        op = synced_by(sync)

        ops = {
            # .to allocates the result (from the caching allocator once warm), as users write it.
            "d2d_peer_0to1_to": op(lambda: x0.to(d1)),
            "d2d_peer_1to0_to": op(lambda: x1.to(d0)),
            # copy_ into a preallocated tensor: the same operation as cudabuf's copy_from_device.
            "d2d_peer_0to1_copy_": op(lambda: x1.copy_(x0)),
            "d2d_peer_1to0_copy_": op(lambda: x0.copy_(x1)),
        }
        for name, f in ops.items():
            t, n = time_calls(f, **copy_budget(size))
            results["torch"].append(figure("peer", name, size, gbps(size, t), "GB/s", n))
        if not torch.equal(x0.to(d1), x1):
            raise RuntimeError(f"torch peer copies at {human(size)}: the bytes differ")
        del x0, x1
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------
# CuPy


def cupy_bench(sizes: list[int], results: Results, live_levels: Iterable[int]) -> None:
    import cupy  # type: ignore[import-not-found]
    import cupyx  # type: ignore[import-not-found]
    import numpy

    results["info"]["cupy"] = cupy.__version__
    rt = cupy.cuda.runtime
    results["info"]["driver_version"] = rt.driverGetVersion()
    results["info"]["runtime_version"] = rt.runtimeGetVersion()
    sync = cupy.cuda.Device(0).synchronize
    for size in sizes:
        log(f"cupy copies at {human(size)}")
        pinned = cupyx.empty_pinned((size,), dtype=numpy.uint8)
        pinned.fill(1)
        pageable = numpy.empty(size, dtype=numpy.uint8)
        pageable.fill(2)
        d1 = cupy.empty(size, dtype=cupy.uint8)
        d1.fill(3)
        d2 = cupy.empty(size, dtype=cupy.uint8)
        sync()
        # MemoryPointer.copy_*_host take a ctypes.c_void_p (older CuPy: only that).
        pp, pg = ctypes.c_void_p(pinned.ctypes.data), ctypes.c_void_p(pageable.ctypes.data)

        op = synced_by(sync)

        ops = {
            "h2d_pinned": (op(lambda: d2.data.copy_from_host(pp, size)), size),
            "d2h_pinned": (op(lambda: d1.data.copy_to_host(pp, size)), size),
            "h2d_pageable": (op(lambda: d2.data.copy_from_host(pg, size)), size),
            "d2h_pageable": (op(lambda: d1.data.copy_to_host(pg, size)), size),
            "d2d": (op(lambda: d2.data.copy_from_device(d1.data, size)), 2 * size),
        }
        for name, (f, nbytes) in ops.items():
            t, n = time_calls(f, **copy_budget(size))
            results["cupy"].append(figure("copies", name, size, gbps(nbytes, t), "GB/s", n))
        del pinned, pageable, d1, d2
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    if COPIES_ONLY:
        return

    pool = cupy.get_default_memory_pool()

    def pooled(size: int) -> Callable[[], None]:
        def f() -> None:
            m = pool.malloc(size)
            del m
        return f

    for size in ALLOC_SIZES:
        log(f"cupy pool alloc {human(size)}")
        t, n = time_batched(pooled(size))
        results["cupy"].append(figure("alloc", "pool.malloc+del", size, t * 1e6, "us", n))
    pool.free_all_blocks()

    # The pool against the number of live pool allocations.
    live: list[Any] = []
    for level in live_levels:
        while len(live) < level:
            live.append(pool.malloc(LIVE_SIZE))
        log(f"cupy pool alloc with {level} live blocks")
        for size in (256, MIB):
            t, n = time_batched(pooled(size), batches=11, budget_s=0.2)
            results["cupy"].append(figure("alloc_live", "pool.malloc+del", size, t * 1e6, "us", n, x=level))
    del live
    pool.free_all_blocks()

    # Raw IPC open in fresh children, of a cudaMalloc allocation exported here.
    size = 64 * MIB
    ptr = rt.malloc(size)
    try:
        handle = bytes(rt.ipcGetMemHandle(ptr))
        firsts = []
        for i in range(5):
            log(f"raw IPC open, child {i + 1} of 5")
            out = subprocess.run([sys.executable, __file__, "--ipc-child", handle.hex()], capture_output=True, text=True, timeout=60)
            line = next((l for l in out.stdout.splitlines() if l.startswith("IPC_RESULT ")), None)
            if out.returncode != 0 or line is None:
                raise RuntimeError(f"raw IPC child failed: {out.stdout}\n{out.stderr}")
            firsts.append(json.loads(line[len("IPC_RESULT "):])["first_open_us"])
        results["cupy"].append(figure("ipc", "raw_first_open_ctypes", size, statistics.median(firsts), "us", len(firsts)))
    finally:
        rt.free(ptr)


def alloc_child(live_levels: Iterable[int]) -> list[Figure]:
    """In a fresh process (CuPy only, nothing else allocated): `cudaMalloc` + `cudaFree`
    alone, beside one live 64 KiB allocation, beside a block CuPy's pool keeps, and against
    the number of live allocations."""
    import cupy

    rt = cupy.cuda.runtime
    rt.free(rt.malloc(256))  # the context, made before anything is timed
    out: list[Figure] = []

    def pair(size: int) -> Callable[[], None]:
        def f() -> None:
            rt.free(rt.malloc(size))
        return f

    for size in ALLOC_SIZES:
        budget = 0.8 if size >= 256 * MIB else 0.3
        t, n = time_batched(pair(size), budget_s=budget)
        out.append(figure("alloc", "cudaMalloc+cudaFree", size, t * 1e6, "us", n))
        neighbour = rt.malloc(LIVE_SIZE)
        t, n = time_batched(pair(size), budget_s=budget)
        rt.free(neighbour)
        out.append(figure("alloc", "cudaMalloc+cudaFree_neighbour", size, t * 1e6, "us", n))
        pool = cupy.get_default_memory_pool()
        block = pool.malloc(size)
        del block  # back in the pool, which keeps it allocated
        t, n = time_batched(pair(size), budget_s=budget)
        pool.free_all_blocks()
        out.append(figure("alloc", "cudaMalloc+cudaFree_pool_holds_block", size, t * 1e6, "us", n))
    live: list[int] = []
    for level in live_levels:
        while len(live) < level:
            live.append(rt.malloc(LIVE_SIZE))
        for size in (256, MIB):
            t, n = time_batched(pair(size), batches=11, budget_s=0.2)
            out.append(figure("alloc_live", "cudaMalloc+cudaFree", size, t * 1e6, "us", n, x=level))
    for p in live:
        rt.free(p)
    return out


def run_alloc_child(live_levels: Iterable[int], results: Results) -> None:
    levels = ",".join(str(level) for level in live_levels)
    out = subprocess.run([sys.executable, __file__, "--alloc-child", "--live-levels", levels],
                         capture_output=True, text=True, timeout=240)
    line = next((l for l in out.stdout.splitlines() if l.startswith("ALLOC_RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"the cudaMalloc child failed: {out.stdout}\n{out.stderr}")
    results["cupy"].extend(json.loads(line[len("ALLOC_RESULT "):]))


def ipc_child(hex_handle: str) -> None:
    """A fresh process: driver and primary context ready, then one timed cuIpcOpenMemHandle."""
    cuda = ctypes.CDLL("libcuda.so.1")

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    def check(name: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{name} failed: {rc}")

    check("cuInit", cuda.cuInit(0))
    dev = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check("cuCtxPushCurrent", cuda.cuCtxPushCurrent_v2(ctx))
    h = Handle()
    raw = bytes.fromhex(hex_handle)
    assert len(raw) == 64, len(raw)
    ctypes.memmove(ctypes.addressof(h), raw, 64)  # all 64 bytes, NULs included
    open_ = cuda.cuIpcOpenMemHandle_v2
    open_.argtypes = [ctypes.POINTER(ctypes.c_uint64), Handle, ctypes.c_uint]
    ptr = ctypes.c_uint64()
    t = time.perf_counter()
    rc = open_(ctypes.byref(ptr), h, 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    first = (time.perf_counter() - t) * 1e6
    check("cuIpcOpenMemHandle", rc)
    cuda.cuIpcCloseMemHandle(ptr)
    print("IPC_RESULT " + json.dumps({"first_open_us": first}), flush=True)


# ------------------------------------------------------------------------------------
# The comparison


@dataclass
class Row:
    """One line of the comparison table."""

    what: str
    size: Optional[int]
    ours: Optional[float]
    torch: Optional[float]
    cupy: Optional[float]
    unit: str
    target: str = ""
    met: Optional[bool] = None
    #: A bound measured in the same run (the host's memcpy, cudabuf's own baseline).
    bound: Optional[float] = None
    bound_what: str = ""


def median_of_rounds(rounds: list[list[Figure]]) -> list[Figure]:
    """One figure per (section, op, size, x) from several rounds of the same measurements:
    the median of the rounds' values (each already a median over repetitions), so that
    one round's slow or fast process moves no figure on its own; `rounds` and `values`
    keep what went in. With one round the figures come back as they are."""
    if len(rounds) == 1:
        return rounds[0]
    merged: dict[tuple[Any, ...], Figure] = {}
    values: dict[tuple[Any, ...], list[float]] = {}
    for rows in rounds:
        for r in rows:
            key = (r["section"], r["op"], r.get("size"), r.get("x"))
            if key not in merged:
                merged[key] = dict(r, samples=0)
                values[key] = []
            merged[key]["samples"] += r.get("samples") or 0
            if r.get("value") is not None:
                values[key].append(float(r["value"]))
    for key, fig in merged.items():
        vs = values[key]
        fig["value"] = statistics.median(vs) if vs else None
        fig["rounds"] = len(vs)
        fig["values"] = vs
    return list(merged.values())


def merge_ours(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of `perf --json` as one: the median of each figure over the runs, the
    first run's info (with the number of runs), every section any run did not run. Other
    keys (`perf`'s own `summary` of ratios) are left out: they would be one run's."""
    merged: dict[str, Any] = {}
    merged["results"] = median_of_rounds([d.get("results", []) for d in docs])
    merged["info"] = dict(docs[0].get("info", {}), rounds=len(docs))
    not_run: dict[str, Any] = {}
    for d in docs:
        not_run.update(d.get("not_run") or {})
    merged["not_run"] = not_run
    return merged


def find(rows: list[Figure], section: str, op: str, size: Optional[int], x: Optional[int] = None) -> Optional[float]:
    for r in rows:
        if (r["section"] == section and r["op"] == op and r.get("size") == size and r.get("x") == x
                and r.get("value") is not None):
            return float(r["value"])
    return None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b not in (None, 0) else None


def best_host_memcpy(ours: list[Figure], size: int, suffix: str = "") -> Optional[float]:
    """The best `host_memcpy_mt<N><suffix>` figure at `size` (over thread counts)."""
    values = []
    for r in ours:
        op = r["op"]
        if r["section"] != "copies" or r.get("size") != size or r.get("value") is None:
            continue
        if op.startswith("host_memcpy_mt") and op.endswith(suffix):
            threads = op[len("host_memcpy_mt"):len(op) - len(suffix)]
            if threads.isdigit():
                values.append(float(r["value"]))
    return max(values) if values else None


def compare_peer(ours_doc: Optional[dict[str, Any]], results: Results, peer_sizes: list[int]) -> list[Row]:
    """Rows for copies between devices 0 and 1: cudabuf with and without peer access
    against PyTorch's `.to()` (and `copy_`)."""
    ours = ours_doc.get("results", []) if ours_doc else []
    torch_rows = results["torch"]
    rows = []
    for op, arrow in (("d2d_peer_0to1", "0 -> 1"), ("d2d_peer_1to0", "1 -> 0")):
        for size in peer_sizes:
            t = find(torch_rows, "peer", op + "_to", size)
            c = find(torch_rows, "peer", op + "_copy_", size)
            o = find(ours, "peer", op, size)
            rows.append(Row(f"peer {arrow}: copy_from_device vs torch .to('cuda:N')", size, o, t, None, "GB/s"))
            rows.append(Row(f"peer {arrow}: copy_from_device vs torch copy_ (preallocated)", size, o, c, None, "GB/s"))
            n = find(ours, "peer", op + "_no_peer_access", size)
            rows.append(Row(f"peer {arrow}: ours with CUDABUF_PEER_ACCESS=0 vs torch .to", size, n, t, None, "GB/s"))
    # One GPU: neither side measured anything; the "did not run" lines say why.
    return rows if any(r.ours is not None or r.torch is not None for r in rows) else []


def compare_copies(ours: list[Figure], torch_rows: list[Figure], cupy_rows: list[Figure], sizes: list[int]) -> list[Row]:
    """Copies at each size, with their targets (pinned and D2D against PyTorch; pageable
    >= 0.8x pinned, or within 10% of the host's multi-threaded memcpy)."""
    rows = []
    for op in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "d2d"):
        for size in sizes:
            o, t, c = find(ours, "copies", op, size), find(torch_rows, "copies", op, size), find(cupy_rows, "copies", op, size)
            row = Row(op, size, o, t, c, "GB/s")
            if op.endswith("pinned") and size >= 64 * MIB:
                row.target = ">= 0.97x torch"
                r = ratio(o, t)
                row.met = None if r is None else r >= 0.97
            elif op.endswith("pageable") and size >= 64 * MIB:
                pinned = find(ours, "copies", op.replace("pageable", "pinned"), size)
                row.bound, row.bound_what = best_host_memcpy(ours, size), "host memcpy, multi-threaded"
                vs_pinned, vs_bound = ratio(o, pinned), ratio(o, row.bound)
                row.target = ">= 0.8x pinned or >= 0.9x host memcpy" + (
                    f" (pinned: {vs_pinned:.2f}x)" if vs_pinned is not None else "")
                if vs_pinned is not None or vs_bound is not None:
                    row.met = (vs_pinned or 0) >= 0.8 or (vs_bound or 0) >= 0.9
            elif op == "d2d" and size >= GIB:
                row.target = ">= 0.95x torch"
                r = ratio(o, t)
                row.met = None if r is None else r >= 0.95
            rows.append(row)
            if op.endswith("pageable"):
                u = find(ours, "copies", op + "_unstaged", size)
                if u is not None:
                    rows.append(Row(op + " (ours unstaged)", size, u, t, c, "GB/s"))
    for size in sizes:
        o = find(ours, "copies", "d2h_pageable_fresh", size)
        if o is not None and size >= 64 * MIB:
            rows.append(Row("d2h_pageable into a new vector (first touch)", size, o, None, None, "GB/s",
                            bound=best_host_memcpy(ours, size, "_fresh"), bound_what="host memcpy into new memory"))
    return rows


def compare_alloc(ours: list[Figure], torch_rows: list[Figure], cupy_rows: list[Figure]) -> list[Row]:
    """Allocation round trips: cached against the pools, uncached against
    `cudaMalloc` + `cudaFree` in the same state (alone, beside a live allocation)."""
    rows = []
    for size in ALLOC_SIZES:
        o = find(ours, "alloc", "new_buffer+drop_cached", size)
        t = find(torch_rows, "alloc", "caching_allocator_alloc+delete", size)
        c = find(cupy_rows, "alloc", "pool.malloc+del", size)
        row = Row("new_buffer+drop (cached) vs the pools", size, o, t, c, "us")
        if size >= MIB:
            row.target = "<= 1 us and <= cupy pool"
            row.met = None if o is None else (o <= 1.0 and (c is None or o <= c))
        rows.append(row)
        for state, label in (("", "alone"), ("_neighbour", "beside a live 64 KiB allocation")):
            o = find(ours, "alloc", f"new_buffer+drop_uncached{state}", size)
            c = find(cupy_rows, "alloc", f"cudaMalloc+cudaFree{state}", size)
            raw = find(ours, "alloc", f"cuMemAlloc+cuMemFree{state}", size)
            rows.append(Row(f"new_buffer+drop (cache off) vs cudaMalloc+cudaFree, {label}", size, o, None, c, "us",
                            bound=raw, bound_what="cuMemAlloc+cuMemFree (Rust, same state)"))
        held = find(cupy_rows, "alloc", "cudaMalloc+cudaFree_pool_holds_block", size)
        if held is not None:
            rows.append(Row("cudaMalloc+cudaFree beside a block CuPy's pool holds (the old peer column)", size, None, None, held, "us"))
    return rows


def compare_arrow(arrow_doc: Optional[dict[str, Any]]) -> list[Row]:
    """The Arrow targets, from `arrow_throughput --json`: each against its
    baseline measured in the same run."""
    if not arrow_doc:
        return []
    results = arrow_doc.get("results", [])
    by_op = {r["op"]: r for r in results}
    size = arrow_doc.get("info", {}).get("message_bytes")
    rows = []
    for r in results:
        base = by_op.get(r.get("baseline") or "")
        if base is None:
            continue
        row = Row(f"arrow: {r['op']}", size, r.get("gbps"), None, None, "GB/s",
                  bound=base.get("gbps"), bound_what=base["op"])
        target = r.get("target")
        if target is not None:
            row.target = f">= {target}x {base['op']}"
            got = r.get("ratio")
            row.met = None if got is None else got >= target
        rows.append(row)
    return rows


def compare(ours_doc: Optional[dict[str, Any]], results: Results, sizes: list[int],
            arrow_doc: Optional[dict[str, Any]] = None) -> list[Row]:
    ours = ours_doc.get("results", []) if ours_doc else []
    torch_rows, cupy_rows = results["torch"], results["cupy"]
    rows = compare_copies(ours, torch_rows, cupy_rows, sizes)
    rows += compare_alloc(ours, torch_rows, cupy_rows)
    o = find(ours, "ipc", "repeated_open", 64 * MIB)
    rows.append(Row("IPC repeated open", 64 * MIB, o, None, None, "us", "<= 2 us", None if o is None else o <= 2.0))
    o = find(ours, "ipc", "first_open", 64 * MIB)
    raw_rust = find(ours, "ipc", "raw_first_open", 64 * MIB)
    raw_py = find(cupy_rows, "ipc", "raw_first_open_ctypes", 64 * MIB)
    raw = raw_rust if raw_rust is not None else raw_py
    r = ratio(o, raw)
    rows.append(Row("IPC first open (fresh child) vs raw cuIpcOpenMemHandle", 64 * MIB, o, None, raw, "us",
                    "<= 1.5x raw", None if r is None else r <= 1.5))
    if raw_py is not None and raw_rust is not None:
        rows.append(Row("raw cuIpcOpenMemHandle (ctypes child) vs (Rust child)", 64 * MIB, raw_rust, None, raw_py, "us"))
    for chunk, need in (("256B", 10.0), ("4KiB", 20.0), ("64KiB", 20.0)):
        best, best_op = None, None
        for fig in ours:
            if fig["section"] == "writer" and fig["op"].startswith(f"buffered_{chunk}_staging") and fig.get("value") is not None:
                if best is None or fig["value"] > best:
                    best, best_op = fig["value"], fig["op"]
        rows.append(Row(f"writer {best_op or 'buffered_' + chunk}", 128 * MIB, best, None, None, "GB/s",
                        f">= {need:g} GB/s", None if best is None else best >= need))
    o = find(ours, "from_data", "buffer_from_data_pageable", GIB)
    t = find(torch_rows, "copies", "h2d_pageable", GIB)
    rows.append(Row("buffer_from_data (1 GiB pageable) vs torch pageable H2D", GIB, o, t, None, "GB/s"))
    rows += compare_arrow(arrow_doc)
    return rows


def fmt(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def table(rows: list[Row]) -> str:
    head = ("| operation | size | cudabuf | PyTorch | CuPy | bound (same run) | unit | ours/torch | ours/cupy | ours/bound "
            "| target | met |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rt, rc, rb = ratio(r.ours, r.torch), ratio(r.ours, r.cupy), ratio(r.ours, r.bound)
        met = {True: "yes", False: "**MISSED**", None: ""}[r.met]
        bound = f"{fmt(r.bound)} ({r.bound_what})" if r.bound is not None else "-"
        lines.append(f"| {r.what} | {human(r.size)} | {fmt(r.ours)} | {fmt(r.torch)} | {fmt(r.cupy)} | {bound} | {r.unit} | "
                     f"{fmt(rt)} | {fmt(rc)} | {fmt(rb)} | {r.target} | {met} |")
    return "\n".join(lines)


# --copies-only: the peers' copies alone (the curve), not their allocators or the rest.
COPIES_ONLY = False

CURVE_OPS = ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "d2d")
CURVE_TARGET = 0.95


def faster_peer(results: Results, op: str, size: int) -> Optional[float]:
    """The faster of PyTorch's and CuPy's figure for `op` at `size`, if either ran."""
    peers = [v for v in (find(results["torch"], "copies", op, size), find(results["cupy"], "copies", op, size))
             if v is not None]
    return max(peers) if peers else None


def round_ratio(rounds: list[tuple[list[Figure], Results]], op: str, size: int) -> Optional[float]:
    """The median over `rounds` (each cudabuf's figures with the peers' of the same round) of
    each round's own ratio to its faster peer: a round in which every library ran slow or
    fast alike moves no ratio, and with an odd number of rounds, one round disturbed in any
    way leaves the median between two undisturbed rounds' ratios."""
    # Only where every round has cudabuf's figure and the same peers': a left-out round
    # would break the bound above, and a round without its faster peer would be held to
    # the slower one.
    ran = {tuple(find(p[lib], "copies", op, size) is not None for lib in ("torch", "cupy")) for _, p in rounds}
    each = [ratio(find(o, "copies", op, size), faster_peer(p, op, size)) for o, p in rounds]
    if len(ran) != 1 or None in each:
        return None
    return statistics.median(r for r in each if r is not None)


def curve(ours: list[Figure], results: Results, sizes: list[int],
          rounds: Optional[list[tuple[list[Figure], Results]]] = None) -> list[dict[str, Any]]:
    """Per copy path: cudabuf against the faster of PyTorch and CuPy at every size (the same
    run), the smallest ratio and where it falls (target: >= CURVE_TARGET at every size).
    With `rounds` (cudabuf's and the peers' figures of each round, paired), each point also
    has the median of the per-round ratios, and each path the smallest of those."""
    out = []
    for op in CURVE_OPS:
        points: list[tuple[float, int, float, float, Optional[float]]] = []
        for size in sizes:
            o = find(ours, "copies", op, size)
            peer = faster_peer(results, op, size)
            # The plain driver's copy in the same run (CUDA; pinned and D2D): the bound.
            raw = [v for v in (find(ours, "copies", f"{op}_raw_async", size), find(ours, "copies", f"{op}_raw_sync", size))
                   if v is not None]
            if o is not None and peer:
                points.append((o / peer, size, o, peer, max(raw) if raw else None))
        if not points:
            continue
        worst = min(points, key=lambda p: p[0])
        bounded = [p[2] / p[4] for p in points if p[4]]
        path: dict[str, Any] = {
            "op": op, "min_ratio": worst[0], "min_at": worst[1], "met": worst[0] >= CURVE_TARGET,
            "min_ratio_to_raw_driver": min(bounded) if bounded else None,
            "points": [{"size": sz, "ratio": r, "ours": o, "faster_peer": p, "raw_driver": b}
                       for r, sz, o, p, b in points]}
        if rounds and len(rounds) > 1:
            for q in path["points"]:
                q["round_ratio"] = round_ratio(rounds, op, q["size"])
            paired = [(q["round_ratio"], q["size"]) for q in path["points"] if q["round_ratio"] is not None]
            if paired:
                low = min(paired)
                path.update(min_round_ratio=low[0], min_round_at=low[1], met_rounds=low[0] >= CURVE_TARGET)
        out.append(path)
    return out


def curve_table(paths: list[dict[str, Any]]) -> str:
    lines = ["| path | min ratio to the faster peer | at | ratio at each size | >= 0.95 everywhere "
             "| min ratio to the plain driver (same run) |",
             "|---|---|---|---|---|---|"]
    for p in paths:
        each = ", ".join(f"{human(q['size'])} {q['ratio']:.2f}" for q in p["points"])
        raw = p.get("min_ratio_to_raw_driver")
        lines.append(f"| {p['op']} | {p['min_ratio']:.3f} | {human(p['min_at'])} | {each} | "
                     f"{'yes' if p['met'] else '**no**'} | {f'{raw:.3f}' if raw is not None else '-'} |")
    paired = [p for p in paths if p.get("min_round_ratio") is not None]
    if paired:
        lines += ["", "The same rounds, each round's ratio to its own faster peer, the median over the rounds:",
                  "", "| path | min median of per-round ratios | at | at each size | >= 0.95 everywhere |",
                  "|---|---|---|---|---|"]
        for p in paired:
            each = ", ".join(f"{human(q['size'])} {q['round_ratio']:.2f}" for q in p["points"]
                             if q.get("round_ratio") is not None)
            lines.append(f"| {p['op']} | {p['min_round_ratio']:.3f} | {human(p['min_round_at'])} | {each} | "
                         f"{'yes' if p['met_rounds'] else '**no**'} |")
    return "\n".join(lines)


def load(path: Optional[str], what: str) -> Optional[dict[str, Any]]:
    if path and os.path.exists(path):
        with open(path) as fh:
            doc: dict[str, Any] = json.load(fh)
            return doc
    log(f"no {what} at {path!r}")
    return None


def write_outputs(out_dir: str, info: dict[str, Any], results: Results, rows: list[Row], not_run: list[str],
                  elapsed_s: float, paths: Optional[list[dict[str, Any]]] = None) -> str:
    text = table(rows)
    if paths:
        text += ("\n\nThe curve: cudabuf / the faster of PyTorch and CuPy, per path, at every size of the run\n\n"
                 + curve_table(paths))
    missed = [r for r in rows if r.met is False]
    met = [r for r in rows if r.met is True]
    header = (f"cudabuf vs PyTorch {info.get('torch', '?')} / CuPy {info.get('cupy', '?')} on {info.get('gpu', '?')}, "
              f"driver {info.get('driver_version', '?')}, {info.get('date', '?')} (compare took {elapsed_s:.0f} s)")
    rounds = (info.get("ours") or {}).get("rounds", 1), info.get("peer_rounds", 1)
    if max(rounds) > 1:
        header += f"; each figure the median of {rounds[0]} runs of cudabuf's perf and {rounds[1]} of the peers'"
    report = header + "\n\n" + text + f"\n\ntargets met: {len(met)}, missed: {len(missed)}\n" + "".join(
        line + "\n" for line in not_run)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compare.json"), "w") as fh:
        json.dump({"info": info, "peers": {"torch": results["torch"], "cupy": results["cupy"]},
                   "rows": [asdict(r) for r in rows], "curve": paths or []}, fh, indent=1)
    with open(os.path.join(out_dir, "compare.md"), "w") as fh:
        fh.write(report)
    return report


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", nargs="+", help="cudabuf's perf --json output; several runs: the median of each figure")
    ap.add_argument("--arrow", help="cudabuf-arrow's arrow_throughput --json output")
    ap.add_argument("--out", default=".", help="where compare.json and compare.md go")
    ap.add_argument("--sizes", default=CURVE_SIZES)
    ap.add_argument("--live-levels", default=",".join(str(level) for level in LIVE_LEVELS))
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-cupy", action="store_true")
    ap.add_argument("--peer-sizes", default="64M,1G", help="sizes of the copies between GPUs 0 and 1")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--peer-only", action="store_true", help="only the copies between GPUs (several-GPU runs)")
    ap.add_argument("--compare-only", action="store_true",
                    help="measure nothing: the table again from --peers (an earlier compare.json)")
    ap.add_argument("--peers", nargs="+",
                    help="with --compare-only: an earlier compare.json; several: the median of each peer figure")
    ap.add_argument("--copies-only", action="store_true",
                    help="measure only the peers' copies (the curve), not their allocators")
    ap.add_argument("--ipc-child")
    ap.add_argument("--alloc-child", action="store_true")
    args = ap.parse_args(argv)
    live_levels = [int(level) for level in args.live_levels.split(",") if level.strip()]
    if args.ipc_child:
        ipc_child(args.ipc_child)
        return 0
    if args.alloc_child:
        print("ALLOC_RESULT " + json.dumps(alloc_child(live_levels)), flush=True)
        return 0
    global COPIES_ONLY
    COPIES_ONLY = args.copies_only
    sizes, peer_sizes = parse_sizes(args.sizes), parse_sizes(args.peer_sizes)
    started = time.perf_counter()
    results: Results
    earlier: list[dict[str, Any]] = []
    if args.compare_only:
        earlier = [doc for doc in (load(path, "earlier comparison") for path in args.peers or []) if doc]
        info = dict(earlier[0].get("info", {}), peer_rounds=len(earlier)) if earlier else {}
        results = {"info": info, **{lib: median_of_rounds([doc.get("peers", {}).get(lib, []) for doc in earlier] or [[]])
                                    for lib in ("torch", "cupy")}}
    else:
        results = {"info": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "python": sys.version.split()[0], "sizes": sizes, "live_levels": live_levels},
                   "torch": [], "cupy": []}
        steps: list[tuple[str, Callable[[], None], bool]] = [
            ("torch", lambda: torch_bench(sizes, results, live_levels), args.skip_torch or args.peer_only),
            ("cupy", lambda: cupy_bench(sizes, results, live_levels), args.skip_cupy or args.peer_only),
            ("cudaMalloc child", lambda: run_alloc_child(live_levels, results),
             args.skip_cupy or args.peer_only or args.copies_only),
            ("torch_peer", lambda: torch_peer_bench(peer_sizes, results), args.skip_peer or args.skip_torch),
        ]
        for name, step, skip in steps:
            if skip:
                continue
            try:
                step()
            except Exception as e:  # keep the other steps' figures
                log(f"{name} FAILED: {e!r}")
                results["info"][f"{name}_error"] = repr(e)
    ours_docs = [doc for doc in (load(path, "cudabuf figures") for path in args.ours or []) if doc]
    ours_doc = merge_ours(ours_docs) if ours_docs else None
    if ours_doc and len(ours_docs) > 1:
        # The medians as one perf JSON (for scripts/plot_perf.py --ours).
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "perf-median.json"), "w") as fh:
            json.dump(ours_doc, fh, indent=1)
    arrow_doc = load(args.arrow, "Arrow figures") if args.arrow else None
    if ours_doc:
        results["info"]["ours"] = ours_doc.get("info", {})
    rows = [] if args.peer_only else compare(ours_doc, results, sizes, arrow_doc)
    if not args.skip_peer:
        rows += compare_peer(ours_doc, results, peer_sizes)
    not_run = []
    info = results["info"]
    if info.get("peer_not_run"):
        not_run.append(f"PyTorch peer copies did not run: {info['peer_not_run']}")
    for section, why in ((ours_doc or {}).get("not_run") or {}).items():
        not_run.append(f"cudabuf's {section} section did not run: {why}")
    for key, value in info.items():
        if key.endswith("_error"):
            not_run.append(f"{key[:-len('_error')]} failed: {value}")
    # Rounds run in turn (perf's copies, then the peers') pair up in the order given.
    rounds = None
    paired = len(ours_docs) == len(args.ours or []) == len(earlier) == len(args.peers or [])
    if args.compare_only and len(ours_docs) > 1 and paired:
        rounds = [(o.get("results", []), {"torch": p.get("peers", {}).get("torch", []),
                                          "cupy": p.get("peers", {}).get("cupy", [])})
                  for o, p in zip(ours_docs, earlier)]
    elif args.compare_only and len(ours_docs) > 1:
        log("the runs of cudabuf's and the peers' do not pair up (a file missing or the counts differ): "
            "no per-round ratios")
    paths = curve((ours_doc or {}).get("results", []), results, sizes, rounds) if not args.peer_only else []
    report = write_outputs(args.out, info, results, rows, not_run, time.perf_counter() - started, paths)
    print()
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
