#!/usr/bin/env python3
"""cudabuf against PyTorch and CuPy, in one process run after cudabuf's own benchmark.

Measures, with the same method as cudabuf's `perf` bench (wall clock around each operation
plus a device synchronize, median over repetitions, GB/s with 1 GB = 1e9 bytes,
device-to-device counting bytes read plus written):

- H2D / D2H from pinned and pageable host memory, and D2D, at 1 MiB, 64 MiB, 1 GiB,
  through PyTorch (`Tensor.copy_`) and CuPy (`MemoryPointer.copy_from_host` & co, which
  are `cudaMemcpy`);
- allocation round trips: PyTorch's caching allocator (raw `caching_allocator_alloc` /
  `_delete`, and `torch.empty` + del), CuPy's memory pool (`MemoryPool.malloc` + del),
  and plain `cudaMalloc` + `cudaFree`, at 256 B, 1 MiB, 256 MiB;
- a raw `cuIpcOpenMemHandle` (ctypes on libcuda) in fresh child processes, the reference
  for cudabuf's first IPC open;
- with at least 2 GPUs (`torch.cuda.device_count() >= 2`), peer copies at 64 MiB and
  1 GiB (`--peer-sizes`): `tensor.to('cuda:1')` of a `cuda:0` tensor and back, and
  `copy_` into a preallocated tensor of the other device, counting the bytes once (as
  cudabuf's `peer` section does); with fewer GPUs it prints that they did not run, and
  why, and the JSON says so (`info.peer_not_run`);

then reads cudabuf's figures (`--ours`, the JSON of `perf --json`), prints one table with
ratios (ours / theirs) and the issue's targets met or missed, and writes compare.json and
compare.md (a Markdown table for docs/PERFORMANCE.md) into `--out`.

Usage:
    python3 scripts/bench_compare.py --ours OUT/ours.json --out OUT
    python3 scripts/bench_compare.py --ours OUT/ours.json --out OUT --peer-only   # several GPUs
    python3 scripts/bench_compare.py --ipc-child HEX     # internal: one raw IPC open
"""

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def human(n):
    if n is None:
        return ""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def time_calls(f, warmup, min_reps, max_reps, budget_s):
    """Seconds per call: warmup calls, then min..max timed calls within the budget."""
    for _ in range(warmup):
        f()
    samples = []
    start = time.perf_counter()
    while len(samples) < max_reps and (len(samples) < min_reps or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        f()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples), len(samples)


def time_batched(f, sample_s=0.002, batches=15, budget_s=0.3):
    """Seconds per call of a cheap operation: median over batches of ~sample_s."""
    f()
    t = time.perf_counter()
    f()
    one = max(time.perf_counter() - t, 1e-9)
    batch = max(1, min(200_000, int(sample_s / one)))
    samples = []
    start = time.perf_counter()
    while len(samples) < batches and (len(samples) < 3 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        for _ in range(batch):
            f()
        samples.append((time.perf_counter() - t) / batch)
    return statistics.median(samples), len(samples)


def copy_budget(size):
    if size >= 256 * MIB:
        return dict(warmup=1, min_reps=5, max_reps=15, budget_s=0.6)
    return dict(warmup=2, min_reps=10, max_reps=200, budget_s=0.3)


def gbps(nbytes, secs):
    return nbytes / secs / 1e9


# ------------------------------------------------------------------------------------
# PyTorch


def torch_bench(sizes, results):
    import torch

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

        def op(f):
            def g():
                f()
                sync()
            return g

        ops = {
            "h2d_pinned": (op(lambda: d2.copy_(pinned)), size),
            "d2h_pinned": (op(lambda: pinned.copy_(d1)), size),
            "h2d_pageable": (op(lambda: d2.copy_(pageable)), size),
            "d2h_pageable": (op(lambda: pageable.copy_(d1)), size),
            "d2d": (op(lambda: d2.copy_(d1)), 2 * size),
        }
        for name, (f, nbytes) in ops.items():
            t, n = time_calls(f, **copy_budget(size))
            results["torch"].append(dict(section="copies", op=name, size=size, value=gbps(nbytes, t), unit="GB/s", samples=n))
        del pinned, pageable, d1, d2
        torch.cuda.empty_cache()

    for size in (256, MIB, 256 * MIB):
        log(f"torch alloc {human(size)}")

        def raw():
            p = torch.cuda.caching_allocator_alloc(size, 0)
            torch.cuda.caching_allocator_delete(p)

        def tensor():
            x = torch.empty(size, dtype=torch.uint8, device=dev)
            del x

        for name, f in (("caching_allocator_alloc+delete", raw), ("torch.empty+del", tensor)):
            t, n = time_batched(f)
            results["torch"].append(dict(section="alloc", op=name, size=size, value=t * 1e6, unit="us", samples=n))
    torch.cuda.empty_cache()


def torch_peer_bench(peer_sizes, results):
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

    def sync():
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)

    for size in peer_sizes:
        log(f"torch peer copies at {human(size)}")
        x0 = torch.empty(size, dtype=torch.uint8, device=d0)
        x0.fill_(5)
        x1 = torch.empty(size, dtype=torch.uint8, device=d1)
        x1.fill_(6)
        sync()

        def op(f):
            def g():
                f()
                sync()
            return g

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
            results["torch"].append(dict(section="peer", op=name, size=size, value=gbps(size, t), unit="GB/s", samples=n))
        if not torch.equal(x0.to(d1), x1):
            raise RuntimeError(f"torch peer copies at {human(size)}: the bytes differ")
        del x0, x1
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------
# CuPy


def cupy_bench(sizes, results):
    import cupy
    import cupyx
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

        def op(f):
            def g():
                f()
                sync()
            return g

        ops = {
            "h2d_pinned": (op(lambda: d2.data.copy_from_host(pp, size)), size),
            "d2h_pinned": (op(lambda: d1.data.copy_to_host(pp, size)), size),
            "h2d_pageable": (op(lambda: d2.data.copy_from_host(pg, size)), size),
            "d2h_pageable": (op(lambda: d1.data.copy_to_host(pg, size)), size),
            "d2d": (op(lambda: d2.data.copy_from_device(d1.data, size)), 2 * size),
        }
        for name, (f, nbytes) in ops.items():
            t, n = time_calls(f, **copy_budget(size))
            results["cupy"].append(dict(section="copies", op=name, size=size, value=gbps(nbytes, t), unit="GB/s", samples=n))
        del pinned, pageable, d1, d2
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()

    pool = cupy.get_default_memory_pool()
    for size in (256, MIB, 256 * MIB):
        log(f"cupy alloc {human(size)}")

        def pooled():
            m = pool.malloc(size)
            del m

        def plain():
            p = rt.malloc(size)
            rt.free(p)

        for name, f, budget in (("pool.malloc+del", pooled, 0.3), ("cudaMalloc+cudaFree", plain, 0.8)):
            t, n = time_batched(f, budget_s=budget)
            results["cupy"].append(dict(section="alloc", op=name, size=size, value=t * 1e6, unit="us", samples=n))
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
        results["cupy"].append(dict(section="ipc", op="raw_first_open_ctypes", size=size, value=statistics.median(firsts), unit="us", samples=len(firsts)))
    finally:
        rt.free(ptr)


def ipc_child(hex_handle):
    """A fresh process: driver and primary context ready, then one timed cuIpcOpenMemHandle."""
    cuda = ctypes.CDLL("libcuda.so.1")

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    def check(name, rc):
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


def find(rows, section, op, size):
    for r in rows:
        if r["section"] == section and r["op"] == op and r.get("size") == size and r.get("value") is not None:
            return r["value"]
    return None


def compare_peer(ours_doc, results, peer_sizes):
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
            rows.append(dict(what=f"peer {arrow}: copy_from_device vs torch .to('cuda:N')", size=size, ours=o, torch=t, cupy=None,
                             unit="GB/s", target="", met=None))
            rows.append(dict(what=f"peer {arrow}: copy_from_device vs torch copy_ (preallocated)", size=size, ours=o, torch=c, cupy=None,
                             unit="GB/s", target="", met=None))
            n = find(ours, "peer", op + "_no_peer_access", size)
            rows.append(dict(what=f"peer {arrow}: ours with CUDABUF_PEER_ACCESS=0 vs torch .to", size=size, ours=n, torch=t, cupy=None,
                             unit="GB/s", target="", met=None))
    # One GPU: neither side measured anything; the "did not run" lines say why.
    return rows if any(r["ours"] is not None or r["torch"] is not None for r in rows) else []


def compare(ours_doc, results, sizes):
    ours = ours_doc.get("results", []) if ours_doc else []
    torch_rows, cupy_rows = results["torch"], results["cupy"]
    rows = []  # dicts: what, size, ours, torch, cupy, unit, target, met
    targets = []

    def ratio(a, b):
        return a / b if a is not None and b not in (None, 0) else None

    for op in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "d2d"):
        for size in sizes:
            o, t, c = find(ours, "copies", op, size), find(torch_rows, "copies", op, size), find(cupy_rows, "copies", op, size)
            target, met = "", None
            if op.endswith("pinned") and not op.endswith("pageable") and size >= 64 * MIB:
                target = ">= 0.97x torch"
                met = None if ratio(o, t) is None else ratio(o, t) >= 0.97
            elif op.endswith("pageable") and size >= 64 * MIB:
                pinned = find(ours, "copies", op.replace("pageable", "pinned"), size)
                r = ratio(o, t)
                vs_pinned = ratio(o, pinned)
                target = ">= 3x torch pageable" + (f" (aim 0.8x pinned: {vs_pinned:.2f})" if vs_pinned else "")
                met = None if r is None else r >= 3.0
            elif op == "d2d" and size >= GIB:
                target = ">= 0.95x torch"
                met = None if ratio(o, t) is None else ratio(o, t) >= 0.95
            rows.append(dict(what=op, size=size, ours=o, torch=t, cupy=c, unit="GB/s", target=target, met=met))
            if op.endswith("pageable"):
                u = find(ours, "copies", op + "_unstaged", size)
                if u is not None:
                    rows.append(dict(what=op + " (ours unstaged)", size=size, ours=u, torch=t, cupy=c, unit="GB/s", target="", met=None))
    for size in (256, MIB, 256 * MIB):
        o = find(ours, "alloc", "new_buffer+drop_cached", size)
        t = find(torch_rows, "alloc", "caching_allocator_alloc+delete", size)
        c = find(cupy_rows, "alloc", "pool.malloc+del", size)
        target, met = "", None
        if size >= MIB:
            target = "<= 1 us and <= cupy pool"
            met = None if o is None else (o <= 1.0 and (c is None or o <= c))
        rows.append(dict(what="new_buffer+drop (cached)", size=size, ours=o, torch=t, cupy=c, unit="us", target=target, met=met))
        o = find(ours, "alloc", "new_buffer+drop_uncached", size)
        c = find(cupy_rows, "alloc", "cudaMalloc+cudaFree", size)
        rows.append(dict(what="new_buffer+drop (cache off) vs cudaMalloc+cudaFree", size=size, ours=o, torch=None, cupy=c, unit="us", target="", met=None))
    o = find(ours, "ipc", "repeated_open", 64 * MIB)
    rows.append(dict(what="IPC repeated open", size=64 * MIB, ours=o, torch=None, cupy=None, unit="us", target="<= 2 us", met=None if o is None else o <= 2.0))
    o = find(ours, "ipc", "first_open", 64 * MIB)
    raw_rust = find(ours, "ipc", "raw_first_open", 64 * MIB)
    raw_py = find(cupy_rows, "ipc", "raw_first_open_ctypes", 64 * MIB)
    raw = raw_rust if raw_rust is not None else raw_py
    rows.append(dict(what="IPC first open (fresh child) vs raw cuIpcOpenMemHandle", size=64 * MIB, ours=o, torch=None, cupy=raw, unit="us",
                     target="<= 1.5x raw", met=None if ratio(o, raw) is None else ratio(o, raw) <= 1.5))
    if raw_py is not None and raw_rust is not None:
        rows.append(dict(what="raw cuIpcOpenMemHandle (ctypes child) vs (Rust child)", size=64 * MIB, ours=raw_rust, torch=None, cupy=raw_py, unit="us", target="", met=None))
    for chunk, need in (("256B", 10.0), ("4KiB", 20.0), ("64KiB", 20.0)):
        best, best_op = None, None
        for r in ours:
            if r["section"] == "writer" and r["op"].startswith(f"buffered_{chunk}_staging") and r.get("value") is not None:
                if best is None or r["value"] > best:
                    best, best_op = r["value"], r["op"]
        rows.append(dict(what=f"writer {best_op or 'buffered_' + chunk}", size=128 * MIB, ours=best, torch=None, cupy=None, unit="GB/s",
                         target=f">= {need:g} GB/s", met=None if best is None else best >= need))
    o = find(ours, "from_data", "buffer_from_data_pageable", GIB)
    t = find(torch_rows, "copies", "h2d_pageable", GIB)
    rows.append(dict(what="buffer_from_data (1 GiB pageable) vs torch pageable H2D", size=GIB, ours=o, torch=t, cupy=None, unit="GB/s", target="", met=None))
    return rows


def fmt(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def table(rows):
    head = "| operation | size | cudabuf | PyTorch | CuPy | unit | ours/torch | ours/cupy | target | met |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rt = r["ours"] / r["torch"] if r["ours"] is not None and r["torch"] else None
        rc = r["ours"] / r["cupy"] if r["ours"] is not None and r["cupy"] else None
        met = {True: "yes", False: "**MISSED**", None: ""}[r["met"]]
        lines.append(f"| {r['what']} | {human(r['size'])} | {fmt(r['ours'])} | {fmt(r['torch'])} | {fmt(r['cupy'])} | {r['unit']} | "
                     f"{fmt(rt) if rt else '-'} | {fmt(rc) if rc else '-'} | {r['target']} | {met} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="cudabuf's perf --json output")
    ap.add_argument("--out", default=".", help="where compare.json and compare.md go")
    ap.add_argument("--sizes", default="1M,64M,1G")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-cupy", action="store_true")
    ap.add_argument("--peer-sizes", default="64M,1G", help="sizes of the copies between GPUs 0 and 1")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--peer-only", action="store_true", help="only the copies between GPUs (several-GPU runs)")
    ap.add_argument("--ipc-child")
    args = ap.parse_args()
    if args.ipc_child:
        ipc_child(args.ipc_child)
        return 0
    units = {"K": KIB, "M": MIB, "G": GIB}

    def parse_sizes(text):
        return [int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s) for s in text.split(",")]

    sizes, peer_sizes = parse_sizes(args.sizes), parse_sizes(args.peer_sizes)
    results = {"info": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "python": sys.version.split()[0]}, "torch": [], "cupy": []}
    started = time.perf_counter()
    for name, f, skip, what in (("torch", torch_bench, args.skip_torch or args.peer_only, sizes),
                                ("cupy", cupy_bench, args.skip_cupy or args.peer_only, sizes),
                                ("torch_peer", torch_peer_bench, args.skip_peer or args.skip_torch, peer_sizes)):
        if skip:
            continue
        try:
            f(what, results)
        except Exception as e:  # keep the other library's figures
            log(f"{name} FAILED: {e!r}")
            results["info"][f"{name}_error"] = repr(e)
    ours_doc = None
    if args.ours and os.path.exists(args.ours):
        with open(args.ours) as fh:
            ours_doc = json.load(fh)
        results["info"]["ours"] = ours_doc.get("info", {})
    else:
        log(f"no cudabuf figures at {args.ours!r}: the table has only the peers")
    rows = [] if args.peer_only else compare(ours_doc, results, sizes)
    if not args.skip_peer:
        rows += compare_peer(ours_doc, results, peer_sizes)
    if ours_doc and ours_doc.get("not_run"):
        for section, why in ours_doc["not_run"].items():
            log(f"cudabuf's {section} section did not run: {why}")
    text = table(rows)
    missed = [r for r in rows if r["met"] is False]
    met = [r for r in rows if r["met"] is True]
    info = results["info"]
    header = (f"cudabuf vs PyTorch {info.get('torch', '?')} / CuPy {info.get('cupy', '?')} on {info.get('gpu', '?')}, "
              f"driver {info.get('driver_version', '?')}, {info['date']} (compare took {time.perf_counter() - started:.0f} s)")
    print()
    print(header)
    print(text)
    print(f"\ntargets met: {len(met)}, missed: {len(missed)}")
    not_run = []
    if info.get("peer_not_run"):
        not_run.append(f"PyTorch peer copies did not run: {info['peer_not_run']}")
    for section, why in ((ours_doc or {}).get("not_run") or {}).items():
        not_run.append(f"cudabuf's {section} section did not run: {why}")
    for line in not_run:
        print(line)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare.json"), "w") as fh:
        json.dump({"info": info, "peers": {"torch": results["torch"], "cupy": results["cupy"]}, "rows": rows}, fh, indent=1)
    with open(os.path.join(args.out, "compare.md"), "w") as fh:
        fh.write(header + "\n\n" + text + f"\n\ntargets met: {len(met)}, missed: {len(missed)}\n")
        for line in not_run:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
